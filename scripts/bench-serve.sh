#!/usr/bin/env bash
# Benchmark of `throng serve` on this machine (issue 2): one worker, N idle
# subscribers on loopback held by a client in another process
# (crates/throng-bench/src/bin/serve_bench.rs).
#
#   scripts/bench-serve.sh [--conns 18000] [--rounds 15] [--payload 64]
#   scripts/bench-serve.sh --throng BIN_BEFORE --throng BIN_AFTER [--repeat 3] [--conns N] ...
#   (each BIN built with `cargo build --release -p throng --features bench-floor`:
#   the floor below is a benchmark-only route of the server)
#
# With no --throng it builds and measures this tree's binary once and prints
# one JSON object:
#   user_bytes_per_conn                 worker RSS with N minus RSS at 0, over N (target <= 1024)
#   fanout_cpu_ns_per_frame_in_loop     worker thread CPU in the fan-out loop, per frame
#   floor_write_cpu_ns_per_frame        a bare loop of the same socket write of the same frame to the same sockets
#   ratio_in_loop / ratio_process       fan-out over floor (target <= 1.5); _process uses /proc utime+stime
#   publish_to_reply_ms_median          POST /publish until its reply (sent once the worker counted, before the writes)
#   publish_to_last_frame_ms_median     POST /publish until every subscriber has its frame
#   subscribers_missing_a_frame         after each publish every socket is drained: must be 0
#   upgrades_per_sec                    WebSocket upgrades accepted per second (200 in flight)
#   kernel_*                            kernel memory per connection (both ends are on this machine)
# With --throng given twice or more (a before/after), the binaries take turns
# --repeat times with the same client, each run's JSON goes to $OUT, and the
# last lines are the medians per binary of the figures above.
# With --callgrind too, each server runs under valgrind's callgrind, and each
# run adds fanout_instructions_per_frame: the worker's user-space
# instructions handling Deliver records (the fan-out loop and the send(2)
# wrappers; the kernel's work is not counted), over rounds x subscribers.
# Instruction counts repeat on a busy machine where CPU times do not; keep
# --conns near 2000 (everything runs 20-50x slower).
# Keep N under the 20,000-file limit: the client holds all N in one process,
# outside any epoll, so a fan-out wakes nothing in it (see serve_bench's docs).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
target=${CARGO_TARGET_DIR:-target}
BINS=() REPEAT=1 PASS=() CALLGRIND=0
while [ $# -gt 0 ]; do
  case "$1" in
    --throng) BINS+=("$2"); shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --callgrind) CALLGRIND=1; shift ;;
    *) PASS+=("$1"); shift ;;
  esac
done
cargo build --quiet --release -p throng-bench --bin serve_bench
CLIENT=$target/release/serve_bench
if [ "${#BINS[@]}" -eq 0 ]; then
  # The floor the fan-out is compared with is a benchmark-only route of the
  # server, compiled in only with this feature.
  cargo build --quiet --release -p throng --features bench-floor
  exec "$CLIENT" --throng "$target/release/throng" "${PASS[@]}"
fi
for b in "${BINS[@]}"; do [ -x "$b" ] || { echo "$b is not an executable" >&2; exit 2; }; done
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-serve.XXXXXX)}
mkdir -p "$OUT"
echo "results in $OUT"
machine_line
if [ "$CALLGRIND" = 1 ]; then
  command -v valgrind >/dev/null || { echo "valgrind is missing (apt-get install valgrind)" >&2; exit 1; }
fi
# Runs binary $1 once as round $2; its JSON goes to $OUT/bin$1-round$2.json.
run() {
  local bin=${BINS[$1]} json=$OUT/bin$1-round$2.json
  if [ "$CALLGRIND" = 1 ]; then
    printf '#!/bin/sh\nexec valgrind -q --tool=callgrind --trace-children=yes --callgrind-out-file=%s/cg-bin%s-round%s.%%p %s "$@"\n' \
      "$OUT" "$1" "$2" "$bin" >"$OUT/cg-bin$1"
    chmod +x "$OUT/cg-bin$1"
    bin=$OUT/cg-bin$1
  fi
  "$CLIENT" --throng "$bin" "${PASS[@]}" >"$json"
  if [ "$CALLGRIND" = 1 ]; then
    # The worker is the process with the most instructions; the fan-out is
    # Subscribers::fanout_some (before it ran in turns on its own task, the
    # control loop's on_record held it, inlined).
    worker=$(ls -S "$OUT"/cg-bin"$1"-round"$2".* | head -1)
    python3 - "$json" "$worker" <<'EOF'
import json, re, subprocess, sys
path, profile = sys.argv[1], sys.argv[2]
r = json.load(open(path))
out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", profile],
                     capture_output=True, text=True).stdout
hit = next(l for l in out.splitlines() if re.search(r"::fanout_some \[", l)) \
    if "::fanout_some [" in out else next(l for l in out.splitlines() if re.search(r"::on_record \[", l))
r["fanout_instructions_per_frame"] = round(int(hit.split()[0].replace(",", "")) / (r["rounds"] * r["connections"]), 1)
json.dump(r, open(path, "w"), indent=2)
EOF
  fi
}
for r in $(seq 1 "$REPEAT"); do
  for i in "${!BINS[@]}"; do
    run "$i" "$r"
    echo "round $r, ${BINS[$i]}: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); i = r.get("fanout_instructions_per_frame"); print(r["user_bytes_per_conn"], "B/conn,", round(r["ratio_in_loop"], 3), "x floor" + (f", {i} instructions/frame" if i else ""))' "$OUT/bin$i-round$r.json")"
  done
done
python3 - "$OUT" "${BINS[@]}" <<'EOF'
import glob, json, statistics, sys
out, bins = sys.argv[1], sys.argv[2:]
keys = ["user_bytes_per_conn", "fanout_cpu_ns_per_frame_in_loop", "floor_write_cpu_ns_per_frame",
        "ratio_in_loop", "ratio_process", "publish_to_reply_ms_median",
        "publish_to_last_frame_ms_median", "upgrades_per_sec",
        "kernel_slab_bytes_per_conn", "subscribers_missing_a_frame"]
for i, b in enumerate(bins):
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/bin{i}-round*.json"))]
    med = {k: round(statistics.median(r[k] for r in runs), 3)
           for k in keys + ["fanout_instructions_per_frame"] if k in runs[0]}
    print(json.dumps({"throng": b, "runs": len(runs), "medians": med}))
EOF
