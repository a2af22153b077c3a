//! Keys and tokens made by an independent JWT implementation (Python
//! `PyJWT` with `cryptography`, `tests/peers/jwt_mint.py`), for the server's
//! auth tests: the server must accept what another library signs, and
//! refuse the attacks it builds by hand.

use std::time::Duration;

use serde_json::Value;

use crate::TempDir;
use crate::peers::{Peer, dir, expect};
use crate::process::{command, output_within, text};

/// A directory of keys (`hs256.key`, `rsa.pub.pem`, `ec.pub.pem`,
/// `ed.pub.pem` and their private halves), made once, and tokens signed
/// with them.
#[derive(Debug)]
pub struct Mint {
    keys: TempDir,
}

impl Mint {
    /// Makes the keys. The test must have named [`Peer::PythonJwt`] with
    /// [`require!`](crate::require).
    pub fn new() -> Self {
        expect(Peer::PythonJwt);
        let keys = TempDir::new("jwt-keys");
        run(&["keys", &keys.path().to_string_lossy()]);
        Self { keys }
    }

    /// The path of one key file, as an argument.
    pub fn key(&self, name: &str) -> String {
        self.keys.arg(name)
    }

    /// One token per spec (see `tests/peers/jwt_mint.py`: `alg`, `claims`
    /// with `exp_in`/`nbf_in` in seconds from now, `kid`).
    pub fn tokens(&self, specs: &[Value]) -> Vec<String> {
        let out = run(&[
            "tokens",
            &self.keys.path().to_string_lossy(),
            &Value::Array(specs.to_vec()).to_string(),
        ]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("jwt_mint.py printed {out:?}: {e}"))
    }

    /// One token.
    pub fn token(&self, spec: Value) -> String {
        self.tokens(&[spec]).remove(0)
    }
}

impl Default for Mint {
    fn default() -> Self {
        Self::new()
    }
}

fn run(args: &[&str]) -> String {
    let out = output_within(
        command("python3").arg(dir().join("jwt_mint.py")).args(args),
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "jwt_mint.py {}: {}",
        args[0],
        text(&out.stderr)
    );
    text(&out.stdout)
}
