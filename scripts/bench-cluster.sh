#!/usr/bin/env bash
# Past one Redis (issue 32): 4 throng nodes on one redis-server against the
# same 4 nodes on a 3-master Redis Cluster (sharded pub/sub), with CHANNELS
# channels (one WebSocket subscriber each, spread over the nodes), then a
# master killed in a 3 masters + 3 replicas cluster.
#
#   publish throughput  wrk POSTs to every node at once for SECONDS (each
#                       request one message to one of the channels), per
#                       round; messages/s acknowledged, and each Redis
#                       process's CPU over the same window
#   time to the last    one message to every channel at once (a burst
#   subscriber          spread over the 4 nodes): from the first POST to the
#                       last subscriber's arrival
#   failover timeline   POST every 10 ms round 100 channels through one node,
#                       SIGKILL a master at 1 s: when publishes were refused,
#                       how many were acknowledged
#
# Medians of ROUNDS rounds; both set-ups measured in the same run. Every
# step is bounded (wrk -d, timeouts in bench-cluster.py) and stops by itself;
# every process is started here and killed by its pid at the end.
# Knobs: CHANNELS (10000), ROUNDS (3), DURATION (5, seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-cluster.XXXXXX)}
mkdir -p "$OUT"
CHANNELS=${CHANNELS:-10000}
ROUNDS=${ROUNDS:-3}
SECONDS_=${DURATION:-5}
NODES=4
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
ulimit -n "$(ulimit -Hn)"
for p in redis-server redis-cli wrk curl python3; do
  command -v "$p" >/dev/null || { echo "$p is missing: scripts/test.sh installs it" >&2; exit 1; }
done
python3 -c 'import websockets.asyncio.client' 2>/dev/null \
  || { echo "python3 websockets >= 13 is missing: scripts/test.sh installs it" >&2; exit 1; }

nice cargo build --release -q -p throng
BIN=$CARGO_TARGET_DIR/release/throng
echo "binary: $BIN; results in $OUT"
machine_line
echo "$(redis-server --version | cut -d' ' -f1-3); $NODES nodes x 1 worker; $CHANNELS channels"

REDIS_PIDS=() REDIS_PORTS=() NODE_PIDS=() NODE_PORTS=() SUB_PID=
stop_nodes() {
  for p in "${NODE_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${NODE_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  NODE_PIDS=() NODE_PORTS=()
}
stop_redis() {
  for p in "${REDIS_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${REDIS_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  REDIS_PIDS=() REDIS_PORTS=()
}
cleanup() {
  [ -n "$SUB_PID" ] && kill "$SUB_PID" 2>/dev/null || true
  stop_nodes
  stop_redis
}
trap cleanup EXIT

redis_one() { # port [extra flags...]
  local port=$1; shift
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$OUT" \
    --client-output-buffer-limit "pubsub 512mb 256mb 60" "$@" > "$OUT/redis-$port.log" &
  REDIS_PIDS+=($!)
  REDIS_PORTS+=("$port")
  for _ in $(seq 100); do
    [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ] && return
    sleep 0.05
  done
  echo "redis-server on $port did not start" >&2; exit 1
}

# A cluster of $1 masters with $2 replicas each; sets SEEDS and CLUSTER_PORTS.
cluster() {
  local n=$(($1 * (1 + $2))) addrs=() port
  CLUSTER_PORTS=()
  for _ in $(seq "$n"); do
    port=$(free_port)
    redis_one "$port" --cluster-enabled yes --cluster-config-file "$OUT/nodes-$port.conf" \
      --cluster-port "$(free_port)" --cluster-node-timeout 1000 --cluster-replica-validity-factor 0
    CLUSTER_PORTS+=("$port")
    addrs+=("127.0.0.1:$port")
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas "$2" --cluster-yes > "$OUT/create.log"
  for port in "${CLUSTER_PORTS[@]}"; do
    for _ in $(seq 200); do
      redis-cli -p "$port" CLUSTER INFO | grep -q "cluster_known_nodes:$n" \
        && redis-cli -p "$port" CLUSTER INFO | grep -q cluster_state:ok && break
      sleep 0.05
    done
  done
  SEEDS=$(IFS=,; echo "${addrs[*]}")
}

