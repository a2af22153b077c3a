#!/usr/bin/env bash
# Benchmark of `throng attack` against `throng serve`'s /ping on this
# machine, loopback only, with wrk (Debian's package) in the same run for
# comparison. Generator and server share the machine's cores.
#
#   scripts/bench-attack.sh            build (release) and run
#   THRONG=path/to/throng scripts/bench-attack.sh   use a built binary
#   SECS=5 CONNS=64 SLEEP_SECS=15 scripts/bench-attack.sh
#
# 1. Most requests/s with keep-alive: wrk -t1 -cC and `throng attack --max
#    --connections C --workers 1`, three times each, alternating; also the
#    requests per CPU-second each generator spent (steadier on a busy box).
# 2. 2,000 requests/s with `sleep: 5000` (about 5,000 in flight): the rate
#    achieved (target: within 1% of 2,000/s), and the generator's user-space
#    memory per request in flight (target: <= 2 KiB): its worker's peak RSS
#    minus the peak RSS of the same run without sleep, over the peak number
#    of requests in flight. Beside it, the server's worker RSS per sleeping
#    request (its peak during the run minus before, over the same count).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh

SECS=${SECS:-5}
CONNS=${CONNS:-64}
SLEEP_SECS=${SLEEP_SECS:-15}

if [ -z "${THRONG:-}" ]; then
  cargo build --release -q -p throng
  THRONG="${CARGO_TARGET_DIR:-target}/release/throng"
fi
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)" >&2; exit 1; }
command -v jq >/dev/null || { echo "jq is not installed (apt-get install jq)" >&2; exit 1; }

tmp=$(mktemp -d)
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

"$THRONG" serve --listen 127.0.0.1:0 --workers 1 --json >"$tmp/serve.json" 2>"$tmp/serve.err" &
server_pid=$!
for _ in $(seq 100); do
  [ -s "$tmp/serve.json" ] && break
  sleep 0.1
done
port=$(jq -r '.listen[0]' <"$tmp/serve.json" | sed 's/.*://')
url="http://127.0.0.1:$port/ping"
for _ in $(seq 100); do
  curl -sf "$url" >/dev/null 2>&1 && break
  sleep 0.1
done
echo "throng serve (1 worker) on $url; $(nproc) cores shared by server and generator"

echo
echo "== 1. most requests/s with keep-alive, $CONNS connections, ${SECS}s per run, 3 rounds alternating"
echo "   (req/s depends on what else runs on the machine; requests per CPU-second of the"
echo "   generator, supervisor and workers included, is the steadier comparison)"
: >"$tmp/wrk.txt"
: >"$tmp/throng.txt"
for round in 1 2 3; do
  /usr/bin/time -f "%U %S" -o "$tmp/time" timeout $((SECS + 30)) wrk -t1 -c"$CONNS" -d"${SECS}s" "$url" >"$tmp/wrk.out"
  w=$(awk '/^Requests\/sec/ {print $2}' "$tmp/wrk.out")
  wn=$(awk '/requests in/ {print $1}' "$tmp/wrk.out")
  wcpu=$(awk '{print $1 + $2}' "$tmp/time")
  printf '  round %s  wrk -t1 -c%s:                                   %8.0f req/s, %8.0f req per CPU-s\n' "$round" "$CONNS" "$w" "$(awk -v n="$wn" -v c="$wcpu" 'BEGIN {print n / c}')"
  echo "$w $(awk -v n="$wn" -v c="$wcpu" 'BEGIN {print n / c}')" >>"$tmp/wrk.txt"
  /usr/bin/time -f "%U %S" -o "$tmp/time" timeout $((SECS + 60)) "$THRONG" attack --url "$url" --max \
    --connections "$CONNS" --workers 1 --duration "${SECS}s" --format json -q >"$tmp/max.json" 2>/dev/null
  t=$(jq '.throughput' <"$tmp/max.json")
  tn=$(jq '.requests' <"$tmp/max.json")
  tcpu=$(awk '{print $1 + $2}' "$tmp/time")
  errs=$(jq '[.errors[]] | add // 0' <"$tmp/max.json")
  printf '  round %s  throng attack --max --connections %s --workers 1: %8.0f req/s, %8.0f req per CPU-s (errors %s)\n' "$round" "$CONNS" "$t" "$(awk -v n="$tn" -v c="$tcpu" 'BEGIN {print n / c}')" "$errs"
  echo "$t $(awk -v n="$tn" -v c="$tcpu" 'BEGIN {print n / c}')" >>"$tmp/throng.txt"
