#!/usr/bin/env bash
# Benchmarks of `throng serve --redis` against the embedded relay, on this
# machine (issue 4). Everything runs on loopback: one redis-server, one node.
#
#   scripts/bench-redis.sh latency     publish -> delivery latency (p50, p99) at
#                                      18,000 subscribers on one node (and at 100):
#                                      embedded relay vs Redis (publish through the
#                                      node's HTTP API, and PUBLISH straight to
#                                      Redis), alternating rounds, medians and differences
#   scripts/bench-redis.sh throughput  messages/s one node takes from Redis and
#                                      fans out to 1,000 subscribers over 10
#                                      channels, pattern vs channels mode; then
#                                      the same with as much traffic again on 10
#                                      channels nobody on the node subscribes to
#   scripts/bench-redis.sh all         both (default)
#
# Every run is bounded (--duration, message counts, timeouts) and stops by
# itself; redis-server and the node are stopped at the end. Raw results stay
# in $OUT. Knobs: ROUNDS (3), LAT_N (18000), MESSAGES (30000).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
what=${1:-all}
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-redis.XXXXXX)}
ROUNDS=${ROUNDS:-3}
LAT_N=${LAT_N:-18000}
MESSAGES=${MESSAGES:-30000}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
ulimit -n "$(ulimit -Hn)"
for p in redis-server redis-cli redis-benchmark curl python3; do
  command -v "$p" >/dev/null || { echo "$p is missing: scripts/test.sh installs it" >&2; exit 1; }
done

cargo build --release -q -p throng
BIN=$CARGO_TARGET_DIR/release/throng
echo "binary: $BIN; results in $OUT"
machine_line
echo "$(redis-server --version | cut -d' ' -f1-3)"

REDIS_PID= SERVER_PID= HOLD_PIDS=()
cleanup() {
  for p in "${HOLD_PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  [ -n "$REDIS_PID" ] && kill "$REDIS_PID" 2>/dev/null && wait "$REDIS_PID" 2>/dev/null || true
  SERVER_PID= REDIS_PID=
}
trap cleanup EXIT

start_redis() {
  REDIS_PORT=$(free_port)
  # A large pub/sub output buffer: a node that falls behind is measured, not disconnected.
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no \
    --client-output-buffer-limit "pubsub 512mb 256mb 60" > "$OUT/redis.log" &
  REDIS_PID=$!
  for _ in $(seq 100); do
    [ "$(redis-cli -p "$REDIS_PORT" PING 2>/dev/null)" = PONG ] && return
    sleep 0.05
  done
  echo "redis-server did not start" >&2; exit 1
}

start_server() { # extra serve flags...
  PORT=$(free_port)
  "$BIN" serve --listen "127.0.0.1:$PORT" --workers 2 --ping-interval 5m --json "$@" \
    > "$OUT/serve.json" 2> "$OUT/serve.log" &
  SERVER_PID=$!
  for _ in $(seq 200); do
    local h
    if h=$(curl -sf "http://127.0.0.1:$PORT/healthz" 2>/dev/null) && ! grep -q "broker: down" <<< "$h"; then return; fi
    sleep 0.05
  done
  echo "server did not come up:"; cat "$OUT/serve.log"; exit 1
}
stop_server() {
  kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}

metric() { # name
  curl -s "http://127.0.0.1:$PORT/metrics" | awk -v n="$1" '$1 == n {print $2}'
}

