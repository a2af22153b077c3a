//! The Grafana dashboard in `deploy/grafana/serve.json` draws what
//! `/metrics` has: every metric name in every panel's expression is a
//! family a real `throng serve` (with history, routing through Redis)
//! exposes.

use serde_json::Value;
use throng_testkit::Peer;
use throng_testkit::http::get;
use throng_testkit::redis::Redis;
use throng_testkit::require;

use crate::serve;

/// The metric names an expression reads: the words that start with
/// `throng_` or `process_`.
pub(crate) fn metric_names(expr: &str) -> Vec<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("throng_") || w.starts_with("process_"))
        .collect()
}

/// Every panel's expressions of the dashboard `deploy/grafana/<file>`.
pub(crate) fn board_exprs(file: &str) -> Vec<String> {
    let path = format!("{}/../../deploy/grafana/{file}", env!("CARGO_MANIFEST_DIR"));
    let board: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    board["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn every_dashboard_expression_reads_families_that_exist() {
    require!(Peer::RedisServer);
    let exprs = board_exprs("serve.json");
    assert!(exprs.len() >= 10, "{exprs:?}");
    let redis = Redis::start(&[], &[]);
    let url = redis.url();
    let server = serve(&["--workers", "1", "--history", "10", "--redis", &url]);
    let text = get(server.addr, "/metrics").1;
    for expr in &exprs {
        let read = metric_names(expr);
        assert!(!read.is_empty(), "{expr} reads no throng metric");
        for name in read {
            assert!(
                text.contains(&format!("# TYPE {name} ")),
                "{expr}: no {name} in\n{text}"
            );
        }
    }
}
