//! `/metrics` has the standard `process_*` families for the supervisor and
//! every worker (a `role` label tells them apart) and the kernel's TCP
//! socket memory.

use throng_testkit::http::{get, metric_in};

use crate::serve;

#[test]
fn every_process_of_the_node_is_in_metrics_with_its_role() {
    let server = serve(&["--workers", "2"]);
    assert_eq!(server.worker_pids().len(), 2);
    let text = get(server.addr, "/metrics").1;
    let sample = |name: &str, labels: &str| {
        metric_in(&text, &format!("{name}{{{labels}}}"))
            .unwrap_or_else(|| panic!("no {name}{{{labels}}} in\n{text}"))
    };
    let me = "role=\"supervisor\"";
    assert!(sample("process_resident_memory_bytes", me) > 0.0);
    assert!(sample("process_open_fds", me) >= 3.0);
    assert!(sample("process_max_fds", me) >= sample("process_open_fds", me));
    assert!(sample("process_start_time_seconds", me) > 1.6e9);
    let _ = sample("process_cpu_seconds_total", me);
    for i in 0..2 {
        let worker = format!("role=\"worker\",worker=\"{i}\"");
        assert!(sample("process_open_fds", &worker) >= 3.0);
        assert!(sample("process_resident_memory_bytes", &worker) > 0.0);
    }
    assert!(
        metric_in(&text, "throng_kernel_tcp_memory_bytes").is_some(),
        "{text}"
    );
    assert!(
        metric_in(&text, "throng_kernel_tcp_sockets").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
}