latency_pass() { # subscribers publish-rate tag
  local n=$1 prate=$2 tag=$3
  echo; echo "== latency: $n subscribers on one node (2 workers), $prate publishes of 64 bytes for 10 s, $ROUNDS rounds"
  local round kind
  for round in $(seq "$ROUNDS"); do
    for kind in local redis-http redis-direct; do
      if [ "$kind" = local ]; then start_server; else start_server --redis "redis://127.0.0.1:$REDIS_PORT"; fi
      local pub="http://127.0.0.1:$PORT/publish/lat"
      [ "$kind" = redis-direct ] && pub="redis://127.0.0.1:$REDIS_PORT"
      "$BIN" hold "ws://127.0.0.1:$PORT/lat" -c "$n" --rate 6000/s -w 2 --duration 10s \
        --publish "$pub" --publish-rate "$prate" --message-size 64 --close-timeout 10s --json -q \
        -o "$OUT/lat$tag-$kind-$round.jsonl" > "$OUT/lat$tag-$kind-$round.json" 2> "$OUT/lat$tag-$kind-$round.err" || {
        echo "hold failed:"; tail "$OUT/lat$tag-$kind-$round.err"; exit 1; }
      stop_server
      python3 - "$OUT/lat$tag-$kind-$round.json" "$kind" "$round" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1])); d = s["delivery_us"]
print(f"round {sys.argv[3]} {sys.argv[2]:>12}: opened {s['opened']}, published {s['published']}, "
      f"received {s['received']}, lost {s['lost']}, duplicated {s['duplicated']}; "
      f"delivery p50 {d['p50']} us, p99 {d['p99']} us")
EOF
    done
  done
  python3 - "$OUT" "$ROUNDS" "$tag" <<'EOF'
import json, statistics, sys
out, rounds, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
med = {}
for kind in ("local", "redis-http", "redis-direct"):
    runs = [json.load(open(f"{out}/lat{tag}-{kind}-{r}.json")) for r in range(1, rounds + 1)]
    med[kind] = {q: statistics.median(r["delivery_us"][q] for r in runs) for q in ("p50", "p99")}
    print(f"median of {rounds} rounds {kind:>12}: p50 {med[kind]['p50']:.0f} us, p99 {med[kind]['p99']:.0f} us")
for kind in ("redis-http", "redis-direct"):
    for q in ("p50", "p99"):
        extra = med[kind][q] - med["local"][q]
        print(f"extra latency through Redis ({kind}) {q}: {extra:+.0f} us "
              f"(x{med[kind][q] / max(med['local'][q], 1):.2f} the embedded relay)")
EOF
}

# 18,000 subscribers at 2 publishes/s: well under what the machine can fan
# out, so this is the path plus one fan-out, not a queue. Then 100
# subscribers at 20/s, where the fan-out is small and the Redis hop shows.
bench_latency() {
  start_redis
  latency_pass "$LAT_N" 2/s ""
  latency_pass 100 20/s -small
  kill "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true; REDIS_PID=
}

# Starts 10 hold processes, 100 subscribers each on channels c000000000000..9
# (the names redis-benchmark's -r 10 __rand_int__ produces).
hold_subscribers() {
  HOLD_PIDS=()
  local k
  for k in $(seq 0 9); do
    "$BIN" hold "ws://127.0.0.1:$PORT/c00000000000$k" -c 100 -w 1 --rate 2000/s --duration 180s \
      --json -q > "$OUT/sub-$1-$k.json" 2> "$OUT/sub-$1-$k.err" &
    HOLD_PIDS+=($!)
  done
  for _ in $(seq 300); do
    [ "$(metric throng_connections_open)" = 1000 ] && return
    sleep 0.1
  done
  echo "subscribers did not connect"; exit 1
}

# Publishes $MESSAGES to Redis over $1 channels as fast as redis-benchmark
# goes, then waits until the node has taken and delivered all it will.
# Prints: taken/s, delivered/s, frames/s, publisher/s.
blast() { # channels
  local r0 f0
  r0=$(metric throng_broker_messages_received_total); f0=$(metric throng_frames_delivered_total)
  python3 - "$PORT" "$REDIS_PORT" "$MESSAGES" "$1" "$r0" "$f0" <<'EOF'
import subprocess, sys, time, urllib.request
port, rport, n, chans, r0, f0 = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], float(sys.argv[5]), float(sys.argv[6])
def metrics():
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    m = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}
    return m["throng_broker_messages_received_total"] - r0, m["throng_frames_delivered_total"] - f0
