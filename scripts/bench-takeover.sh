#!/usr/bin/env bash
# The takeover measurement (issue 28): N throng.v1 subscribers (default
# 10,000; N=100000 for the issue's figure, on a quiet machine) on `serve
# --history` (the embedded history; REDIS=1: through a redis-server of its
# own), a publisher at PUB_RATE/s and a prober connecting every 5 ms, then
# `serve --takeover` on the same port. Prints refused connections, messages
# lost after every subscriber rejoined with ?since=, rejoins per second, and
# when the old process was gone; the same as one JSON object in
# $OUT/takeover-<time>.json. The client is throng-bench's takeover_bench:
# the subscribers in processes of PER_PROCESS (at most 19,000: each process
# may open 20,000 files), each from a source address of its own.
# Bounded: every process it starts is stopped by its pid.
#   N=10000 SPREAD=10s PUB_RATE=20 [REDIS=1] [WORKERS=N/PER_PROCESS, at least 2] scripts/bench-takeover.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
N=${N:-10000}
SPREAD=${SPREAD:-10s}
PUB_RATE=${PUB_RATE:-20}
PER_PROCESS=${PER_PROCESS:-15000}
# A worker holds about 19,900 subscribers at 20,000 files: one per
# PER_PROCESS subscribers, at least 2.
WORKERS=${WORKERS:-$(( (N + PER_PROCESS - 1) / PER_PROCESS > 2 ? (N + PER_PROCESS - 1) / PER_PROCESS : 2 ))}
OUT=${OUT:-bench-out}
target=${CARGO_TARGET_DIR:-target}
cargo build --quiet --release -p throng
cargo build --quiet --release -p throng-bench --bin takeover_bench
mkdir -p "$OUT"
machine_line
redis=()
if [ "${REDIS:-0}" = 1 ]; then
  # A port of the ephemeral range may be some earlier connection's own
  # end still: try another when it is.
  for _ in 1 2 3 4 5; do
    REDIS_PORT=$(free_port)
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' --appendonly no \
      >"$OUT/redis.log" 2>&1 &
    REDIS_PID=$!
    trap 'kill $REDIS_PID 2>/dev/null || true' EXIT
    for _ in $(seq 50); do
      redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break 2
      kill -0 $REDIS_PID 2>/dev/null || break
      sleep 0.1
    done
  done
  if ! redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
    echo "redis-server did not answer on port $REDIS_PORT; its log:" >&2
    tail -5 "$OUT/redis.log" >&2
    exit 1
  fi
  redis=(--redis "redis://127.0.0.1:$REDIS_PORT")
fi
json="$OUT/takeover-$(date -u +%Y%m%dT%H%M%SZ).json"
printed=$(mktemp)
timeout 900 "$target/release/takeover_bench" --throng "$target/release/throng" \
  --subs "$N" --per-process "$PER_PROCESS" --pub-rate "$PUB_RATE" --spread "$SPREAD" \
  --workers "$WORKERS" --history 10000 --logdir "$OUT" --limit 300 --json "${redis[@]}" |
  tee "$printed" | grep -v '^{'
grep '^{' "$printed" >"$json"
rm -f "$printed"
echo "JSON: $json; the two servers' logs: $OUT/takeover-old.log, $OUT/takeover-new.log"
