//! `throng` as its users run it: the real binary, real sockets on loopback,
//! real peers (Redis, HAProxy, Python `websockets`, Node `ws`, Chromium,
//! `openssl`). One test binary, one module per subcommand or concern, so
//! the suite links once; the helpers they share live in `throng-testkit`.
//!
//! A test whose peer is missing says so and is skipped, unless
//! `THRONG_TEST_REQUIRE_PEERS` is set (`scripts/test.sh` sets it).

mod agents;
mod agents_json;
mod api;
mod api_presence;
mod api_sub;
mod attack;
mod attack_h2;
mod auth;
mod bench;
mod channels;
mod cluster;
mod config_file;
mod deflate;
mod deploy;
mod doctor;
mod exposure;
mod file_budget;
mod grafana;
mod history;
mod hold;
mod hold_mqtt_clients;
mod hold_sse;
mod http_park;
mod jwks;
mod knee;
mod knee_agents;
mod knee_flags;
mod knee_transports;
mod load_metrics;
mod mqtt;
mod mqtt_auth;
mod mqtt_cluster;
mod mqtt_listen;
mod mqtt_qos;
mod mqtt_redis;
mod mqtt_retain;
mod mqtt_serve;
mod mqtt_session;
mod mqtt_sessions_redis;
mod mqtt_ws;
mod newcomer;
mod one_owner;
mod output;
mod ports;
mod process_metrics;
mod proxy_protocol;
mod redis;
mod rediss;
mod reload;
mod report;
mod scale;
mod serve;
mod serve_tls;
mod takeover;
mod takeover_retained;
mod tls_client;
mod tls_park;
mod vegeta;

use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use throng_testkit::Server;
use throng_testkit::process::{command, output_within, text};

/// The binary under test.
const THRONG: &str = env!("CARGO_BIN_EXE_throng");

/// `throng`, with this process's open-file limit raised for it.
fn throng() -> Command {
    command(THRONG)
}

/// `throng serve --listen 127.0.0.1:0 --json` plus `args`, once a worker answers.
fn serve(args: &[&str]) -> Server {
    Server::start(THRONG, args)
}

/// Runs `throng <sub> <args>` asking for its JSON summary (`hold`, `attack`),
/// killed after 90 s; returns the exit code (-1 when killed by a signal),
/// the summary (`Null` when stdout held none) and stderr.
fn run_json(sub: &str, args: &[&str]) -> (i32, Value, String) {
    let json: &[&str] = if sub == "attack" {
        &["--format", "json", "-q"]
    } else {
        &["--json", "-q"]
    };
    let out = output_within(
        throng().arg(sub).args(args).args(json),
        Duration::from_secs(90),
    );
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        text(&out.stderr),
    )
}