start_nodes() { # serve flags...
  local port i
  for i in $(seq "$NODES"); do
    port=$(free_port)
    "$BIN" serve --listen "127.0.0.1:$port" --workers 1 --ping-interval 5m --redis-mode channels "$@" \
      > "$OUT/node-$i.json" 2> "$OUT/node-$i.log" &
    NODE_PIDS+=($!)
    NODE_PORTS+=("$port")
  done
  for port in "${NODE_PORTS[@]}"; do
    for _ in $(seq 300); do
      curl -sf "http://127.0.0.1:$port/healthz" 2>/dev/null | grep -q "broker: up" && break
      sleep 0.05
    done
  done
}

redis_memory() { # used_memory summed over every Redis process
  local sum=0 p
  for p in "${REDIS_PORTS[@]}"; do
    sum=$((sum + $(redis-cli -p "$p" INFO memory | tr -d '\r' | awk -F: '$1 == "used_memory" {print $2}')))
  done
  echo "$sum"
}

cpu_ticks() { # pid: utime + stime, in clock ticks
  awk '{print $14 + $15}' "/proc/$1/stat"
}

# Subscribers, then ROUNDS x (throughput, burst). Prints one line per round.
measure() { # label
  local label=$1 ports wrk_pids r i t0 t1 ticks0=() ticks1=()
  ports=$(IFS=,; echo "${NODE_PORTS[*]}")
  local mem0 mem1
  mem0=$(redis_memory)
  mkfifo "$OUT/sub-$label.fifo"
  python3 scripts/bench-cluster.py subscribe "$ports" "$CHANNELS" "$ROUNDS" \
    > "$OUT/sub-$label.fifo" 2> "$OUT/sub-$label.err" &
  SUB_PID=$!
  exec 3< "$OUT/sub-$label.fifo"
  read -r -t 300 ready <&3 || { echo "subscribers did not open"; cat "$OUT/sub-$label.err"; exit 1; }
  sleep 1
  mem1=$(redis_memory)
  echo "$label: $CHANNELS subscribers open ($ready); Redis memory +$(((mem1 - mem0) / CHANNELS)) B per (channel, node) subscription"
  cat > "$OUT/post.lua" <<'EOF'
local n = 0
request = function()
  n = n + 1
  return wrk.format("POST", "/publish/c" .. ((n * 7919 + math.random(0, 9999)) % CHANNELS), nil, "t")
end
EOF
  sed -i "s/CHANNELS/$CHANNELS/" "$OUT/post.lua"
  for r in $(seq 0 $((ROUNDS - 1))); do
    ticks0=()
    for p in "${REDIS_PIDS[@]}"; do ticks0+=("$(cpu_ticks "$p")"); done
    wrk_pids=()
    for i in "${!NODE_PORTS[@]}"; do
      wrk -t1 -c4 -d"${SECONDS_}s" -s "$OUT/post.lua" "http://127.0.0.1:${NODE_PORTS[$i]}" \
        > "$OUT/wrk-$label-$r-$i.txt" 2>&1 &
      wrk_pids+=($!)
    done
    for p in "${wrk_pids[@]}"; do wait "$p"; done
    ticks1=()
    for p in "${REDIS_PIDS[@]}"; do ticks1+=("$(cpu_ticks "$p")"); done
    local msgs=0 cpu=""
    for i in "${!NODE_PORTS[@]}"; do
      msgs=$(python3 - "$OUT/wrk-$label-$r-$i.txt" "$msgs" "$SECONDS_" <<'EOF'
import re, sys
t = open(sys.argv[1]).read()
total = int(re.search(r"(\d+) requests in", t).group(1))
bad = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
print(int(sys.argv[2]) + total - (int(bad.group(1)) if bad else 0))
EOF
)
    done
    for k in "${!REDIS_PIDS[@]}"; do
      cpu+="$(awk -v a="${ticks0[$k]}" -v b="${ticks1[$k]}" -v s="$SECONDS_" 'BEGIN {printf "%.0f%%", (b - a) / s}') "
    done
    sleep 1
    python3 scripts/bench-cluster.py burst "$ports" "$CHANNELS" "$r" > "$OUT/burst-$label-$r.json"
    local last
    read -r -t 60 last <&3 || last='{}'
    python3 - "$label" "$r" "$msgs" "$SECONDS_" "$cpu" "$OUT/burst-$label-$r.json" "$last" <<'EOF' | tee -a "$OUT/rounds.txt"
import json, sys
label, r, msgs, secs, cpu, burst, last = sys.argv[1:]
b = json.load(open(burst)); l = json.loads(last)
ttl = (l.get("last_ns", 0) - b["start_ns"]) / 1e6
print(f"{label} round {r}: {int(msgs) / float(secs):.0f} msg/s acknowledged; "
      f"Redis CPU {cpu.strip()}; burst of {b['ok']} ok {b['failed']} failed, "
      f"{l.get('got', 0)} arrived, last after {ttl:.0f} ms")
EOF
  done
  exec 3<&-
  kill "$SUB_PID" 2>/dev/null || true; wait "$SUB_PID" 2>/dev/null || true; SUB_PID=
}

