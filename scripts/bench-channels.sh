#!/usr/bin/env bash
# What several channels on one connection cost `throng serve` (issue 31), in
# one run, taking turns: the client of scripts/bench-serve.sh (throng-bench's
# serve_bench: one worker, N idle subscribers held by one client process,
# then fan-out rounds of a 64-byte message to channel "bench") four ways:
#
#   one     today's one-channel URL (ws://host/bench), the baseline
#   1       throng.v1 at /?channel=bench (a connection of several, in one)
#   3       /?channel=bench&channel=o1&channel=o2 (the others shared by all)
#   10      /?channel=bench&channel=o1..o9
#
# printing per configuration the medians of user_bytes_per_more_conn (what
# one more idle subscriber costs the worker) and fanout_cpu_ns_per_frame_in_loop
# (the worker's fan-out CPU per delivered frame), then what each channel past
# the first costs: (bytes at 10 - bytes at 1) / 9.
#
#   scripts/bench-channels.sh [--conns 10000] [--rounds 5] [--repeat 3]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
CONNS=10000 ROUNDS=5 REPEAT=3
while [ $# -gt 0 ]; do
  case "$1" in
    --conns) CONNS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    *) echo "unknown option $1 (--conns N --rounds N --repeat N)" >&2; exit 2 ;;
  esac
done
serve_bench_setup "$CONNS" channels

CONFIGS=(one 1 3 10)
for r in $(seq 1 "$REPEAT"); do
  for c in "${CONFIGS[@]}"; do
    n=$c
    [ "$c" = one ] && n=0
    "$CLIENT" --throng "$THRONG" --conns "$CONNS" --rounds "$ROUNDS" \
      --channels "$n" >"$OUT/$c-$r.json"
    python3 - "$OUT/$c-$r.json" "$c" "$r" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"round {sys.argv[3]} channels {sys.argv[2]:4s} {j['user_bytes_per_more_conn']:6.0f} B/more conn  "
      f"{j['fanout_cpu_ns_per_frame_in_loop']:6.0f} ns/frame  "
      f"failed {j['failed']}  missing {j['subscribers_missing_a_frame']}")
PY
  done
done

python3 - "$OUT" "${CONFIGS[@]}" <<'PY'
import glob, json, statistics, sys
out, configs = sys.argv[1], sys.argv[2:]
keys = ["user_bytes_per_more_conn", "user_bytes_per_conn", "fanout_cpu_ns_per_frame_in_loop",
        "publish_to_reply_ms_median", "failed", "subscribers_missing_a_frame"]
med = {}
for c in configs:
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/{c}-[0-9]*.json"))]
    med[c] = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    print(json.dumps({"channels": c, "runs": len(runs), "medians": med[c]}))
per = (med["10"]["user_bytes_per_more_conn"] - med["1"]["user_bytes_per_more_conn"]) / 9
print(json.dumps({"bytes_per_further_channel": round(per, 1),
                  "several_channels_url_over_one_channel_url_bytes":
                      med["1"]["user_bytes_per_more_conn"] - med["one"]["user_bytes_per_more_conn"],
                  "fanout_ns_10_over_one": round(med["10"]["fanout_cpu_ns_per_frame_in_loop"]
                                                 / med["one"]["fanout_cpu_ns_per_frame_in_loop"], 3)}))
PY
