//! The programs outside Rust that some tests run against, how to tell
//! whether this machine has them, and how a test skips (or, under
//! `scripts/test.sh`, fails) when one is missing.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::process::command;

/// Set (to anything but `0` or empty) by `scripts/test.sh`: a missing peer
/// fails the test instead of skipping it.
pub const REQUIRE_PEERS: &str = "THRONG_TEST_REQUIRE_PEERS";

/// A program some test needs that a Rust toolchain does not bring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// `redis-server` (Debian package `redis-server`).
    RedisServer,
    /// `redis-cli` (Debian package `redis-tools`).
    RedisCli,
    /// `haproxy` (Debian package `haproxy`).
    Haproxy,
    /// The `openssl` command line (Debian package `openssl`).
    Openssl,
    /// `python3`, for scripts that need nothing beyond its standard library.
    Python,
    /// `python3` with the `websockets` package (13 or later: its asyncio API).
    PythonWebsockets,
    /// `python3` with `PyJWT` and `cryptography`: tokens from an
    /// implementation independent of the server's.
    PythonJwt,
    /// `node` with the `ws` and `eventsource` packages installed under `tests/peers`.
    NodeWs,
    /// A headless Chromium (Debian package `chromium`).
    Chromium,
    /// Root, with `unshare` (util-linux) and `sysctl` (procps): scratch
    /// mount and network namespaces, where a test runs a command that
    /// changes kernel settings or system files without changing this machine's.
    Namespaces,
    /// The Mosquitto MQTT broker (Debian package `mosquitto`).
    Mosquitto,
    /// `python3` with `paho-mqtt` 2: an MQTT client independent of ours.
    PythonPaho,
    /// `mosquitto_sub` and `mosquitto_pub` (Debian package `mosquitto-clients`).
    MosquittoClients,
    /// `node` with the `mqtt` package installed under `tests/peers`.
    NodeMqtt,
    /// `redis-sentinel` (Debian package `redis-sentinel`).
    RedisSentinel,
    /// Vegeta, the HTTP load tester (`go install github.com/tsenart/vegeta/v12`).
    Vegeta,
    /// `python3` with `prometheus-client`: its parser reads Prometheus text
    /// independently of ours.
    PythonPrometheus,
    /// `python3` with python-hyper's `h2`: an HTTP/2 server independent of
    /// our client (`tests/peers/h2_server.py`).
    PythonH2,
}

impl Peer {
    /// How many kinds of peer there are: one past the last variant.
    const COUNT: usize = Self::PythonH2 as usize + 1;

