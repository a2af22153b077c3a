#!/usr/bin/env bash
# Memory per held MQTT connection in `throng hold`, beside a held WebSocket
# connection, measured the same way (one worker, its RSS with N=1 and with
# N idle connections open; bench-hold.sh's method):
#
#   MQTT      against Mosquitto (the Debian package), QoS 0 and QoS 1
#   WebSocket against throng serve
#
#   scripts/bench-mqtt-hold.sh [N]     N idle connections (default 18000)
#
# Connections open at $RATE (default 500/s): Mosquitto accepts with a listen
# backlog of 100, and on a busy machine a faster ramp has thousands of
# connections waiting for it at once; the heap that costs the harness stays
# fragmented after the ramp and shows as ~50 more bytes per connection that
# are not the connection's. The connect line of each run is printed, so a
# slow ramp shows.
#
# Every run is bounded (--duration) and the broker and server are stopped
# at the end. Results (throng result files) stay in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
N=${1:-18000}
RATE=${RATE:-500/s}
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-mqtt.XXXXXX)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
ulimit -n "$(ulimit -Hn)"
command -v mosquitto >/dev/null || { echo "needs mosquitto (apt-get install mosquitto)" >&2; exit 2; }

cargo build --release -q -p throng
BIN=$CARGO_TARGET_DIR/release/throng
echo "binary: $BIN; results in $OUT"
machine_line

PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done; }
trap stop_all EXIT

MQTT_PORT=$(free_port)
cat > "$OUT/mosquitto.conf" <<EOF
listener $MQTT_PORT 127.0.0.1
allow_anonymous true
persistence false
user root
max_connections -1
log_dest file $OUT/mosquitto.log
EOF
mosquitto -c "$OUT/mosquitto.conf" &
PIDS+=($!)
WS_PORT=$(free_port)
"$BIN" serve --listen "127.0.0.1:$WS_PORT" --workers 1 --ping-interval 5m --json \
  > "$OUT/serve.json" 2> "$OUT/serve.log" &
PIDS+=($!)
for _ in $(seq 100); do
  if curl -sf "http://127.0.0.1:$WS_PORT/healthz" >/dev/null 2>&1 \
    && python3 -c "import socket; socket.create_connection(('127.0.0.1', $MQTT_PORT))" 2>/dev/null; then
    break
  fi
  sleep 0.1
done
echo "mosquitto on $MQTT_PORT ($(mosquitto -h | head -1)), throng serve on $WS_PORT"

# per_connection NAME URL [hold args...]: worker RSS at N=1 and at N, and the difference per connection.
per_connection() {
  local name=$1 url=$2; shift 2
  "$BIN" hold "$url" -c 1 -w 1 --duration 3s -q -o "$OUT/$name-1.jsonl" "$@" > /dev/null
  "$BIN" hold "$url" -c "$N" -w 1 --rate "$RATE" --duration 4s -q -o "$OUT/$name-n.jsonl" "$@" \
    > "$OUT/$name-n.txt"
  grep 'from actual start' "$OUT/$name-n.txt"
  local r1 rn
  r1=$(rss_at_plateau "$OUT/$name-1.jsonl" 1)
  rn=$(rss_at_plateau "$OUT/$name-n.jsonl" "$N")
  python3 -c "print(f'$name: worker RSS N=1 $r1 B, N=$N $rn B: {($rn - $r1) / ($N - 1):.0f} bytes per held connection')"
}

echo; echo "== memory per idle held connection, one worker, N=$N, opened at $RATE"
per_connection websocket "ws://127.0.0.1:$WS_PORT/mem"
per_connection mqtt-qos0 "mqtt://127.0.0.1:$MQTT_PORT/mem"
per_connection mqtt-qos1 "mqtt://127.0.0.1:$MQTT_PORT/mem" --qos 1
