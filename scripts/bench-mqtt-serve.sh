#!/usr/bin/env bash
# What an idle MQTT subscriber costs `throng serve`, beside what it costs
# Mosquitto and what a WebSocket subscriber costs throng (issue 16's
# benchmark). In the same run, one server process each:
#
#   mosquitto     Debian's Mosquitto, MQTT subscribers
#   throng-ws     throng serve --workers 1, WebSocket subscribers
#   throng-mqtt   throng serve --workers 1 --mqtt-listen, MQTT subscribers
#                 (left out, saying so, when this binary has no --mqtt-listen)
#
#   scripts/bench-mqtt-serve.sh [N]     N idle subscribers (default 18000)
#   SESSIONS=1 scripts/bench-mqtt-serve.sh [N]
#                                       N idle persistent sessions instead
#                                       (mosquitto and throng-mqtt only)
#
# THRONG=path measures that binary instead of building this tree's (for a
# before/after: run it with each in turn); SERVERS="throng-ws throng-mqtt"
# measures only those.
#
# Each round starts each server afresh (the order turns each round), holds N
# subscribers on one channel with `throng hold` (one process, no keep-alive
# and no WebSocket pings, so idle means idle) and measures:
#
#   bytes/conn   the server's RSS (every process of it) with N held, minus
#                its RSS before the first one, over N
#   ns/delivery  the server's CPU time (user + system, every thread, from
#                /proc/PID/task/*/sched, nanosecond exact) around one
#                64-byte publish to all N, less its idle CPU over as long
#                (measured just before), over the deliveries
#   last ms      from just before the publish call to the last subscriber's
#                arrival: the held subscribers' largest delivery latency
#
# The publish comes from a second `throng hold` with one subscriber of its
# own (so N + 1 deliveries): over MQTT for Mosquitto; over HTTP POST
# /publish for both throng columns, so those two differ only in the
# subscribers' protocol (PUBLISH_MQTT=1: throng-mqtt publishes over MQTT
# too). The figures are the medians of $ROUNDS rounds (default 3), then the
# ratios the issue sets targets for: throng-mqtt over throng-ws (within
# 1.2) and over mosquitto (below 1).
#
# SESSIONS=1: the N held clients are `throng hold --mqtt-sessions N`
# clients (3.1.1 clean session 0, one subscription at QoS $QOS, default 1),
# online for the whole hold (--mqtt-session-online 1000h) and idle, plus one
# plain subscriber: bytes/conn is then the memory of one idle persistent
# session with its connection (over N), and the publish reaches N + 2 at
# QoS $QOS over MQTT. Mosquitto keeps its sessions in memory too
# (persistence false: nothing is written to disk by either).
#
# Every run is bounded and every server is stopped at the end. Result files
# and logs stay in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
N=${1:-18000}
ROUNDS=${ROUNDS:-3}
RATE=${RATE:-1000/s}
# QOS=1 or 2: MQTT subscribers subscribe at that QoS and the publish goes
# at it over MQTT (to throng's --mqtt-listen too: an HTTP publish is QoS 1),
# so the columns are the QoS 1/2 fan-out with every PUBACK, or PUBREC,
# PUBREL and PUBCOMP; WebSocket has no QoS: no throng-ws column then.
# The CPU window ends when the publisher's hold has its PUBCOMP: the last
# subscribers' PUBCOMPs may come after it (hold counts a QoS 2 message at
# PUBREC), so ns/delivery leaves out a little of the tail, on both servers.
SESSIONS=${SESSIONS:-0}
if [ "$SESSIONS" = 1 ]; then
  # A broker keeps no QoS 0 message for a session: sessions subscribe at 1.
  QOS=${QOS:-1}
  [ "$QOS" != 0 ] || { echo "SESSIONS=1 needs QOS 1 or 2" >&2; exit 2; }
fi
QOS=${QOS:-0}
# How long the big hold stays once all N are open: covers the settle, the
# idle window and the publish.
HOLD_FOR=${HOLD_FOR:-15s}
IDLE_WINDOW=${IDLE_WINDOW:-2}
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-mqtt-serve.XXXXXX)}
mkdir -p "$OUT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
ulimit -n "$(ulimit -Hn)"
command -v mosquitto >/dev/null || { echo "needs mosquitto (apt-get install mosquitto)" >&2; exit 2; }
[ "$N" -lt 19000 ] || { echo "N must stay under 19000: one process holds them all (20,000-file limit)" >&2; exit 2; }

if [ -n "${THRONG:-}" ]; then
  BIN=$THRONG
else
  cargo build --release -q -p throng
  BIN=$CARGO_TARGET_DIR/release/throng
fi
TARGETS=(mosquitto throng-ws)
if "$BIN" serve --help | grep -q -- '--mqtt-listen'; then
  TARGETS+=(throng-mqtt)
else
  echo "note: $BIN has no --mqtt-listen yet: no throng-mqtt column"
fi
if [ -n "${SERVERS:-}" ]; then
  read -ra TARGETS <<< "$SERVERS"
