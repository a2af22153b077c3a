//! Keys and tokens made by an independent JWT implementation (Python
//! `PyJWT` with `cryptography`, `tests/peers/jwt_mint.py`), for the server's
//! auth tests: the server must accept what another library signs, and
//! refuse the attacks it builds by hand.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::TempDir;
use crate::certs::Certs;
use crate::peers::{self, Peer, dir, expect};
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

    /// A JSON Web Key Set of the public keys `labels` name, `KID=NAME`
    /// each (`NAME`: `rsa`, `ec` or `ed`), written by PyJWT.
    pub fn jwks(&self, labels: &[&str]) -> String {
        let mut args = vec![
            "jwks",
            self.keys.path().to_str().expect("a UTF-8 temp path"),
        ];
        args.extend_from_slice(labels);
        run(&args)
    }
}

/// `tests/peers/jwks_server.py`: an HTTPS server (Python's `ssl`) that
/// answers every GET with a key set file as it is at that moment, and
/// counts the GETs. Killed on drop.
#[derive(Debug)]
pub struct JwksServer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
}

impl JwksServer {
    /// Serves `set_file` with `certs`' server certificate. The test must
    /// have named [`Peer::PythonJwt`] (its Python) with [`require!`](crate::require).
    pub fn start(certs: &Certs, set_file: &Path) -> Self {
        expect(Peer::PythonJwt);
        let mut cmd = peers::python("jwks_server.py");
        cmd.args(["--tls-cert", certs.cert(), "--tls-key", certs.key()])
            .arg(set_file)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
        let stdin = child.stdin.take().expect("stdin is piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("read READY <port>");
        let port = line
            .strip_prefix("READY ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("jwks_server.py said {line:?}, not READY <port>"));
        Self {
            child,
            stdin,
            stdout,
            port,
        }
    }

    /// `https://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// How many GETs it has answered.
    pub fn gets(&mut self) -> u64 {
        writeln!(self.stdin, "gets").expect("ask jwks_server.py");
        self.stdin.flush().expect("flush");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read its count");
        line.trim()
            .parse()
            .unwrap_or_else(|e| panic!("jwks_server.py counted {line:?}: {e}"))
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