    /// What the peer is, as a person would look for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::RedisServer => "redis-server",
            Self::RedisCli => "redis-cli",
            Self::Haproxy => "haproxy",
            Self::Openssl => "openssl",
            Self::Python => "python3",
            Self::PythonWebsockets => "python3 with websockets >= 13",
            Self::PythonJwt => "python3 with PyJWT and cryptography",
            Self::NodeWs => "node with ws and eventsource in tests/peers",
            Self::Chromium => "chromium",
            Self::Namespaces => "root with unshare and sysctl",
            Self::Mosquitto => "mosquitto",
            Self::PythonPaho => "python3 with paho-mqtt >= 2",
            Self::MosquittoClients => "mosquitto_sub and mosquitto_pub",
            Self::NodeMqtt => "node with mqtt in tests/peers",
            Self::RedisSentinel => "redis-sentinel",
            Self::Vegeta => "vegeta",
            Self::PythonPrometheus => "python3 with prometheus-client",
            Self::PythonH2 => "python3 with h2 >= 4.1",
        }
    }

    /// How to install it by hand (`scripts/test.sh` does all of them).
    pub fn install(self) -> &'static str {
        match self {
            Self::RedisServer => "apt-get install redis-server",
            Self::RedisCli => "apt-get install redis-tools",
            Self::Haproxy => "apt-get install haproxy",
            Self::Openssl => "apt-get install openssl",
            Self::Python => "apt-get install python3",
            Self::PythonWebsockets => "python3 -m pip install 'websockets>=13'",
            Self::PythonJwt => "python3 -m pip install 'PyJWT>=2.8' 'cryptography>=41'",
            Self::NodeWs => "cd tests/peers && npm install",
            Self::Chromium => "apt-get install --no-install-recommends chromium",
            Self::Namespaces => "run the tests as root; apt-get install util-linux procps",
            Self::Mosquitto => "apt-get install mosquitto",
            Self::PythonPaho => "python3 -m pip install 'paho-mqtt>=2'",
            Self::MosquittoClients => "apt-get install mosquitto-clients",
            Self::NodeMqtt => "cd tests/peers && npm install",
            Self::RedisSentinel => "apt-get install redis-sentinel",
            Self::Vegeta => {
                "GOBIN=/usr/local/bin go install github.com/tsenart/vegeta/v12@v12.13.0"
            }
            Self::PythonPrometheus => "python3 -m pip install 'prometheus-client>=0.17'",
            Self::PythonH2 => "python3 -m pip install 'h2>=4.1'",
        }
    }

    /// Whether this machine has the peer (asked once per process).
    pub fn is_present(self) -> bool {
        static FOUND: [OnceLock<bool>; Peer::COUNT] = [const { OnceLock::new() }; Peer::COUNT];
        *FOUND[self as usize].get_or_init(|| self.probe())
    }

    /// Runs a command that succeeds only when the peer can do its job
    /// (from `tests/peers`, where node finds `ws`).
    fn probe(self) -> bool {
        let (program, args): (&str, &[&str]) = match self {
            Self::RedisServer => ("redis-server", &["--version"]),
            Self::RedisCli => ("redis-cli", &["--version"]),
            Self::RedisSentinel => ("redis-sentinel", &["--version"]),
            Self::Haproxy => ("haproxy", &["-v"]),
            Self::Openssl => ("openssl", &["version"]),
            Self::Python => ("python3", &["-c", "pass"]),
            Self::PythonWebsockets => ("python3", &["-c", "import websockets.asyncio.server"]),
            Self::PythonJwt => (
                "python3",
                &[
                    "-c",
                    "import jwt, cryptography.hazmat.primitives.asymmetric.ed25519",
                ],
            ),
            Self::NodeWs => (
                "node",
                &[
                    "-e",
                    "require.resolve('ws'); require.resolve('eventsource')",
                ],
            ),
            Self::Chromium => return chromium_program().is_some(),
            Self::Namespaces => (
                "unshare",
                &["--mount", "--net", "sysctl", "-n", "net.core.somaxconn"],
            ),
            // `-h` prints the usage and exits 3; the version line says it runs.
            Self::Mosquitto => {
                return Command::new("mosquitto")
                    .arg("-h")
                    .stdin(Stdio::null())
                    .output()
                    .is_ok_and(|o| {
                        String::from_utf8_lossy(&o.stdout).contains("mosquitto version")
                    });
            }
            Self::PythonPaho => (
                "python3",
                &["-c", "import paho.mqtt.client as m; m.CallbackAPIVersion"],
            ),
            // `--help` exits 1; the version line says both run.
            Self::MosquittoClients => {
                return ["mosquitto_sub", "mosquitto_pub"].iter().all(|p| {
                    Command::new(p)
                        .arg("--help")
                        .stdin(Stdio::null())
                        .output()
                        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(" version "))
                });
            }
            Self::NodeMqtt => ("node", &["-e", "require.resolve('mqtt')"]),
            Self::Vegeta => ("vegeta", &["-version"]),
            Self::PythonPrometheus => ("python3", &["-c", "import prometheus_client.parser"]),
            Self::PythonH2 => ("python3", &["-c", "import h2.connection"]),
        };
        Command::new(program)
            .args(args)
            .current_dir(dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// Set by `scripts/test.sh` to the peers (by [`Peer::name`], comma
/// separated) it could not install because their registry was unreachable:
/// their tests skip, saying so, even under [`REQUIRE_PEERS`].
pub const UNREACHABLE_PEERS: &str = "THRONG_TEST_UNREACHABLE_PEERS";

/// Whether a missing peer fails the test (`THRONG_TEST_REQUIRE_PEERS`).
pub fn required() -> bool {
    std::env::var_os(REQUIRE_PEERS).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Whether every peer in `peers` is here. When one is missing, says so
/// on the terminal (past the test harness's capture, so a passing run
/// shows it) and returns false, so the test returns early; under
/// [`REQUIRE_PEERS`] it fails the test instead. [`require!`](crate::require)
/// is the short form.
pub fn check(peers: &[Peer]) -> bool {
    let missing: Vec<Peer> = peers.iter().copied().filter(|p| !p.is_present()).collect();
    if missing.is_empty() {
        return true;
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_owned();
    let what = missing
        .iter()
        .map(|p| format!("{} ({})", p.name(), p.install()))
        .collect::<Vec<_>>()
        .join(", ");
    // A peer whose registry scripts/test.sh could not reach is skipped,
    // loudly, rather than failed.
    let unreachable = std::env::var(UNREACHABLE_PEERS).unwrap_or_default();
    let excused = missing
        .iter()
        .all(|p| unreachable.split(',').any(|n| n == p.name()));
    assert!(
        !required() || excused,
        "{test} needs {what}; {REQUIRE_PEERS} is set, so a missing peer is a failure \
         (scripts/test.sh installs every peer)"
    );
    // Straight to stderr: the harness captures only print!/eprint!.
    let _ = writeln!(
        std::io::stderr(),
        "\nskipped {test}: needs {what}; scripts/test.sh installs them"
    );
    false
}

/// Fails the test, saying how to install it, unless `peer` is here: for
/// the launchers, whose tests named their peers with [`require!`](crate::require).
pub fn expect(peer: Peer) {
    assert!(
        peer.is_present(),
        "{} is not installed: {} (or run scripts/test.sh, which installs every peer)",
        peer.name(),
        peer.install()
    );
}

/// Skips the test (returns from it) unless every peer named is on this
/// machine; see [`peers::check`](crate::peers::check).
///
/// ```
/// use throng_testkit::{Peer, require};
///
/// fn two_nodes_behind_haproxy() {
///     require!(Peer::RedisServer, Peer::Haproxy);
///     // Start Redis and HAProxy here: both are installed.
/// }
/// ```
#[macro_export]
macro_rules! require {
    ($($peer:expr),+ $(,)?) => {
        if !$crate::peers::check(&[$($peer),+]) {
            return;
        }
    };
}

/// `tests/peers`: the peer scripts and their `node_modules`.
pub fn dir() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/peers"))
}

/// `python3 tests/peers/<script>`.
pub fn python(script: &str) -> Command {
    expect(Peer::PythonWebsockets);
    let mut c = command("python3");
    c.arg(dir().join(script));
    c
}

/// `node tests/peers/<script>`, run from `tests/peers` so it finds `ws`.
pub fn node(script: &str) -> Command {
    expect(Peer::NodeWs);
    let mut c = command("node");
    c.arg(dir().join(script)).current_dir(dir());
    c
}

/// Headless Chromium (see [`chromium_program`]) with a scratch profile in
/// `profile` and nothing of its own on the network: add what to do
/// (`--dump-dom`, `--screenshot=...`) and the page.
pub fn headless_chromium(profile: &std::path::Path) -> Command {
    let mut c = command(chromium_program().expect("require!(Peer::Chromium) first"));
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// The Chromium on `PATH` (Debian calls it `chromium`, others `chromium-browser`).
pub fn chromium_program() -> Option<&'static str> {
    static FOUND: OnceLock<Option<&'static str>> = OnceLock::new();
    *FOUND.get_or_init(|| {
        ["chromium", "chromium-browser"].into_iter().find(|b| {
            Command::new(b)
                .arg("--version")
                .stdin(Stdio::null())
                .output()
                .is_ok_and(|o| o.status.success())
        })
    })
}