payload = "x" * 64
start = time.monotonic()
pub = subprocess.run(["redis-benchmark", "-p", rport, "-n", str(n), "-c", "4", "-P", "64", "-r", chans, "-q",
                      "PUBLISH", "throng:c__rand_int__", payload], capture_output=True, text=True, timeout=120)
pub_s = time.monotonic() - start
last, last_change = (0, 0), time.monotonic()
while time.monotonic() - start < 120:
    cur = metrics()
    now = time.monotonic()
    if cur != last:
        last, last_change = cur, now
    elif now - last_change > 1.5:
        break
    time.sleep(0.05)
took = last_change - start
taken, frames = last
print(f"{taken / took:.0f} {frames / 100 / took:.0f} {frames / took:.0f} {n / pub_s:.0f} {taken:.0f} {frames:.0f} {took:.2f}")
EOF
}

# The embedded relay's figure for comparison: wrk POSTs to random channels
# of the 10 (8 connections, each waits for its publish to be delivered).
local_baseline() {
  cat > "$OUT/publish.lua" <<'LUA'
wrk.method = "POST"
wrk.body = string.rep("x", 64)
request = function()
  return wrk.format(nil, "/publish/c00000000000" .. math.random(0, 9))
end
LUA
  local p0 f0 t0 t1 p1 f1
  p0=$(metric throng_messages_published_total); f0=$(metric throng_frames_delivered_total)
  t0=$(date +%s.%N)
  wrk -t1 -c8 -d6s -s "$OUT/publish.lua" "http://127.0.0.1:$PORT" > "$OUT/wrk.txt"
  t1=$(date +%s.%N)
  sleep 1
  p1=$(metric throng_messages_published_total); f1=$(metric throng_frames_delivered_total)
  python3 -c "
p, f, t = $p1 - $p0, $f1 - $f0, $t1 - $t0
print(f'local    10 channels published: node took {p / t:6.0f} msg/s over HTTP, delivered {p / t:6.0f} msg/s = {f / t:7.0f} frames/s ({p:.0f} published, {f:.0f} frames in {t:.2f}s; wrk, 8 connections)')"
}

bench_throughput() {
  echo; echo "== throughput: one node (2 workers), 1,000 subscribers over 10 channels, $MESSAGES messages of 64 bytes blasted into Redis"
  start_redis
  local mode chans line
  if command -v wrk >/dev/null; then
    start_server
    hold_subscribers local
    local_baseline
    for p in "${HOLD_PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done
    for p in "${HOLD_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    HOLD_PIDS=()
    stop_server
  fi
  for chans in 10 20; do
    for mode in pattern channels; do
      start_server --redis "redis://127.0.0.1:$REDIS_PORT" --redis-mode "$mode"
      hold_subscribers "$mode-$chans"
      line=$(blast "$chans")
      read -r taken delivered frames pubrate ntaken nframes took <<< "$line"
      printf '%-8s %2s channels published: node took %6s msg/s from Redis, delivered %6s msg/s = %7s frames/s (%s taken, %s frames in %ss; redis-benchmark published %s/s)\n' \
        "$mode" "$chans" "$taken" "$delivered" "$frames" "$ntaken" "$nframes" "$took" "$pubrate"
      echo "$mode $chans $line" >> "$OUT/throughput.txt"
      curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^throng_(broker|slow_consumer|connections_open)' > "$OUT/metrics-$mode-$chans.txt"
      for p in "${HOLD_PIDS[@]}"; do kill -INT "$p" 2>/dev/null || true; done
      for p in "${HOLD_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
      HOLD_PIDS=()
      stop_server
    done
  done
  echo "(10 channels: every message has 100 subscribers on the node; 20 channels: half of them have none here."
  echo " Pattern mode receives those too and drops them after a relay; channels mode never sees them.)"
  kill "$REDIS_PID"; wait "$REDIS_PID" 2>/dev/null || true; REDIS_PID=
}

case "$what" in
  latency) bench_latency ;;
  throughput) bench_throughput ;;
  all) bench_latency; bench_throughput ;;
  *) echo "usage: $0 [latency|throughput|all]" >&2; exit 2 ;;
esac
