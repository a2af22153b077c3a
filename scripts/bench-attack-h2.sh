#!/usr/bin/env bash
# Benchmark of `throng attack --http2` on this machine, loopback only:
# HAProxy (Debian's) as the HTTP/2 front end in front of `throng serve`'s
# /ping, the generator, HAProxy and the server sharing the cores.
#
#   scripts/bench-attack-h2.sh               build (release) and run
#   THRONG=path/to/throng scripts/bench-attack-h2.sh
#   BEFORE=path/to/older/throng scripts/bench-attack-h2.sh   adds section 3
#   SECS=5 CONNS=64 STREAMS=16 SLEEP_SECS=10 scripts/bench-attack-h2.sh
#
# 1. Most requests/s through HAProxy, HTTP/2 against HTTP/1.1, the same
#    requests in flight: `--max --connections CONNS` over HTTP/1.1 (HAProxy's
#    plain bind) and `--http2 --max --connections CONNS/STREAMS --max-streams
#    STREAMS` (its `proto h2` bind), three rounds alternating; req/s and
#    requests per CPU-second of the generator (steadier on a busy box).
# 2. The generator's memory per HTTP/2 stream in flight (target: < 1 KiB):
#    1,000 requests/s with `sleep: 5000` (/ping waits up to 5 s: about 2,500
#    in flight) over HTTP/2, its worker's peak RSS minus that of the same run
#    without sleep, over the peak number of requests in flight.
# 3. (with BEFORE=) the HTTP/1.1 path unchanged: `--max` straight at the
#    server with the BEFORE binary and this one, three rounds alternating.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh

SECS=${SECS:-5}
CONNS=${CONNS:-64}
STREAMS=${STREAMS:-16}
SLEEP_SECS=${SLEEP_SECS:-10}

if [ -z "${THRONG:-}" ]; then
  cargo build --release -q -p throng
  THRONG="${CARGO_TARGET_DIR:-target}/release/throng"
fi
for tool in haproxy jq; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed (apt-get install $tool)" >&2; exit 1; }
done

