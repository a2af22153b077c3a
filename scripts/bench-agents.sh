#!/usr/bin/env bash
# Issue 15's benchmark: what coordinating a run through agents costs. The
# same 30,000-connection hold, run on this machine directly and through
# three `throng agent`s, each in a network namespace of its own (one
# address each, as three load machines would have), against `throng serve`
# in a fourth namespace; Redis here, on the namespaces' bridge.
#
#   sudo scripts/bench-agents.sh                        build (release) and run
#   THRONG=path/to/throng sudo scripts/bench-agents.sh  use a built binary
#   ROUNDS=5 CONNECTIONS=30000 RATE=5000/s HOLD=5s sudo scripts/bench-agents.sh
#
# Rounds alternate direct and agents (medians over ROUNDS of each). Direct:
# `throng hold` here, bound to three extra addresses on the bridge (three
# sources, as the agents have) with as many workers as the three agents run
# together. Agents: `throng hold --agents`. Each:
# -c CONNECTIONS --rate RATE --duration HOLD, one 64-byte message a second.
#
# Prints per round and as medians: connect rate (opened / ramp), delivery
# p50 and p99, load-side CPU (the hold and its workers; or the three agents
# and their workers, from /proc/PID/stat before and after), and for the
# agents runs the controller's CPU and peak RSS, and Redis's CPU and
# memory, per agent per second of the run. Needs root (ip netns) and
# redis-server; removes its namespaces and stops every process it started.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh

ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-30000}
RATE=${RATE:-5000/s}
HOLD=${HOLD:-5s}
if [ -z "${THRONG:-}" ]; then
  cargo build --release -q -p throng || exit 2
  THRONG="${CARGO_TARGET_DIR:-target}/release/throng"
fi
THRONG=$(realpath "$THRONG")
command -v redis-server >/dev/null || { echo "needs redis-server"; exit 2; }
[ "$(id -u)" = 0 ] || { echo "needs root (ip netns)"; exit 2; }
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-agents.XXXXXX)}
mkdir -p "$OUT"
ulimit -n "$(ulimit -Hn)"
echo "throng bench-agents $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $THRONG"
machine_line
echo "results in $OUT; $ROUNDS rounds each of -c $CONNECTIONS --rate $RATE --duration $HOLD"

TAG=$(( $$ % 1000 ))
NET=10.214.$(( 20 + $$ % 200 ))
BR=tba$TAG
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  for i in 0 1 2 3; do ip netns del "tba${TAG}n$i" 2>/dev/null; done
  ip link del "$BR" 2>/dev/null
}
trap cleanup EXIT
ip link add "$BR" type bridge && ip addr add "$NET.1/24" dev "$BR" && ip link set "$BR" up || exit 2
for k in 101 102 103; do ip addr add "$NET.$k/24" dev "$BR"; done
for i in 0 1 2 3; do
  ns=tba${TAG}n$i
  ip netns add "$ns"
  ip link add "tva${TAG}n$i" type veth peer name "tpa${TAG}n$i"
  ip link set "tpa${TAG}n$i" netns "$ns"
  ip link set "tva${TAG}n$i" master "$BR"
  ip link set "tva${TAG}n$i" up
  ip -n "$ns" addr add "$NET.$((10 + i))/24" dev "tpa${TAG}n$i"
  ip -n "$ns" link set "tpa${TAG}n$i" up
  ip -n "$ns" link set lo up
done

RPORT=$(free_port)
redis-server --port "$RPORT" --bind 127.0.0.1 "$NET.1" --protected-mode no --save '' --appendonly no >"$OUT/redis.log" 2>&1 &
REDIS=$!; PIDS+=("$REDIS")
SERVER="$NET.10:9000"
ip netns exec "tba${TAG}n0" "$THRONG" serve --listen "$SERVER" --max-connections $((CONNECTIONS + 1000)) >"$OUT/serve.log" 2>&1 &
PIDS+=("$!")
AGENTS=()
for i in 1 2 3; do
  ip netns exec "tba${TAG}n$i" "$THRONG" agent --redis "redis://$NET.1:$RPORT" --name "ns$i" --source-ips "$NET.$((10 + i))" >"$OUT/agent$i.log" 2>&1 &
  PIDS+=("$!"); AGENTS+=("$!")
done
for _ in $(seq 100); do
  n=$("$THRONG" agents --redis "redis://127.0.0.1:$RPORT" --json 2>/dev/null | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))' 2>/dev/null)
  [ "${n:-0}" = 3 ] && python3 -c "import socket; socket.create_connection(('$NET.10', 9000), 1)" 2>/dev/null && break
  sleep 0.2
