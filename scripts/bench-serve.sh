#!/usr/bin/env bash
# Benchmark of `throng serve` on this machine (issue 2): one worker, N idle
# subscribers on loopback held by a client in another process.
#
#   scripts/bench-serve.sh [--conns 18000] [--rounds 15] [--payload 64]
#
# Prints one JSON object:
#   user_bytes_per_conn                 worker RSS with N minus RSS at 0, over N (target <= 1024)
#   fanout_cpu_ns_per_frame_in_loop     worker thread CPU in the fan-out loop, per frame
#   floor_write_cpu_ns_per_frame        a bare write(2) loop of the same frame to the same sockets
#   ratio_in_loop / ratio_process       fan-out over floor (target <= 1.5); _process uses /proc utime+stime
#   publish_to_reply_ms_median          POST /publish until its reply, sent after the last frame is written
#   subscribers_missing_a_frame         after each publish every socket is drained: must be 0
#   upgrades_per_sec                    WebSocket upgrades accepted per second (200 in flight)
#   kernel_*                            kernel memory per connection (both ends are on this machine)
# Keep N under the 20,000-file limit: the client holds all N in one process,
# outside any epoll, so a fan-out wakes nothing in it (see the example's docs).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
cargo build --quiet --release -p throng
cargo build --quiet --release -p throng-server --example serve_bench
exec "$target/release/examples/serve_bench" --throng "$target/release/throng" "$@"
