#!/usr/bin/env python3
"""Keys and tokens for throng serve's auth tests, from an independent JWT
implementation (PyJWT with `cryptography`).

usage:
  python3 jwt_mint.py keys DIR     writes to DIR: hs256.key (an HS256 secret),
                                   rsa.pem/rsa.pub.pem (RSA 2048), ec.pem/ec.pub.pem
                                   (P-256), ed.pem/ed.pub.pem (Ed25519)
  python3 jwt_mint.py tokens DIR SPECS
                                   SPECS is a JSON list of token specs; prints a JSON
                                   list of tokens, one per spec

  python3 jwt_mint.py jwks DIR KID=NAME...
                                   prints a JSON Web Key Set of DIR's public keys NAME
                                   (rsa, ec, ed), each labelled with its KID (PyJWT's
                                   to_jwk: a JWK implementation independent of throng's)

A spec is {"alg": ..., "claims": {...}, "kid": optional}. In claims, "exp_in"
and "nbf_in" are seconds from now, turned into "exp" and "nbf". alg is one of
HS256, RS256, ES256, EdDSA (signed with DIR's keys), or the attacks:
  "none"            an unsigned token (alg none, empty signature)
  "HS256-rsa-pub"   HS256 whose secret is the bytes of DIR/rsa.pub.pem (the
                    HS/RS confusion), made with the standard library's hmac,
                    since PyJWT refuses to use a PEM key as an HMAC secret
  "HS256-wrong"     HS256 signed with a secret that is not DIR's
"""

import base64
import hashlib
import hmac
import json
import os
import sys
import time

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa


def write_pair(directory, name, private_key):
    pem = private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    pub = private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with open(os.path.join(directory, name + ".pem"), "wb") as f:
        f.write(pem)
    with open(os.path.join(directory, name + ".pub.pem"), "wb") as f:
        f.write(pub)


def keys(directory):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "hs256.key"), "w") as f:
        f.write(base64.b64encode(os.urandom(48)).decode() + "\n")
    write_pair(directory, "rsa", rsa.generate_private_key(public_exponent=65537, key_size=2048))
    write_pair(directory, "ec", ec.generate_private_key(ec.SECP256R1()))
    write_pair(directory, "ed", ed25519.Ed25519PrivateKey.generate())


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_made(header, claims, secret):
    """A JWT put together by hand: HMAC-SHA256 with `secret`, or unsigned."""
    signing = (
        b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())
    )
    if secret is None:
        return signing + "."
    mac = hmac.new(secret, signing.encode(), hashlib.sha256).digest()
    return signing + "." + b64url(mac)


def read(directory, name):
    with open(os.path.join(directory, name), "rb") as f:
        return f.read()


def token(directory, spec):
    claims = dict(spec.get("claims", {}))
    now = int(time.time())
    for rel, field in (("exp_in", "exp"), ("nbf_in", "nbf")):
        if rel in claims:
            claims[field] = now + claims.pop(rel)
    alg = spec["alg"]
    headers = {"kid": spec["kid"]} if "kid" in spec else None
    if alg == "none":
        return hand_made({"alg": "none", "typ": "JWT"}, claims, None)
    if alg == "HS256-rsa-pub":
        header = {"alg": "HS256", "typ": "JWT", **(headers or {})}
        return hand_made(header, claims, read(directory, "rsa.pub.pem"))
    if alg == "HS256-wrong":
        return jwt.encode(claims, b"not the server's secret, 32 bytes", algorithm="HS256", headers=headers)
    if alg == "HS256":
        key = read(directory, "hs256.key").rstrip(b"\n")
    else:
        name = {"RS256": "rsa", "ES256": "ec", "EdDSA": "ed"}[alg]
        key = read(directory, name + ".pem")
    return jwt.encode(claims, key, algorithm=alg, headers=headers)


def jwks(directory, labels):
    """A key set of the public halves of DIR's keys, one per KID=NAME."""
    from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

    kinds = {"rsa": RSAAlgorithm, "ec": ECAlgorithm, "ed": OKPAlgorithm}
    keys = []
    for label in labels:
        kid, name = label.split("=", 1)
        public = serialization.load_pem_public_key(read(directory, name + ".pub.pem"))
        jwk = kinds[name].to_jwk(public, as_dict=True)
        jwk.update({"kid": kid, "use": "sig"})
        keys.append(jwk)
    return {"keys": keys}


def main():
    what, directory = sys.argv[1], sys.argv[2]
    if what == "keys":
        keys(directory)
    elif what == "tokens":
        specs = json.loads(sys.argv[3])
        print(json.dumps([token(directory, s) for s in specs]))
    elif what == "jwks":
        print(json.dumps(jwks(directory, sys.argv[3:])))
    else:
        sys.exit("usage: jwt_mint.py keys DIR | tokens DIR SPECS | jwks DIR KID=NAME...")


if __name__ == "__main__":
    main()
