//! Certificates made with the `openssl` command line (an implementation
//! independent of the rustls under test): a test CA with a server
//! certificate it signed, other CAs that signed nothing, and self-signed
//! server certificates.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::TempDir;
use crate::peers::{Peer, expect};

/// The key of a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// ECDSA on P-256.
    Ec,
    /// RSA, 2048 bits.
    Rsa,
}

impl Key {
    fn newkey(self) -> &'static [&'static str] {
        match self {
            Self::Ec => &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"],
            Self::Rsa => &["-newkey", "rsa:2048"],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Ec => "ec",
            Self::Rsa => "rsa",
        }
    }
}

/// A test CA (`ca.pem`) and a server certificate it signed for
/// `localhost` and 127.0.0.1 (`server.pem`, `server.key`, ECDSA P-256),
/// in a directory removed on drop.
#[derive(Debug)]
pub struct Certs {
    dir: TempDir,
    ca: String,
    cert: String,
    key: String,
    cert_and_key: String,
}

impl Certs {
    pub fn generate(name: &str) -> Self {
        expect(Peer::Openssl);
        let dir = TempDir::new(&format!("certs-{name}"));
        let c = Self {
            ca: dir.arg("ca.pem"),
            cert: dir.arg("server.pem"),
            key: dir.arg("server.key"),
            cert_and_key: dir.arg("server-and-key.pem"),
            dir,
        };
        c.new_ca("ca");
        std::fs::write(
            c.dir.file("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        )
        .expect("write server.ext");
        let mut req = vec!["req", "-new"];
        req.extend_from_slice(Key::Ec.newkey());
        req.extend_from_slice(&[
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        openssl(c.dir.path(), &req);
        openssl(
            c.dir.path(),
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                "server.pem",
                "-extfile",
                "server.ext",
            ],
        );
        let read =
            |f: &str| std::fs::read_to_string(c.dir.file(f)).expect("read what openssl wrote");
        std::fs::write(&c.cert_and_key, read("server.pem") + &read("server.key"))
            .expect("write the certificate and key together");
        c
    }

    /// Another self-signed CA, `<name>.pem`, that signed nothing served here.
    pub fn new_ca(&self, name: &str) -> String {
        let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
        let mut req = vec!["req", "-x509"];
        req.extend_from_slice(Key::Ec.newkey());
        let subject = format!("/CN=throng test {name}");
        req.extend_from_slice(&[
            "-nodes", "-days", "2", "-subj", &subject, "-keyout", &key, "-out", &pem,
        ]);
        openssl(self.dir.path(), &req);
        self.dir.arg(&pem)
    }

    /// The CA certificate (PEM) that signed the server's.
    pub fn ca(&self) -> &str {
        &self.ca
    }

    /// The server's certificate (PEM).
    pub fn cert(&self) -> &str {
        &self.cert
    }

    /// The server's private key (PEM).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The certificate followed by its key in one file, as HAProxy takes them.
    pub fn cert_and_key(&self) -> &str {
        &self.cert_and_key
    }
}

/// A self-signed end-entity certificate for `localhost` and 127.0.0.1 in
/// `dir`; returns the certificate's and the key's paths.
pub fn self_signed(dir: &Path, key: Key) -> (PathBuf, PathBuf) {
    expect(Peer::Openssl);
    let cert_file = format!("{}-cert.pem", key.name());
    let key_file = format!("{}-key.pem", key.name());
    let mut args = vec![
        "req",
        "-x509",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=localhost",
    ];
    args.extend_from_slice(key.newkey());
    args.extend_from_slice(&[
        "-addext",
        "subjectAltName=DNS:localhost,IP:127.0.0.1",
        // An end-entity certificate: openssl's default is a CA, which webpki refuses.
        "-addext",
        "basicConstraints=critical,CA:FALSE",
        "-keyout",
        &key_file,
        "-out",
        &cert_file,
    ]);
    openssl(dir, &args);
    (dir.join(cert_file), dir.join(key_file))
}

/// Runs `openssl <args>` in `dir`; fails the test with its output if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
