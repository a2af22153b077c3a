#!/usr/bin/env bash
# The before/after of a change to the load harness (hold, attack, bench):
# the same short runs with two throng binaries, alternating, medians.
#
#   scripts/bench-harness-compare.sh BIN_BEFORE BIN_AFTER [ROUNDS]
#   PARTS=attack scripts/bench-harness-compare.sh ...   only some of the parts
#
# Per round and binary:
#   bench   throng bench -c 20000 --messages 5: connect rate, memory per
#           connection (server, harness, kernel), delivery p50/p99, CPU
#   memory  one hold worker's RSS per idle held connection (N=1 vs N=18,000,
#           as scripts/bench-hold.sh memory)
#   attack  5,000 requests/s for 5 s against throng serve's /ping:
#           latency p50/p99 from the intended start, lag p99, CPU of the
#           harness (supervisor and workers)
# The servers of 'memory' and 'attack' are BIN_BEFORE's, so only the
# harness differs. Each run is short and bounded; nothing is left running.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
[ $# -ge 2 ] || { echo "usage: $0 BIN_BEFORE BIN_AFTER [ROUNDS]" >&2; exit 2; }
BEFORE=$(realpath "$1"); AFTER=$(realpath "$2"); ROUNDS=${3:-3}
PARTS=${PARTS:-bench memory attack}
has() { [[ " $PARTS " == *" $1 "* ]]; }
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-harness.XXXXXX)}
mkdir -p "$OUT"
ulimit -n "$(ulimit -Hn)"
echo "before: $BEFORE"; echo "after:  $AFTER"; echo "results in $OUT"
machine_line

SERVER_PID=
start_server() { # workers ports
  local first; first=$(free_ports "$2")
  PORTS="$first-$((first + $2 - 1))"; PORT=$first
  "$BEFORE" serve --listen "127.0.0.1:$PORTS" --workers "$1" --ping-interval 5m --json \
    > "$OUT/serve.json" 2> "$OUT/serve.log" &
  SERVER_PID=$!
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$first/healthz" >/dev/null 2>&1 && break
    sleep 0.1
  done
}
stop_server() {
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
}
trap stop_server EXIT

run_bench() { # bin tag
  "$1" bench -c 20000 --messages 5 --format json -q --out-dir "$OUT/bench-$2" \
    > "$OUT/bench-$2.json" 2> "$OUT/bench-$2.err" || { tail -5 "$OUT/bench-$2.err"; return 0; }
  python3 - "$OUT/bench-$2.json" >> "$OUT/bench.$3" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1])); m = r["memory"]
print(r["connect_rate"], m["server_per_connection"], m["harness_per_connection"],
      m["kernel_per_connection"], r["delivery_us"]["p50"], r["delivery_us"]["p99"],
      r["cpu"]["harness_s"], r["cpu"]["server_s"])
EOF
}

run_memory() { # bin tag
  "$1" hold "ws://127.0.0.1:$PORTS/mem" -c 1 -w 1 --duration 3s -q -o "$OUT/mem1-$2.jsonl" > /dev/null
  "$1" hold "ws://127.0.0.1:$PORTS/mem" -c 18000 -w 1 --rate 6000/s --duration 4s -q \
    -o "$OUT/mem18k-$2.jsonl" > /dev/null
  local r1 r18
  r1=$(rss_at_plateau "$OUT/mem1-$2.jsonl" 1); r18=$(rss_at_plateau "$OUT/mem18k-$2.jsonl" 18000)
  python3 -c "print(($r18 - $r1) / 17999)" >> "$OUT/memory.$3"
}

run_attack() { # bin tag
  /usr/bin/time -f "%U %S" -o "$OUT/attack-$2.time" "$1" attack --url "http://127.0.0.1:$PORT/ping" \
    --rate 5000/s --duration 5s --format json -q > "$OUT/attack-$2.json" 2> "$OUT/attack-$2.err"
  python3 - "$OUT/attack-$2.json" "$OUT/attack-$2.time" >> "$OUT/attack.$3" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1])); u, t = map(float, open(sys.argv[2]).read().split()[-2:])
print(s["latency_us"]["p50"], s["latency_us"]["p99"], s["lag_us"]["p99"], u + t, s["requests"])
EOF
}

for round in $(seq "$ROUNDS"); do
  echo "round $round"
  for side in before after; do
    bin=$BEFORE; [ "$side" = after ] && bin=$AFTER
    if has bench; then run_bench "$bin" "$side-$round" "$side"; fi
    start_server 2 1
    if has memory; then run_memory "$bin" "$side-$round" "$side"; fi
    if has attack; then run_attack "$bin" "$side-$round" "$side"; fi
    stop_server
  done
done

column_medians() { # file names...
  local file=$1; shift; local i=1
  for name in "$@"; do
    printf '  %-26s %s\n' "$name" "$(awk -v c="$i" '{print $c}' "$file" | median)"
    i=$((i + 1))
  done
}
for side in before after; do
  echo; echo "== $side (medians of $ROUNDS rounds)"
  if has bench; then
    echo " bench -c 20000 --messages 5"
    column_medians "$OUT/bench.$side" "connect rate /s" "server B/conn" "harness B/conn" \
      "kernel B/conn" "delivery p50 us" "delivery p99 us" "harness CPU s" "server CPU s"
  fi
  if has memory; then
    echo " hold memory: one worker, N=1 vs N=18000"
    column_medians "$OUT/memory.$side" "B per idle held connection"
  fi
  if has attack; then
    echo " attack 5000/s for 5s on /ping"
    column_medians "$OUT/attack.$side" "latency p50 us" "latency p99 us" "lag p99 us" \
      "harness CPU s" "requests"
  fi
done
