#!/usr/bin/env bash
# What history, recovery and SSE cost `throng serve` (issue 18), in one run,
# taking turns: the client of scripts/bench-serve.sh (throng-bench's
# serve_bench: one worker, N idle subscribers held by one client process,
# then fan-out rounds of a 64-byte message) against the same binary four ways:
#
#   ws          WebSocket subscribers, --history 0 (the baseline)
#   ws-history  WebSocket subscribers, --history 100 (every message numbered and kept)
#   sse         SSE subscribers (GET /sse/bench), --history 0
#   sse-history SSE subscribers, --history 100
#
# printing per configuration the medians of user_bytes_per_more_conn (what
# one more idle subscriber costs the worker), fanout_cpu_ns_per_frame_in_loop
# and ratio_in_loop (over a bare write(2) loop of the same frame); then
# throng-bench's rejoin_bench: M messages kept, N subscribers reconnecting at
# once with ?since= and reading all M (time, and the server's CPU),
# embedded and, when redis-server is here, through Redis.
#
#   scripts/bench-history.sh [--conns 10000] [--rounds 5] [--repeat 3] [--subs 1000] [--messages 1000]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
CONNS=10000 ROUNDS=5 REPEAT=3 SUBS=1000 MESSAGES=1000
while [ $# -gt 0 ]; do
  case "$1" in
    --conns) CONNS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --subs) SUBS=$2; shift 2 ;;
    --messages) MESSAGES=$2; shift 2 ;;
    *) echo "unknown option $1 (--conns N --rounds N --repeat N --subs N --messages N)" >&2; exit 2 ;;
  esac
done
target=${CARGO_TARGET_DIR:-target}
cargo build --quiet --release -p throng --features bench-floor
cargo build --quiet --release -p throng-bench --bin serve_bench --bin rejoin_bench
THRONG=$target/release/throng
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-history.XXXXXX)}
mkdir -p "$OUT"
echo "results in $OUT"
machine_line

CONFIGS=(ws ws-history sse sse-history)
run() {
  local args=()
  case "$1" in
    ws) ;;
    ws-history) args=(--serve-arg --history --serve-arg 100) ;;
    sse) args=(--kind sse) ;;
    sse-history) args=(--kind sse --serve-arg --history --serve-arg 100) ;;
  esac
  "$target/release/serve_bench" --throng "$THRONG" --conns "$CONNS" --rounds "$ROUNDS" "${args[@]}" >"$OUT/$1-$2.json"
}

for r in $(seq 1 "$REPEAT"); do
  for c in "${CONFIGS[@]}"; do
    run "$c" "$r"
    python3 - "$OUT/$c-$r.json" "$c" "$r" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"round {sys.argv[3]} {sys.argv[2]:11s} {j['user_bytes_per_more_conn']:6.0f} B/more conn  "
      f"{j['fanout_cpu_ns_per_frame_in_loop']:6.0f} ns/frame  {j['ratio_in_loop']:.3f}x floor  "
      f"failed {j['failed']}  missing {j['subscribers_missing_a_frame']}")
PY
  done
done

python3 - "$OUT" "${CONFIGS[@]}" <<'PY'
import glob, json, statistics, sys
out, configs = sys.argv[1], sys.argv[2:]
keys = ["user_bytes_per_more_conn", "user_bytes_per_conn", "fanout_cpu_ns_per_frame_in_loop", "ratio_in_loop",
        "publish_to_reply_ms_median", "failed", "subscribers_missing_a_frame"]
for c in configs:
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/{c}-[0-9]*.json"))]
    med = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    print(json.dumps({"config": c, "runs": len(runs), "medians": med}))
PY

echo "recovery: $MESSAGES messages to $SUBS reconnecting subscribers"
"$target/release/rejoin_bench" --throng "$THRONG" --subs "$SUBS" --messages "$MESSAGES" | tee "$OUT/rejoin-embedded.json"
if command -v redis-server >/dev/null; then
  port=$(free_port)
  redis-server --port "$port" --save '' --appendonly no >"$OUT/redis.log" 2>&1 &
  redis=$!
  trap 'kill $redis 2>/dev/null || true' EXIT
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  "$target/release/rejoin_bench" --throng "$THRONG" --subs "$SUBS" --messages "$MESSAGES" \
    --redis "redis://127.0.0.1:$port" | tee "$OUT/rejoin-redis.json"
fi
