#!/usr/bin/env bash
# What one (source, target) pair's local ports cost a connect, as it fills.
#
#   scripts/bench-ports.sh                       build (release) and run
#   THRONG=path/to/throng scripts/bench-ports.sh use a built binary
#
# Linux's connect() looks for a free local port among one parity of the
# range first, from a moving offset; once that half is taken it walks all of
# it on every connect before it tries the other half. This measures it: one
# attack worker opens sleeping /ping requests (each holds its connection
# ~100 s) to one throng serve worker at 1,000/s, from ONE source address,
# until 95% of ip_local_port_range is in use; each second it samples the
# worker's CPU. Then the same with the source addresses attack now picks
# (enough to stay under PORT_FAST, 45% of the range per pair).
#
# Prints the median CPU per new request in three bands of the pair's fill:
# under 40% of the range, 40-50%, over 50%, for each run. Bounded: ~30 s
# per run; stops every process it started.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh

if [ -z "${THRONG:-}" ]; then
  cargo build --release -q -p throng || exit 2
  THRONG="${CARGO_TARGET_DIR:-target}/release/throng"
fi
THRONG=$(realpath "$THRONG")
OUT=$(mktemp -d /tmp/throng-bench-ports.XXXXXX)
ulimit -n "$(ulimit -Hn)"
read -r LO HI < /proc/sys/net/ipv4/ip_local_port_range
RANGE=$((HI - LO + 1))
N=$((RANGE * 95 / 100))
[ "$N" -gt 19000 ] && N=19000 # one process: the open-file limit
echo "throng bench-ports $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
machine_line
echo "ip_local_port_range $LO-$HI ($RANGE ports); up to $N connections on one pair"

SERVER_PID= ATTACK_PID=
cleanup() {
  [ -n "$ATTACK_PID" ] && kill "$ATTACK_PID" 2>/dev/null && wait "$ATTACK_PID" 2>/dev/null
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  ATTACK_PID= SERVER_PID=
}
trap cleanup EXIT

run() { # name, source-ips flag or ""
  local name=$1 sources=$2 port
  port=$(free_port)
  "$THRONG" serve --listen "127.0.0.1:$port" --workers 1 >"$OUT/$name-serve.log" 2>&1 &
  SERVER_PID=$!
  sleep 1
  # shellcheck disable=SC2086
  "$THRONG" attack -u "http://127.0.0.1:$port/ping" -H 'sleep: 200000' -r 1000/s \
    -n "$N" -w 1 --max-connections "$N" --timeout 60s $sources >"$OUT/$name.log" 2>&1 &
  ATTACK_PID=$!
  local worker="" prev_t=0 prev_sent=0
  for _ in $(seq 1 50); do
    worker=$(pgrep -P "$ATTACK_PID" | head -1)
    [ -n "$worker" ] && break
    sleep 0.1
  done
  : >"$OUT/$name.samples"
  for _ in $(seq 1 $((N / 1000 + 4))); do
    sleep 1
    local t sent
    t=$(awk '{print $14 + $15}' "/proc/$worker/stat" 2>/dev/null) || break
    [ -z "$t" ] && break
    sent=$(grep -ao 'sent [0-9]*' "$OUT/$name.log" | tail -1 | cut -d' ' -f2)
    sent=${sent:-0}
    # ticks are 1/100 s: µs of CPU per request sent in this second
    [ "$sent" -gt "$prev_sent" ] &&
      echo "$sent $(((t - prev_t) * 10000 / (sent - prev_sent)))" >>"$OUT/$name.samples"
    prev_t=$t prev_sent=$sent
    [ "$sent" -ge "$N" ] && break
  done
  cleanup
  local pairs k
  pairs=$(grep -o 'sources [^;]*' "$OUT/$name.log" | head -1)
  k=$(echo "$pairs" | grep -o '([0-9]* addresses' | tr -dc 0-9)
  k=${k:-1}
  # the fill of each pair: requests sent over the source addresses
  band() { awk -v lo="$1" -v hi="$2" -v r="$RANGE" -v k="$k" '$1 / k >= lo * r && $1 / k < hi * r {print $2}' "$OUT/$name.samples" | median; }
  printf '%-12s CPU per new request (µs), median per band of the pair'"'"'s fill: <40%% %s, 40-50%% %s, >50%% %s   (%s)\n' \
    "$name" "$(band 0 0.4)" "$(band 0.4 0.5)" "$(band 0.5 2)" "$pairs"
}

run one-source "--source-ips 127.0.0.2"
run picked ""
echo "samples in $OUT"