done
[ "${n:-0}" = 3 ] || { echo "the agents did not register"; exit 2; }

# utime+stime of a process and its waited-for children, in clock ticks.
ticks() { awk '{print $14 + $15 + $16 + $17}' "/proc/$1/stat" 2>/dev/null || echo 0; }
agents_ticks() { local t=0; for p in "${AGENTS[@]}"; do t=$((t + $(ticks "$p"))); done; echo "$t"; }
HZ=$(getconf CLK_TCK)

run() { # mode round
  local mode=$1 r=$2 json="$OUT/$1-$2.json" time="$OUT/$1-$2.time"
  local args=(hold "ws://$SERVER/news" -c "$CONNECTIONS" --rate "$RATE" --duration "$HOLD"
    --publish "http://$SERVER/publish/news" --publish-rate 1/s --json -q -o "$OUT/$1-$2.jsonl")
  local a0 r0 t0 t1
  a0=$(agents_ticks); r0=$(ticks "$REDIS"); t0=$(date +%s.%N)
  if [ "$mode" = direct ]; then
    # As many workers as the three agents run together (one per core each).
    /usr/bin/time -f '%U %S %M' -o "$time" "$THRONG" "${args[@]}" --source-ips "$NET.101,$NET.102,$NET.103" \
      --workers $((3 * $(nproc))) >"$json" 2>"$OUT/$1-$2.err"
  else
    /usr/bin/time -f '%U %S %M' -o "$time" "$THRONG" "${args[@]}" --agents "redis://127.0.0.1:$RPORT" >"$json" 2>"$OUT/$1-$2.err"
  fi
  local rc=$?
  t1=$(date +%s.%N)
  sleep 1 # the agents wait for their workers once the run is over
  local a1 r1; a1=$(agents_ticks); r1=$(ticks "$REDIS")
  local redis_rss; redis_rss=$(awk '/VmRSS/ {print $2}' "/proc/$REDIS/status")
  python3 - "$mode" "$r" "$json" "$time" "$rc" "$t0" "$t1" "$((a1 - a0))" "$((r1 - r0))" "$HZ" "$redis_rss" <<'EOF' | tee -a "$OUT/rows.tsv"
import json, sys
mode, r, path, timef, rc, t0, t1, agent_ticks, redis_ticks, hz, redis_rss = sys.argv[1:]
s = json.load(open(path))
u, sy, maxrss = open(timef).read().split()[-3:]
wall = float(t1) - float(t0)
hz = float(hz)
ctl = float(u) + float(sy)
load = ctl if mode == "direct" else int(agent_ticks) / hz
print("\t".join(str(x) for x in [
    mode, r, rc, s["opened"], round(s["connect_rate"]), s["delivery_us"]["p50"], s["delivery_us"]["p99"],
    round(load, 2), round(ctl, 2) if mode == "agents" else "-", int(maxrss) // 1024 if mode == "agents" else "-",
    round(int(redis_ticks) / hz, 3) if mode == "agents" else "-", int(redis_rss) // 1024, round(wall, 1)]))
EOF
}

printf 'mode\tround\texit\topened\tconnect/s\tdelivery p50 µs\tp99 µs\tload CPU s\tcontroller CPU s\tcontroller RSS MiB\tRedis CPU s\tRedis RSS MiB\twall s\n' | tee "$OUT/rows.tsv"
for r in $(seq "$ROUNDS"); do
  run direct "$r"
  run agents "$r"
done

python3 - "$OUT/rows.tsv" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])][1:]
def med(mode, col):
    v = [float(r[col]) for r in rows if r[0] == mode and r[col] != "-"]
    return statistics.median(v) if v else float("nan")
print("\nmedians            direct    agents")
for name, col in [("connect/s", 4), ("delivery p50 µs", 5), ("delivery p99 µs", 6), ("load-side CPU s", 7), ("wall s", 12)]:
    print(f"  {name:<16} {med('direct', col):>8.2f}  {med('agents', col):>8.2f}")
wall = med("agents", 12)
per = lambda x: x / 3 / wall * 1000
print(f"  controller: {med('agents', 8):.2f} s CPU, {med('agents', 9):.0f} MiB peak RSS: {per(med('agents', 8)):.1f} ms CPU per agent per second")
print(f"  Redis: {med('agents', 10):.3f} s CPU, {med('agents', 11):.0f} MiB RSS: {per(med('agents', 10)):.2f} ms CPU per agent per second")
EOF
