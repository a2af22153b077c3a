#!/usr/bin/env bash
# Benchmark of `throng knee attack` on this machine, loopback only: how
# close repeated searches land, how long a search takes, and how the knee
# compares with the most a saturating closed-model run gets through.
#
#   scripts/bench-knee.sh                      build (release) and run
#   THRONG=path/to/throng scripts/bench-knee.sh
#   RUNS=3 STEP=5s WARMUP=2s REPEAT=3 SEED_RUNS=1 scripts/bench-knee.sh
#   SEED_RUNS=0 scripts/bench-knee.sh          A and B only
#   OUT=dir scripts/bench-knee.sh              keep every search's result file
#                                              and page in dir (throng report
#                                              prints a search's table)
#
# Two targets, each searched RUNS times with the default objective (p99 at
# most 100ms, errors at most 0.1%):
#   A. `throng serve`'s /ping (1 worker), answering at once: the server and
#      the generator share this machine's cores, so either may give first
#      (the search says which);
#   B. the tests' target with a hard capacity: HAProxy letting 4 requests
#      at a time through to /ping with `sleep: 20` (10 ms on average).
# Before each target's searches: `throng attack --max` with 64, 128 and 256
# connections, 5 s each; the best of them is the closed model's capacity,
# and each knee is shown as a share of it.
# Then the seed's question, docs/knee.md's worked example, searched
# SEED_RUNS times each way (no --max: a closed pool of a few hundred
# connections says nothing of requests that take up to a second):
#   C1. /ping with `sleep: 1000` and an objective of p99 at most 1.2s, with
#       the generator's default --max-connections 10000;
#   C2. the same with room for the requests in flight (--max-connections
#       39000: two workers under the 20,000-file limit).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh

RUNS=${RUNS:-3}
STEP=${STEP:-5s}
WARMUP=${WARMUP:-2s}
REPEAT=${REPEAT:-3}
SEED_RUNS=${SEED_RUNS:-1}
OUT=${OUT:-}

if [ -z "${THRONG:-}" ]; then
  cargo build --release -q -p throng
  THRONG="${CARGO_TARGET_DIR:-target}/release/throng"
fi
for tool in jq curl haproxy; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed (apt-get install $tool)" >&2; exit 1; }
done