done
w_rate=$(awk '{print $1}' "$tmp/wrk.txt" | median)
t_rate=$(awk '{print $1}' "$tmp/throng.txt" | median)
w_eff=$(awk '{print $2}' "$tmp/wrk.txt" | median)
t_eff=$(awk '{print $2}' "$tmp/throng.txt" | median)
awk -v t="$t_rate" -v w="$w_rate" 'BEGIN {printf "  median req/s: throng %.0f, wrk %.0f, ratio %.2f (target >= 1)\n", t, w, t / w}'
awk -v t="$t_eff" -v w="$w_eff" 'BEGIN {printf "  median req per CPU-s: throng %.0f, wrk %.0f, ratio %.2f\n", t, w, t / w}'

echo
echo "== 2. 2000 req/s with 'sleep: 5000' for ${SLEEP_SECS}s (about 5000 requests in flight)"
timeout $((SLEEP_SECS + 60)) "$THRONG" attack --url "$url" --rate 2000/s --duration "${SLEEP_SECS}s" \
  --workers 1 --timeout 30s --format json -q >"$tmp/base.json" 2>/dev/null
# The server's workers: its child processes; their summed RSS, KiB.
server_rss() {
  local total=0 pid kb
  for pid in $(pgrep -P "$server_pid"); do
    kb=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo 0)
    total=$((total + ${kb:-0}))
  done
  echo "$total"
}
server_before=$(server_rss)
timeout $((SLEEP_SECS + 60)) "$THRONG" attack --url "$url" -H 'sleep: 5000' --rate 2000/s \
  --duration "${SLEEP_SECS}s" --workers 1 --timeout 30s --format json -q >"$tmp/sleep.json" 2>/dev/null &
attack_pid=$!
server_peak=$server_before
# While the schedule runs: after it, answered connections wait idle for a
# next request (each in a task) until the generator closes them, which is
# not what a sleeping request costs.
end=$((SECONDS + SLEEP_SECS))
while kill -0 "$attack_pid" 2>/dev/null && [ "$SECONDS" -lt "$end" ]; do
  now=$(server_rss)
  [ "$now" -gt "$server_peak" ] && server_peak=$now
  sleep 0.5
done
wait "$attack_pid"
jq -r '"  without sleep: \(.requests) requests, rate \(.rate | floor)/s, peak in flight \(.peak_in_flight), worker peak RSS \(.peak_rss_bytes | to_entries[] | select(.key | endswith("attack-0")) | .value) bytes"' <"$tmp/base.json"
jq -r '"  sleep 5000:    \(.requests) requests (planned \(.planned)), rate \(.rate * 100 | floor / 100)/s, 200s \(.status["200"] // 0), errors \([.errors[]] | add // 0), late \(.late), peak in flight \(.peak_in_flight), worker peak RSS \(.peak_rss_bytes | to_entries[] | select(.key | endswith("attack-0")) | .value) bytes"' <"$tmp/sleep.json"
jq -r '"  sleep 5000 latency p50 \(.latency_us.p50 / 1000 | floor) ms, p99 \(.latency_us.p99 / 1000 | floor) ms, max \(.latency_us.max / 1000 | floor) ms; lag p99 \(.lag_us.p99) µs"' <"$tmp/sleep.json"
rss_base=$(jq '.peak_rss_bytes | to_entries[] | select(.key | endswith("attack-0")) | .value' <"$tmp/base.json")
rss_sleep=$(jq '.peak_rss_bytes | to_entries[] | select(.key | endswith("attack-0")) | .value' <"$tmp/sleep.json")
in_flight=$(jq '.peak_in_flight' <"$tmp/sleep.json")
rate=$(jq '.rate' <"$tmp/sleep.json")
awk -v r="$rate" 'BEGIN {printf "  rate held: %.2f/s, off by %.3f%% (target < 1%%)\n", r, (r - 2000) / 20}'
awk -v a="$rss_sleep" -v b="$rss_base" -v n="$in_flight" \
  'BEGIN {printf "  generator memory per request in flight: (%d - %d) / %d = %.0f bytes (target <= 2048)\n", a, b, n, (a - b) / n}'
awk -v a="$server_peak" -v b="$server_before" -v n="$in_flight" \
  'BEGIN {printf "  server (throng serve) memory per sleeping request: (%d - %d) KiB / %d = %.0f bytes\n", a, b, n, (a - b) * 1024 / n}'