fi
if [ "$SESSIONS" = 1 ]; then
  echo "SESSIONS=1: N idle persistent sessions (clean session 0, one subscription each)"
fi
if [ "$QOS" != 0 ]; then
  PUBLISH_MQTT=1
  read -ra TARGETS <<< "${TARGETS[*]/throng-ws/}"
  echo "QoS $QOS: subscriptions and the publish at QoS $QOS over MQTT (no throng-ws column)"
fi
echo "binary: $BIN ($(git rev-parse --short HEAD)); mosquitto: $(mosquitto -h | head -1)"
echo "N=$N, opened at $RATE, $ROUNDS rounds; results in $OUT"
machine_line

SERVER=""
stop_server() {
  if [ -n "$SERVER" ]; then
    kill -TERM "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    SERVER=""
  fi
}
trap stop_server EXIT

# The server's processes: the one started and its children (throng's workers).
server_pids() { echo "$SERVER"; ps -o pid= --ppid "$SERVER" || true; }
rss_bytes() {
  for p in $(server_pids); do awk '/^VmRSS:/ {print $2}' "/proc/$p/status" 2>/dev/null; done |
    awk '{s += $1} END {printf "%.0f\n", s * 1024}'
}
# On-CPU time of every thread, from the scheduler's own sum in ms with
# ns decimals (/proc/PID/stat's ticks are 10 ms: too coarse for one publish).
cpu_ns() {
  for p in $(server_pids); do cat /proc/"$p"/task/*/sched 2>/dev/null; done |
    awk '/^se.sum_exec_runtime/ {s += $3} END {printf "%.0f\n", s * 1e6}'
}
now_ns() { date +%s%N; }
established() { ss -Htn state established "( sport = :$1 )" | wc -l; }
wait_port() {
  for _ in $(seq 200); do
    python3 -c "import socket; socket.create_connection(('127.0.0.1', $1)).close()" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on $1" >&2
  return 1
}

# start TARGET: starts its server; sets SUB_URL, PUB_URL and PORT (where subscribers connect).
start() {
  local dir=$OUT/$1-round$round
  mkdir -p "$dir"
  case $1 in
    mosquitto)
      PORT=$(free_port)
      cat > "$dir/mosquitto.conf" <<EOF
listener $PORT 127.0.0.1
allow_anonymous true
persistence false
user root
max_connections -1
log_dest file $dir/mosquitto.log
EOF
      mosquitto -c "$dir/mosquitto.conf" 2> "$dir/mosquitto.err" &
      SERVER=$!
      SUB_URL=mqtt://127.0.0.1:$PORT/bench
      PUB_URL=mqtt://127.0.0.1:$PORT/bench
      ;;
    throng-ws | throng-mqtt)
      local http mqtt
      http=$(free_port)
      mqtt=$(free_port)
      local args=(serve --listen "127.0.0.1:$http" --workers 1 --ping-interval 10m --json)
      [[ " ${TARGETS[*]} " == *" throng-mqtt "* ]] && args+=(--mqtt-listen "127.0.0.1:$mqtt")
      "$BIN" "${args[@]}" > "$dir/serve.json" 2> "$dir/serve.log" &
      SERVER=$!
      wait_port "$http"
      PUB_URL=http://127.0.0.1:$http/publish/bench
      if [ "$1" = throng-ws ]; then
        PORT=$http
        SUB_URL=ws://127.0.0.1:$http/bench
      else
        PORT=$mqtt
        SUB_URL=mqtt://127.0.0.1:$mqtt/bench
        [ "${PUBLISH_MQTT:-0}" = 1 ] && PUB_URL=mqtt://127.0.0.1:$mqtt/bench
      fi
      ;;
  esac
  wait_port "$PORT"
}

# measure TARGET: one round of one server; appends a JSON line to $OUT/runs.jsonl.
measure() {
  local t=$1 dir=$OUT/$1-round$round
  start "$t"
  # Let the server finish starting (workers, allocator) before the baseline.
  sleep 1
  local rss0 rss1
  rss0=$(rss_bytes)
  # No keep-alive: PINGREQs would be work while idle (WebSocket pings are off too).
  local mqtt=()
  [[ $SUB_URL == mqtt://* ]] && mqtt=(--mqtt-keepalive 0)
  [ "$QOS" != 0 ] && mqtt+=(--qos "$QOS")
  # The held clients: N subscribers, or one and N persistent sessions.
  local held=(-c "$N") want=$N
  if [ "$SESSIONS" = 1 ]; then
    # hold spreads the first departures over one online time (client k
    # leaves after k/N of it): 1000h keeps all N online for the run.
    held=(-c 1 --mqtt-sessions "$N" --mqtt-session-online 1000h --mqtt-session-expiry 1h)
    want=$((N + 1))
  fi
  "$BIN" hold "$SUB_URL" "${held[@]}" -w 1 --rate "$RATE" --duration "$HOLD_FOR" \
    "${mqtt[@]}" --json -q -o "$dir/hold.jsonl" > "$dir/hold.json" 2> "$dir/hold.err" &
  local hold=$!
  local waited=0
  while [ "$(established "$PORT")" -lt "$want" ]; do
    sleep 0.5
    waited=$((waited + 1))
    if ! kill -0 "$hold" 2>/dev/null || [ "$waited" -gt 600 ]; then
      echo "$t: the $N subscribers did not all connect; see $dir" >&2
      kill "$hold" 2>/dev/null || true
      wait "$hold" 2>/dev/null || true
      stop_server
      return 1
    fi
  done
  sleep 2
  rss1=$(rss_bytes)
  # Idle CPU over a window as long as the publish's, then the publish.
  local c0 c1 c2 c3 t0 t1 t2 t3
  t0=$(now_ns); c0=$(cpu_ns)
  sleep "$IDLE_WINDOW"
  t1=$(now_ns); c1=$(cpu_ns)
  t2=$(now_ns); c2=$(cpu_ns)
  "$BIN" hold "$SUB_URL" -c 1 -w 1 "${mqtt[@]}" --publish "$PUB_URL" --messages 1 \
    --message-size 64 --json -q > "$dir/publisher.json" 2> "$dir/publisher.err"
  t3=$(now_ns); c3=$(cpu_ns)
  wait "$hold" || true
  stop_server
  python3 - "$t" "$round" "$N" "$rss0" "$rss1" "$c0" "$c1" "$t0" "$t1" "$c2" "$c3" "$t2" "$t3" \
    "$dir/hold.json" "$dir/publisher.json" >> "$OUT/runs.jsonl" <<'EOF'
import json, sys
t, rnd, n, rss0, rss1, c0, c1, t0, t1, c2, c3, t2, t3 = sys.argv[1:2] + [int(a) for a in sys.argv[2:14]]
hold, pub = (json.load(open(p)) for p in sys.argv[14:16])
idle_per_ns = (c1 - c0) / (t1 - t0)
# SESSIONS=1: the N are the session clients (the one plain subscriber
# beside them is left out of the counts it would blur).
s = hold.get("sessions") or {}
if s.get("clients"):
    # connects counts a client's retries too (a full listen backlog).
    opened, received, lost = min(s["connects"], s["clients"]), s["received"], s["lost"]
    last_us = max(hold["delivery_us"]["max"], s["delivery_us"]["max"])
    delivered = s["received"] + hold["received"] + pub["received"]
else:
    opened, received, lost = hold["opened"], hold["received"], hold["lost"]
    last_us = hold["delivery_us"]["max"]
    delivered = hold["received"] + pub["received"]
busy = (c3 - c2) - idle_per_ns * (t3 - t2)
print(json.dumps({
    "target": t, "round": rnd, "n": n, "opened": opened,
    "received": received, "lost": lost,
    "bytes_per_conn": round((rss1 - rss0) / n, 1),
    "ns_per_delivery": round(busy / max(delivered, 1), 1),
    "last_ms": round(last_us / 1000, 2),
    "idle_cpu_ms_per_s": round(idle_per_ns * 1000, 3),
    "connect_p50_ms": round(hold["connect_us"]["p50"] / 1000, 2),
}))
EOF
  tail -1 "$OUT/runs.jsonl"
}

for round in $(seq "$ROUNDS"); do
  # Turn the order each round, so no server always runs first.
  order=("${TARGETS[@]:$(( (round - 1) % ${#TARGETS[@]} ))}" "${TARGETS[@]:0:$(( (round - 1) % ${#TARGETS[@]} ))}")
  for t in "${order[@]}"; do
    # A busy machine can overflow a listen backlog (Mosquitto's is 100):
    # once more, then give up.
    measure "$t" || { echo "round $round, $t: once more"; measure "$t"; }
  done
done

what="idle subscribers"
[ "$SESSIONS" = 1 ] && what="idle persistent sessions (QoS $QOS)"
echo; echo "== medians of $ROUNDS rounds, N=$N $what"
python3 - "$OUT/runs.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
keys = ["bytes_per_conn", "ns_per_delivery", "last_ms"]
med = {}
for t in ["mosquitto", "throng-ws", "throng-mqtt"]:
    rs = [r for r in runs if r["target"] == t]
    if not rs:
        continue
    med[t] = {k: statistics.median(r[k] for r in rs) for k in keys}
    bad = [r["round"] for r in rs if r["received"] != r["n"] or r["opened"] != r["n"]]
    note = f"  (rounds {bad}: not every subscriber had the message)" if bad else ""
    print(f"{t:12} {med[t]['bytes_per_conn']:8.0f} B/conn {med[t]['ns_per_delivery']:8.0f} ns/delivery "
          f"{med[t]['last_ms']:8.1f} ms to the last{note}")
if "throng-mqtt" in med:
    m = med["throng-mqtt"]
    for other, target in [("throng-ws", "<= 1.2"), ("mosquitto", "< 1")]:
        if other in med:
            o = med[other]
            ratios = "  ".join(f"{k} {m[k] / o[k]:.2f}" if o[k] else f"{k} -" for k in keys)
            print(f"throng-mqtt / {other:10} {ratios}   (target {target})")
print(json.dumps({"medians": med}))
EOF
