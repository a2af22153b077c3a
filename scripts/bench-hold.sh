#!/usr/bin/env bash
# Benchmarks of `throng hold` against `throng serve` on this machine.
#
#   scripts/bench-hold.sh memory   client RSS per idle held connection: one
#                                  worker, N=1 vs N=18,000 (target <= 1 KiB)
#   scripts/bench-hold.sh sse      the same for Server-Sent Events subscribers
#                                  (sse://), beside WebSocket ones, same server
#   scripts/bench-hold.sh rate     connect rate (target >= 30,000/s), with the
#                                  CPU used by the harness and by the server
#   scripts/bench-hold.sh 100k     100,000 held connections, push latency
#                                  (close timeout 10 s: on 2 cores the server
#                                  answers ~50k of the 100k closes within 2 s)
#   scripts/bench-hold.sh all      all three (default)
#
# THRONG=BIN measures that binary instead of building this tree's.
#
# Every run is bounded (--duration) and stops by itself; the server is
# stopped at the end. Results (throng result files) stay in $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
what=${1:-all}
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-hold.XXXXXX)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
ulimit -n "$(ulimit -Hn)"

# THRONG=BIN measures a given binary (a before/after run), else this tree's.
if [ -n "${THRONG:-}" ]; then
  BIN=$THRONG
else
  cargo build --release -q -p throng
  BIN=$CARGO_TARGET_DIR/release/throng
fi
echo "binary: $BIN; results in $OUT"
machine_line

SERVER_PID=
start_server() { # workers ports
  local first; first=$(free_ports "$2")
  local last=$((first + $2 - 1))
  "$BIN" serve --listen "127.0.0.1:$first-$last" --workers "$1" --ping-interval 5m --json \
    > "$OUT/serve.json" 2> "$OUT/serve.log" &
  SERVER_PID=$!
  PORTS="$first-$last"
  for _ in $(seq 100); do
    if curl -sf "http://127.0.0.1:$first/healthz" >/dev/null 2>&1; then break; fi
    sleep 0.1
  done
  echo "server: pid $SERVER_PID, $1 workers, ports $PORTS"
}
stop_server() {
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}
trap stop_server EXIT

# CPU seconds (user+sys) used so far by the server supervisor and its workers.
server_cpu() {
  python3 - "$SERVER_PID" <<'EOF'
import os, sys
root = int(sys.argv[1]); hz = os.sysconf("SC_CLK_TCK"); total = 0
for pid in os.listdir("/proc"):
    if not pid.isdigit(): continue
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        continue
    f = stat[stat.rindex(")") + 2:].split()
    if int(pid) == root or int(f[1]) == root:
        total += (int(f[11]) + int(f[12])) / hz
print(f"{total:.2f}")
EOF
}

# memory_of SCHEME: one worker's RSS with 1 and with 18,000 idle held
# connections of SCHEME (ws, sse) to the running server.
memory_of() {
  local scheme=$1
  "$BIN" hold "$scheme://127.0.0.1:$PORTS/mem" -c 1 -w 1 --duration 3s -q -o "$OUT/$scheme-mem1.jsonl" > /dev/null
  "$BIN" hold "$scheme://127.0.0.1:$PORTS/mem" -c 18000 -w 1 --rate 6000/s --duration 4s -q \
    -o "$OUT/$scheme-mem18k.jsonl" > "$OUT/$scheme-mem18k.txt"
  tail -n 8 "$OUT/$scheme-mem18k.txt"
  local r1 r18
  r1=$(rss_at_plateau "$OUT/$scheme-mem1.jsonl" 1)
  r18=$(rss_at_plateau "$OUT/$scheme-mem18k.jsonl" 18000)
  echo "$scheme worker RSS: N=1 $r1 bytes, N=18000 $r18 bytes"
  python3 -c "print(f'$scheme: per idle held connection: {($r18 - $r1) / 17999:.0f} bytes (target <= 1024)')"
}

bench_memory() {
  echo; echo "== memory: one worker, N=1 then N=18000 idle held connections"
  start_server 2 1
  memory_of ws
  stop_server
}

# SSE beside WebSocket, taking turns ($SSE_ROUNDS rounds, default 2), so a
# change of the machine's load shows as a spread, not as a difference.
bench_sse() {
  echo; echo "== memory: one worker, N=1 then N=18000 idle held connections, WebSocket and SSE in turn"
  start_server 2 1
  for _ in $(seq "${SSE_ROUNDS:-2}"); do
    memory_of ws
    memory_of sse
  done
  stop_server
}

bench_rate() {
  local n=${RATE_N:-60000} rate=${RATE:-30000/s} sw=${SERVER_WORKERS:-4} hw=${HOLD_WORKERS:-4}
  echo; echo "== connect rate: $n connections at $rate against throng serve ($sw workers; hold $hw workers)"
  start_server "$sw" 4
  local before after
  before=$(server_cpu)
  "$BIN" hold "ws://127.0.0.1:$PORTS/rate" -c "$n" --rate "$rate" -w "$hw" --duration 2s --json -q \
    -o "$OUT/rate.jsonl" > "$OUT/rate.json" 2> "$OUT/rate.err" || { cat "$OUT/rate.err"; exit 1; }
  after=$(server_cpu)
  python3 - "$OUT/rate.json" "$before" "$after" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1])); before, after = float(sys.argv[2]), float(sys.argv[3])
harness = sum(v for k, v in s["cpu_ns"].items()) / 1e9
print(f"opened {s['opened']} of {s['target']}, failed {s['failed']}")
print(f"connect rate {s['connect_rate']:.0f}/s: all {s['opened']} open {s['ramp_s']:.2f}s after the schedule started")
print(f"connect latency from intended start: p50 {s['connect_us']['p50']} us, p99 {s['connect_us']['p99']} us")
print(f"harness lag behind schedule: p50 {s['connect_lag_us']['p50']} us, p99 {s['connect_lag_us']['p99']} us, max {s['connect_lag_us']['max']} us")
server = after - before
n = max(s["opened"], 1)
print(f"CPU seconds over the whole run (open, hold, close): harness {harness:.2f} (supervisor + workers), server {server:.2f}")
print(f"CPU per connection: harness {harness / n * 1e6:.0f} us, server {server / n * 1e6:.0f} us; machine: {__import__('os').cpu_count()} cores shared by both")
EOF
  stop_server
}

bench_100k() {
  local n=${BIG_N:-100000}
  echo; echo "== $n held connections, push latency"
  free -m | sed -n 2p
  start_server 6 16
  local first=${PORTS%-*}
  "$BIN" hold "ws://127.0.0.1:$PORTS/big" -c "$n" --rate 20000/s -w 6 --source-ips 127.0.0.2-127.0.0.5 \
    --duration 10s --publish "http://127.0.0.1:$first/publish/big" --publish-rate 1/s --message-size 128 \
    --close-timeout 10s \
    -o "$OUT/100k.jsonl" > "$OUT/100k.txt" 2>&1 || true
  tail -n 14 "$OUT/100k.txt"
  free -m | sed -n 2p
  stop_server
}

case "$what" in
  memory) bench_memory ;;
  sse) bench_sse ;;
  rate) bench_rate ;;
  100k) bench_100k ;;
  all) bench_memory; bench_rate; bench_100k ;;
  *) echo "usage: $0 [memory|sse|rate|100k|all]" >&2; exit 2 ;;
esac