tmp=$(mktemp -d)
server_pid=""
haproxy_pid=""
cleanup() {
  # What the peers exit with (killed: 143) is not the benchmark's status;
  # under set -e a failing wait would end the trap with it.
  [ -n "$haproxy_pid" ] && kill "$haproxy_pid" 2>/dev/null && wait "$haproxy_pid" 2>/dev/null || true
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap 'code=$?; cleanup; exit $code' EXIT

"$THRONG" serve --listen 127.0.0.1:0 --workers 1 --json >"$tmp/serve.json" 2>"$tmp/serve.err" &
server_pid=$!
for _ in $(seq 100); do
  [ -s "$tmp/serve.json" ] && break
  sleep 0.1
done
backend=$(jq -r '.listen[0]' <"$tmp/serve.json")
for _ in $(seq 100); do
  curl -sf "http://$backend/ping" >/dev/null 2>&1 && break
  sleep 0.1
done
lb_port=$(free_port)
cat >"$tmp/haproxy.cfg" <<EOF
global
  maxconn 4000
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout queue 60s
frontend web
  bind 127.0.0.1:$lb_port
  default_backend app
backend app
  server s1 $backend maxconn 4
EOF
haproxy -db -f "$tmp/haproxy.cfg" >"$tmp/haproxy.log" 2>&1 &
haproxy_pid=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$lb_port/ping" >/dev/null 2>&1 && break
  sleep 0.1
done

machine_line
echo "throng serve (1 worker) on http://$backend/ping; HAProxy (4 at a time) on 127.0.0.1:$lb_port"
echo "each search: --step-duration $STEP --warmup $WARMUP --repeat $REPEAT, default objective; $RUNS searches per target"

# share KNEE BEST: KNEE as a share of the best --max rate ("-" without one).
share() { awk -v k="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", k / b; else printf "-"}'; }

# bench NAME URL FROM TO [HEADER...]: the best --max rate (with each of
# MAX_CONNECTIONS, none when empty), then SEARCHES searches with the extra
# knee arguments KNEE_ARGS.
MAX_CONNECTIONS="64 128 256"
SEARCHES=$RUNS
KNEE_ARGS=()
bench() {
  local name=$1 url=$2 from=$3 to=$4
  shift 4
  local headers=()
  for h in "$@"; do headers+=(-H "$h"); done
  echo
  echo "== $name: $url ${*:+(-H $*)} ${KNEE_ARGS[*]}"
  local best=0
  for c in $MAX_CONNECTIONS; do
    "$THRONG" attack --url "$url" "${headers[@]}" --max --connections "$c" --duration 5s \
      --format json -q >"$tmp/max.json" 2>/dev/null
    local t
    t=$(jq '.throughput' <"$tmp/max.json")
    printf '  attack --max --connections %-3s  %8.0f req/s (errors %s)\n' "$c" "$t" \
      "$(jq '[.errors[]] | add // 0' <"$tmp/max.json")"
    best=$(awk -v a="$best" -v b="$t" 'BEGIN {print (b > a) ? b : a}')
  done
  [ -n "$MAX_CONNECTIONS" ] && printf '  best --max: %.0f req/s\n' "$best"
  : >"$tmp/knees.txt"
  for run in $(seq "$SEARCHES"); do
    local t0 t1 code=0
    t0=$(date +%s.%N)
    "$THRONG" knee attack --url "$url" "${headers[@]}" --from "$from" --to "$to" \
      --step-duration "$STEP" --warmup "$WARMUP" --repeat "$REPEAT" "${KNEE_ARGS[@]}" \
      --format json -q --out-dir "${OUT:-$tmp/out}" >"$tmp/knee.json" 2>"$tmp/knee.err" || code=$?
    t1=$(date +%s.%N)
    local kind knee fail runs
    kind=$(jq -r '.outcome.kind' <"$tmp/knee.json")
    knee=$(jq -r '.outcome.knee // .outcome.at // .outcome.passed // 0' <"$tmp/knee.json")
    fail=$(jq -r '.outcome.first_failing // "-"' <"$tmp/knee.json")
    runs=$(jq '.runs | length' <"$tmp/knee.json")
    printf '  search %s: %-20s %8.0f req/s (first failing %s) = %s x best --max; %s level runs in %.0f s; exit %s\n' \
      "$run" "$kind" "$knee" "$fail" "$(share "$knee" "$best")" "$runs" \
      "$(awk -v a="$t0" -v b="$t1" 'BEGIN {print b - a}')" "$code"
    jq -r '.runs[] | "      \(.run) \(.level)/s \(.phase) \(.verdict): p99 \(.latency_us.p99)us lag p99 \(.lag_us.p99)us gen CPU \(.generator_cpu * 100 | floor)% \(.reasons[0] // "")"' \
      <"$tmp/knee.json" | cut -c1-180
    echo "$knee" >>"$tmp/knees.txt"
  done
  local lo hi med
  lo=$(sort -n "$tmp/knees.txt" | head -1)
  hi=$(sort -n "$tmp/knees.txt" | tail -1)
  med=$(median <"$tmp/knees.txt")
  printf '  knees: min %.0f, median %.0f, max %.0f req/s; spread (max - min) / median %.1f%%; median = %s x best --max\n' \
    "$lo" "$med" "$hi" "$(awk -v a="$lo" -v b="$hi" -v m="$med" 'BEGIN {print (m > 0) ? (b - a) / m * 100 : 0}')" \
    "$(share "$med" "$best")"
}

bench "A. throng serve /ping" "http://$backend/ping" 1000/s 100k/s
bench "B. HAProxy maxconn 4 in front of /ping, sleep: 20" "http://127.0.0.1:$lb_port/ping" 50/s 2000/s "sleep: 20"

if [ "$SEED_RUNS" -gt 0 ]; then
  MAX_CONNECTIONS=""
  SEARCHES=$SEED_RUNS
  KNEE_ARGS=(--slo-p99 1.2s)
  bench "C1. the seed's question, the generator's default connections" "http://$backend/ping" 4000/s 32k/s "sleep: 1000"
  KNEE_ARGS=(--slo-p99 1.2s --max-connections 39000)
  bench "C2. the seed's question, room for the requests in flight" "http://$backend/ping" 4000/s 32k/s "sleep: 1000"
fi
