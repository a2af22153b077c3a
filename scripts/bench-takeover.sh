#!/usr/bin/env bash
# The takeover measurement (issue 28): N subscribers (default 10,000; N=100000
# for the issue's figure, on a quiet machine) on `serve --redis --history`, a
# publisher at PUB_RATE/s, a client connecting in a loop, then `serve
# --takeover` on the same port. Prints refused connections, messages lost
# after rejoining with ?since=, rejoins per second, and when the old process
# was gone. Bounded: every process it starts is stopped by its pid.
#   N=10000 SPREAD=10s PUB_RATE=20 THRONG=target/release/throng scripts/bench-takeover.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
N=${N:-10000}
SPREAD=${SPREAD:-10s}
PUB_RATE=${PUB_RATE:-20}
THRONG=${THRONG:-target/release/throng}
machine_line
REDIS_PORT=$(free_port)
redis-server --port "$REDIS_PORT" --save '' --appendonly no >/dev/null &
REDIS_PID=$!
trap 'kill $REDIS_PID 2>/dev/null || true' EXIT
sleep 0.5
PORT=$(free_port)
SERVE="$THRONG serve --listen 127.0.0.1:$PORT --workers 2 --redis redis://127.0.0.1:$REDIS_PORT --history 10000 --drain-spread $SPREAD"
echo "N=$N SPREAD=$SPREAD PUB_RATE=$PUB_RATE/s binary=$THRONG"
timeout 300 python3 scripts/bench-takeover.py --port "$PORT" --n "$N" --pub-rate "$PUB_RATE" \
  --limit 90 --old "$SERVE" --new "$SERVE --takeover"