echo "== one Redis =="
port=$(free_port); redis_one "$port"
start_nodes --redis "redis://127.0.0.1:$port"
measure one
stop_nodes; stop_redis

echo "== 3-master Redis Cluster =="
cluster 3 0
start_nodes --redis-cluster "$SEEDS"
measure cluster
stop_nodes; stop_redis

echo "== medians ($ROUNDS rounds) =="
python3 - "$OUT/rounds.txt" <<'EOF'
import re, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\w+) round \d+: (\d+) msg/s.*Redis CPU ([\d% ]+);.*last after (-?\d+) ms", line)
    if m:
        cpus = [int(c) for c in re.findall(r"(\d+)%", m.group(3))]
        rows.setdefault(m.group(1), []).append((int(m.group(2)), int(m.group(4)), cpus))
med = {}
for k, v in rows.items():
    tp = statistics.median(x[0] for x in v)
    ttl = statistics.median(x[1] for x in v)
    cpu = [statistics.median(x[2][i] for x in v) for i in range(len(v[0][2]))]
    med[k] = (tp, ttl)
    print(f"{k}: {tp:.0f} msg/s, last subscriber after {ttl:.0f} ms, Redis CPU per process {cpu} %")
if "one" in med and "cluster" in med:
    print(f"cluster / one: throughput x{med['cluster'][0] / med['one'][0]:.2f}, "
          f"time to the last subscriber x{med['cluster'][1] / max(med['one'][1], 1):.2f}")
EOF

echo "== failover: 3 masters + 3 replicas, a master killed at 1 s =="
cluster 3 1
start_nodes --redis-cluster "$SEEDS"
victim_port=$(redis-cli -p "${CLUSTER_PORTS[0]}" CLUSTER NODES | awk '$3 ~ /master/ {split($2, a, "[:@]"); print a[2]; exit}')
victim_pid=
for k in "${!CLUSTER_PORTS[@]}"; do
  [ "${CLUSTER_PORTS[$k]}" = "$victim_port" ] && victim_pid=${REDIS_PIDS[$k]}
done
python3 scripts/bench-cluster.py paced "${NODE_PORTS[0]}" 100 8 "$victim_pid" 1.0 | tee "$OUT/failover.json"
grep -h "Redis Cluster shard" "$OUT"/node-1.log | head -4 || true
