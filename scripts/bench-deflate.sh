#!/usr/bin/env bash
# What permessage-deflate (`throng serve --ws-deflate`, issue 31) costs, in
# one run, taking turns: the client of scripts/bench-serve.sh (throng-bench's
# serve_bench: one worker, N idle WebSocket subscribers of /bench held by
# one client process, then fan-out rounds of one message to all of them)
# twice per round:
#
#   plain     no extension offered: today's frames
#   deflate   every subscriber offers permessage-deflate (as a browser does)
#             and the server runs with --ws-deflate: one compressed frame
#             per fan-out, written to all
#
# The payload is --payload bytes (default 512) of JSON-like chat records,
# the same in both. Every subscriber must get exactly one whole frame per
# round (counted by frame, not by length), compressed in the deflate runs.
# Printed per configuration, as medians over the rounds:
#   user_bytes_per_conn / user_bytes_per_more_conn   memory per idle subscriber
#   fanout_cpu_ns_per_frame_in_loop                  the worker's fan-out CPU per delivery
#   process_cpu_ns_per_frame_publish                 the worker process's CPU per delivery
#   bytes_per_frame_received                         what went on the wire per delivery
# and each figure's ratio deflate / plain, per round and its median: the
# two runs of a round follow each other on the same machine, so a busy
# machine moves both.
#
#   scripts/bench-deflate.sh [--conns 10000] [--rounds 10] [--repeat 3] [--payload 512]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
CONNS=10000 ROUNDS=10 REPEAT=3 PAYLOAD=512
while [ $# -gt 0 ]; do
  case "$1" in
    --conns) CONNS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --payload) PAYLOAD=$2; shift 2 ;;
    *) echo "unknown option $1 (--conns N --rounds N --repeat N --payload BYTES)" >&2; exit 2 ;;
  esac
done
serve_bench_setup "$CONNS" deflate

for r in $(seq 1 "$REPEAT"); do
  for c in plain deflate; do
    flag=()
    [ "$c" = deflate ] && flag=(--deflate)
    "$CLIENT" --throng "$THRONG" --conns "$CONNS" --rounds "$ROUNDS" \
      --payload "$PAYLOAD" "${flag[@]}" >"$OUT/$c-$r.json"
    python3 - "$OUT/$c-$r.json" "$c" "$r" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"round {sys.argv[3]} {sys.argv[2]:8s} {j['user_bytes_per_conn']:6.0f} B/conn "
      f"{j['user_bytes_per_more_conn']:6.0f} B/more conn  "
      f"{j['fanout_cpu_ns_per_frame_in_loop']:7.0f} ns/frame (loop) "
      f"{j['process_cpu_ns_per_frame_publish']:7.0f} ns/frame (process)  "
      f"{j['bytes_per_frame_received']:5.0f} B/frame  compressed {j['frames_received_compressed']} "
      f"(server {j['server_frames_deflated']:.0f})  failed {j['failed']}  missing {j['subscribers_missing_a_frame']}")
PY
  done
done

python3 - "$OUT" "$REPEAT" <<'PY'
import json, statistics, sys
out, repeat = sys.argv[1], int(sys.argv[2])
keys = ["user_bytes_per_conn", "user_bytes_per_more_conn", "fanout_cpu_ns_per_frame_in_loop",
        "process_cpu_ns_per_frame_publish", "bytes_per_frame_received"]
runs = {c: [json.load(open(f"{out}/{c}-{r}.json")) for r in range(1, repeat + 1)] for c in ("plain", "deflate")}
bad = [(c, r["failed"], r["subscribers_missing_a_frame"]) for c in runs for r in runs[c]
       if r["failed"] or r["subscribers_missing_a_frame"]]
want = sum(r["connections"] * r["rounds"] for r in runs["deflate"])
got = sum(r["frames_received_compressed"] for r in runs["deflate"])
summary = {"conns": runs["plain"][0]["connections"], "rounds": runs["plain"][0]["rounds"],
           "payload_bytes": runs["plain"][0]["payload_bytes"], "repeat": repeat,
           "deflate_frames_compressed": f"{got} of {want}", "failures": bad}
for k in keys:
    p = statistics.median(r[k] for r in runs["plain"])
    d = statistics.median(r[k] for r in runs["deflate"])
    ratio = statistics.median(b[k] / a[k] for a, b in zip(runs["plain"], runs["deflate"]) if a[k])
    summary[k] = {"plain": round(p, 1), "deflate": round(d, 1), "ratio_same_round": round(ratio, 3)}
print(json.dumps(summary, indent=2))
PY