tmp=$(mktemp -d)
server_pid=""
proxy_pid=""
cleanup() {
  [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null && wait "$proxy_pid" 2>/dev/null
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

machine_line
"$THRONG" serve --listen 127.0.0.1:0 --workers 1 --json >"$tmp/serve.json" 2>"$tmp/serve.err" &
server_pid=$!
for _ in $(seq 100); do
  [ -s "$tmp/serve.json" ] && break
  sleep 0.1
done
backend=$(jq -r '.listen[0]' <"$tmp/serve.json")
h1_port=$(free_port)
h2_port=$(free_port)
cat >"$tmp/haproxy.cfg" <<EOF
global
  maxconn 8000
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend h1
  bind 127.0.0.1:$h1_port
  default_backend app
frontend h2
  bind 127.0.0.1:$h2_port proto h2
  default_backend app
backend app
  server s1 $backend
EOF
haproxy -c -q -f "$tmp/haproxy.cfg"
haproxy -db -f "$tmp/haproxy.cfg" >"$tmp/haproxy.log" 2>&1 &
proxy_pid=$!
h1="http://127.0.0.1:$h1_port/ping"
h2="http://127.0.0.1:$h2_port/ping"
for _ in $(seq 100); do
  curl -sf "$h1" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf --http2-prior-knowledge "$h2" >/dev/null || { echo "HAProxy does not answer h2c on $h2:" >&2; cat "$tmp/haproxy.log" >&2; exit 1; }
echo "throng serve (1 worker) at $backend behind HAProxy $(haproxy -v | awk 'NR == 1 {print $3}'): HTTP/1.1 on $h1_port, h2c on $h2_port"

# Runs `throng attack ARGS --format json -q` under /usr/bin/time: prints
# "req/s req-per-CPU-s errors".
run() {
  local bin=$1
  shift
  /usr/bin/time -f "%U %S" -o "$tmp/time" timeout $((SECS + 60)) "$bin" attack "$@" \
    --workers 1 --duration "${SECS}s" --format json -q >"$tmp/run.json" 2>/dev/null
  local t n cpu errs
  t=$(jq '.throughput' <"$tmp/run.json")
  n=$(jq '.requests' <"$tmp/run.json")
  cpu=$(awk '{print $1 + $2}' "$tmp/time")
  errs=$(jq '[.errors[]] | add // 0' <"$tmp/run.json")
  echo "$t $(awk -v n="$n" -v c="$cpu" 'BEGIN {print n / c}') $errs"
}

# Three rounds alternating `A` and `B` (each: a label and its arguments after
# a `--`); prints each round and the medians.
compare() {
  local label_a=$1 label_b=$2
  shift 2
  local -a args_a=() args_b=()
  while [ "$1" != "--" ]; do args_a+=("$1"); shift; done
  shift
  args_b=("$@")
  : >"$tmp/a.txt"
  : >"$tmp/b.txt"
  for round in 1 2 3; do
    read -r t e x < <(run "${args_a[@]}")
    printf '  round %s  %-44s %8.0f req/s, %8.0f req per CPU-s (errors %s)\n' "$round" "$label_a" "$t" "$e" "$x"
    echo "$t $e" >>"$tmp/a.txt"
    read -r t e x < <(run "${args_b[@]}")
    printf '  round %s  %-44s %8.0f req/s, %8.0f req per CPU-s (errors %s)\n' "$round" "$label_b" "$t" "$e" "$x"
    echo "$t $e" >>"$tmp/b.txt"
  done
  local ra rb ea eb
  ra=$(awk '{print $1}' "$tmp/a.txt" | median)
  rb=$(awk '{print $1}' "$tmp/b.txt" | median)
  ea=$(awk '{print $2}' "$tmp/a.txt" | median)
  eb=$(awk '{print $2}' "$tmp/b.txt" | median)
  awk -v a="$ra" -v b="$rb" -v la="$label_a" -v lb="$label_b" \
    'BEGIN {printf "  median req/s: %s %.0f, %s %.0f, ratio %.2f\n", lb, b, la, a, b / a}'
  awk -v a="$ea" -v b="$eb" -v la="$label_a" -v lb="$label_b" \
    'BEGIN {printf "  median req per CPU-s: %s %.0f, %s %.0f, ratio %.2f\n", lb, b, la, a, b / a}'
}

h2_conns=$(( (CONNS + STREAMS - 1) / STREAMS ))
echo
echo "== 1. most requests/s through HAProxy, $CONNS requests in flight, ${SECS}s per run, 3 rounds alternating"
compare "HTTP/1.1 --max --connections $CONNS" "HTTP/2 --max --connections $h2_conns --max-streams $STREAMS" \
  "$THRONG" --url "$h1" --max --connections "$CONNS" -- \
  "$THRONG" --url "$h2" --http2 --max --connections "$h2_conns" --max-streams "$STREAMS"

echo
echo "== 2. memory per HTTP/2 stream in flight: 1000 req/s with 'sleep: 5000' for ${SLEEP_SECS}s"
timeout $((SLEEP_SECS + 60)) "$THRONG" attack --url "$h2" --http2 --rate 1000/s --duration "${SLEEP_SECS}s" \
  --workers 1 --timeout 30s --format json -q >"$tmp/base.json" 2>/dev/null
timeout $((SLEEP_SECS + 60)) "$THRONG" attack --url "$h2" --http2 -H 'sleep: 5000' --rate 1000/s \
  --duration "${SLEEP_SECS}s" --workers 1 --timeout 30s --format json -q >"$tmp/sleep.json" 2>/dev/null
worker_rss='.peak_rss_bytes | to_entries[] | select(.key | endswith("attack-0")) | .value'
jq -r "\"  without sleep: \(.requests) requests, rate \(.rate | floor)/s, peak in flight \(.peak_in_flight), connections \(.connections_opened), worker peak RSS \($worker_rss) bytes\"" <"$tmp/base.json"
jq -r "\"  sleep 5000:    \(.requests) requests (planned \(.planned)), rate \(.rate * 100 | floor / 100)/s, 200s \(.status[\"200\"] // 0), errors \([.errors[]] | add // 0), peak in flight \(.peak_in_flight), connections \(.connections_opened), worker peak RSS \($worker_rss) bytes\"" <"$tmp/sleep.json"
rss_base=$(jq "$worker_rss" <"$tmp/base.json")
rss_sleep=$(jq "$worker_rss" <"$tmp/sleep.json")
in_flight=$(jq '.peak_in_flight' <"$tmp/sleep.json")
awk -v a="$rss_sleep" -v b="$rss_base" -v n="$in_flight" \
  'BEGIN {printf "  generator memory per stream in flight: (%d - %d) / %d = %.0f bytes (target < 1024)\n", a, b, n, (a - b) / n}'

if [ -n "${BEFORE:-}" ]; then
  echo
  echo "== 3. the HTTP/1.1 path: --max --connections $CONNS straight at the server, before and after, 3 rounds alternating"
  compare "before ($BEFORE)" "after ($THRONG)" \
    "$BEFORE" --url "http://$backend/ping" --max --connections "$CONNS" -- \
    "$THRONG" --url "http://$backend/ping" --max --connections "$CONNS"
fi
