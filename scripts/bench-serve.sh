#!/usr/bin/env bash
# Benchmark of `throng serve` on this machine (issue 2): one worker, N idle
# subscribers on loopback held by a client in another process
# (crates/throng-bench/src/bin/serve_bench.rs).
#
#   scripts/bench-serve.sh [--conns 18000] [--rounds 15] [--payload 64]
#   scripts/bench-serve.sh --throng BIN_BEFORE --throng BIN_AFTER [--repeat 3] [--conns N] ...
#
# With no --throng it builds and measures this tree's binary once and prints
# one JSON object:
#   user_bytes_per_conn                 worker RSS with N minus RSS at 0, over N (target <= 1024)
#   fanout_cpu_ns_per_frame_in_loop     worker thread CPU in the fan-out loop, per frame
#   floor_write_cpu_ns_per_frame        a bare loop of the same socket write of the same frame to the same sockets
#   ratio_in_loop / ratio_process       fan-out over floor (target <= 1.5); _process uses /proc utime+stime
#   publish_to_reply_ms_median          POST /publish until its reply, sent after the last frame is written
#   subscribers_missing_a_frame         after each publish every socket is drained: must be 0
#   upgrades_per_sec                    WebSocket upgrades accepted per second (200 in flight)
#   kernel_*                            kernel memory per connection (both ends are on this machine)
# With --throng given twice or more (a before/after), the binaries take turns
# --repeat times with the same client, each run's JSON goes to $OUT, and the
# last lines are the medians per binary of the figures above.
# Keep N under the 20,000-file limit: the client holds all N in one process,
# outside any epoll, so a fan-out wakes nothing in it (see serve_bench's docs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
target=${CARGO_TARGET_DIR:-target}
BINS=() REPEAT=1 PASS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --throng) BINS+=("$2"); shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    *) PASS+=("$1"); shift ;;
  esac
done
cargo build --quiet --release -p throng-bench --bin serve_bench
CLIENT=$target/release/serve_bench
if [ "${#BINS[@]}" -eq 0 ]; then
  cargo build --quiet --release -p throng
  exec "$CLIENT" --throng "$target/release/throng" "${PASS[@]}"
fi
for b in "${BINS[@]}"; do [ -x "$b" ] || { echo "$b is not an executable" >&2; exit 2; }; done
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-serve.XXXXXX)}
mkdir -p "$OUT"
echo "results in $OUT"
machine_line
for r in $(seq 1 "$REPEAT"); do
  for i in "${!BINS[@]}"; do
    "$CLIENT" --throng "${BINS[$i]}" "${PASS[@]}" >"$OUT/bin$i-round$r.json"
    echo "round $r, ${BINS[$i]}: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["user_bytes_per_conn"], "B/conn,", round(r["ratio_in_loop"], 3), "x floor")' "$OUT/bin$i-round$r.json")"
  done
done
python3 - "$OUT" "${BINS[@]}" <<'EOF'
import glob, json, statistics, sys
out, bins = sys.argv[1], sys.argv[2:]
keys = ["user_bytes_per_conn", "fanout_cpu_ns_per_frame_in_loop", "floor_write_cpu_ns_per_frame",
        "ratio_in_loop", "ratio_process", "publish_to_reply_ms_median", "upgrades_per_sec",
        "kernel_slab_bytes_per_conn", "subscribers_missing_a_frame"]
for i, b in enumerate(bins):
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/bin{i}-round*.json"))]
    med = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    print(json.dumps({"throng": b, "runs": len(runs), "medians": med}))
EOF
