#!/usr/bin/env bash
# Issue 13's benchmark: a million connections on this machine, back to back
# from a clean start, and the table docs/scale.md keeps.
#
#   scripts/bench-scale.sh                        build (release) and run everything
#   THRONG=path/to/throng scripts/bench-scale.sh  use a built binary
#   RUNS="ws-100k ws-1m" scripts/bench-scale.sh   only some runs (names below)
#   RUNS=sweep scripts/bench-scale.sh             the fan-out at five sizes, throng's
#                                                 and the kernel's alone
#
# Runs, one after the other (never two at once; each stops every process it
# started):
#   ws-100k, ws-500k, ws-1m   throng bench -c N --messages 3 --message-every 20s
#                             (the same settings at each size, so the fan-out
#                             times compare: 20 s leaves a million subscribers
#                             room for each message)
#   ws-20k                    the same at 20,000 (not in the default list):
#                             a quick check of the ratio table on a shared
#                             machine, with kernel-20k beside it
#   ws-200k, ws-300k          the same at two more sizes (not in the default
#                             list; RUNS=sweep runs ws-100k, ws-200k, ws-300k,
#                             ws-500k and ws-1m): where a fan-out's growth with
#                             size departs from linear
#   ws-500k-10                throng bench -c 500000 --messages 10 (the default
#                             spacing, 2 s: fan-outs overlap)
#   sleep-100k                the same at 4000/s over 50 s with 'sleep: 50000'
#                             (not in the default list): 100,000 in flight, a
#                             quick check of the memory per sleeping request
#   sleep-1m                  throng serve + throng attack --rate 10000/s
#                             --duration 200s -H 'sleep: 200000' (a random 0-200 s
#                             each: a mean of 100 s, so a million requests in
#                             flight when the schedule ends), --timeout 300s,
#                             --max-lag 1s (PASS: every request answered, none
#                             started more than 1 s behind schedule; the count
#                             started > 10 ms late is printed beside), in a
#                             network namespace whose TCP table fits 2M sockets
#                             (as root; 'throng bench' makes its own)
#   kernel-100k, kernel-1m    fanout_floor (crates/throng-bench): the same
#                             fan-out with no throng code, in the same process
#                             layout (writers and readers of at most 19,600
#                             connections each, level-triggered epoll, one
#                             66-byte frame to every connection, 9 rounds) and
#                             the same TCP table size, each reader's
#                             connections spread over every writer as
#                             bench's are over serve's workers
#                             (FLOOR_LAYOUT=paired: a reader per writer,
#                             the layout before 2026-11-28): how the kernel's own
#                             fan-out grows on this machine, for throng's to be
#                             judged against (kernel-200k, -300k, -500k too;
#                             RUNS=sweep runs each size's pair; kernel-20k
#                             for ws-20k)
#   fd-tax                    the machine's busy share while idle processes
#                             hold 0, 200,000 and 2,000,000 descriptors on
#                             /dev/null (what a run of 100k and of a million
#                             connections holds): CPU that other programs
#                             spend because descriptors are open, taken from
#                             the large runs and not the small
#   floor                     serve_bench (as scripts/bench-serve.sh): the bare
#                             write(2) loop a fan-out is compared with (one
#                             worker, 18,000 subscribers), for the CPU per
#                             delivery beside it
#
# Ends with one table of throng against the kernel at each size that has
# both runs (ws-N and kernel-N of the same run): the last subscriber against
# the last byte (medians) and serve's CPU per delivery against the floor
# writers' (serve's above its idle cost between fan-outs, which the table
# prints beside), each with its ratio: issue 33's claim (within 1.25x and 1.10x)
# in one command, e.g. RUNS="kernel-100k ws-100k kernel-1m ws-1m".
#
# Prints, per bench: held, failed, lost, verdict, connect rate, memory per
# connection (server, harness, kernel), each message's last subscriber, CPU
# per delivery on each side, the first limit reached and the highest load
# average during the run; for the sleeping requests: the most in flight,
# answered, timeouts, requests started late, lag, and memory per request in
# flight in attack and in serve (each side's RSS at the second with the most
# in flight, minus before, over that count). Needs ~10 GiB of kernel memory
# and tcp_mem room for a million (throng doctor --connections 1000000 says).
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh

RUNS=${RUNS:-"floor fd-tax kernel-100k ws-100k ws-500k kernel-1m ws-1m ws-500k-10 sleep-1m"}
RUNS=${RUNS/sweep/fd-tax kernel-100k ws-100k kernel-200k ws-200k kernel-300k ws-300k kernel-500k ws-500k kernel-1m ws-1m}
has() { [[ " $RUNS " == *" $1 "* ]]; }
if [ -z "${THRONG:-}" ]; then
  cargo build --release -q -p throng || exit 2
  THRONG="${CARGO_TARGET_DIR:-target}/release/throng"
fi
THRONG=$(realpath "$THRONG")
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-scale.XXXXXX)}
mkdir -p "$OUT"
ulimit -n "$(ulimit -Hn)"
echo "throng bench-scale $(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $THRONG"
machine_line
# The scheduler's autogroup setting moves a million's fan-out by ~20% here
# (docs/scale.md), so a run says which it had.
autogroup_line() { echo "scheduler: kernel.sched_autogroup_enabled=$(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null || echo '?')"; }
autogroup_line
echo "results in $OUT"
"$THRONG" doctor --connections 1000000 >"$OUT/doctor.txt" 2>&1
if grep -q '^  STOP' "$OUT/doctor.txt"; then
  echo "throng doctor --connections 1000000 says a limit will stop a million (its fixes: $OUT/doctor.txt):"
  grep -A3 '^  STOP' "$OUT/doctor.txt"
fi

# The highest 1-minute load average while a command runs, into $1.
LOAD_PID=
load_watch() {
  echo 0 >"$1"
  ( while true; do
      l=$(cut -d' ' -f1 /proc/loadavg)
      awk -v l="$l" -v f="$1" 'BEGIN {getline m < f; if (l > m) print l > f}'
      sleep 5
    done ) &
  LOAD_PID=$!
}
load_stop() { [ -n "$LOAD_PID" ] && kill "$LOAD_PID" 2>/dev/null; wait "$LOAD_PID" 2>/dev/null; LOAD_PID=; }
SERVER_PID=
SAMPLER_PID=
NETNS=
cleanup() {
  load_stop
  [ -n "$SAMPLER_PID" ] && kill "$SAMPLER_PID" 2>/dev/null
  [ -n "$SERVER_PID" ] && kill -TERM "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  [ -n "$NETNS" ] && ip netns del "$NETNS" 2>/dev/null
  true
}
trap cleanup EXIT

# Two million sockets in the host's TCP table (262,144 buckets here) make
# every segment's lookup a walk, and each connect()'s port search too: as
# 'throng bench' does for itself, a run gets a network namespace whose table
# fits it (docs/scale.md), with IN=(ip netns exec NAME) to run inside it.
# Root and Linux 6.1+; else IN=() and the host's table.
IN=()
netns_up() { # buckets
  IN=()
  if [ "$(id -u)" = 0 ] && [ -e /proc/sys/net/ipv4/tcp_child_ehash_entries ] && command -v ip >/dev/null; then
    local before
    before=$(cat /proc/sys/net/ipv4/tcp_child_ehash_entries)
    NETNS=throng-scale-$$
    sysctl -qw net.ipv4.tcp_child_ehash_entries="$1" && ip netns add "$NETNS" && ip netns exec "$NETNS" ip link set lo up
    sysctl -qw net.ipv4.tcp_child_ehash_entries="$before"
    IN=(ip netns exec "$NETNS")
    echo "  network: namespace $NETNS, TCP table $("${IN[@]}" cat /proc/sys/net/ipv4/tcp_ehash_entries) buckets (the host's: $(tr -d - </proc/sys/net/ipv4/tcp_ehash_entries))"
  fi
}
netns_down() { [ -n "$NETNS" ] && ip netns del "$NETNS"; NETNS=; IN=(); }
# A run that follows a million-socket one waits until the kernel has freed
# those sockets (a namespace's are freed after it is deleted), so that it
# does not pay for that work.
sockets_freed() {
  for _ in $(seq 120); do
    [ "$(awk '/^TCP:/ {print $9}' /proc/net/sockstat)" -lt 1000 ] 2>/dev/null && return
    sleep 1
  done
}

FLOOR_NS=
if has floor; then
  echo; echo "== floor: crates/throng-bench's serve_bench (as scripts/bench-serve.sh: one worker, 18,000 subscribers)"
  cargo build --release -q -p throng-bench --bin serve_bench || exit 2
  "${CARGO_TARGET_DIR:-target}/release/serve_bench" --throng "$THRONG" --conns 18000 --rounds 10 \
    >"$OUT/floor.json" 2>"$OUT/floor.err" || tail -3 "$OUT/floor.err"
  FLOOR_NS=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(round(r["floor_write_cpu_ns_per_frame"]), round(r["fanout_cpu_ns_per_frame_in_loop"]))' "$OUT/floor.json" 2>/dev/null)
  echo "  bare write(2) of a frame: ${FLOOR_NS% *} ns of CPU; the fan-out loop: ${FLOOR_NS#* } ns (serve's worker thread)"
fi

bench() { # name connections args...
  local name=$1 n=$2; shift 2
  echo; echo "== $name: throng bench -c $n $*"
  sockets_freed
  load_watch "$OUT/$name.load"
  local started=$SECONDS
  "$THRONG" bench -c "$n" "$@" --out-dir "$OUT/$name" --format json >"$OUT/$name.json" 2>"$OUT/$name.err"
  echo "  exit $? after $((SECONDS - started)) s"
  load_stop
  grep -E '^  (settings|expect|verdict)' "$OUT/$name.err" | sed 's/^/  /'
}

FANOUT_FLOOR=
# bench's layout: every harness worker holds connections to every server
# worker (SO_REUSEPORT's spread). FLOOR_LAYOUT=paired connects each reader
# to one writer only: cheaper on both sides, and not what bench does.
FLOOR_LAYOUT=${FLOOR_LAYOUT:-spread}
kernel() { # name connections
  local name=$1 n=$2
  echo; echo "== $name: fanout_floor --conns $n --rounds 9 --layout $FLOOR_LAYOUT (the kernel's own fan-out: write(2), epoll_wait(2), read(2); no throng)"
  if [ -z "$FANOUT_FLOOR" ]; then
    cargo build --release -q -p throng-bench --bin fanout_floor || exit 2
    FANOUT_FLOOR=$(realpath "${CARGO_TARGET_DIR:-target}/release/fanout_floor")
  fi
  sockets_freed
  # The table throng bench has at this size (the host's 262,144 buckets at
  # 100k, a namespace's 2,097,152 at a million): the next power of two
  # above both ends' sockets.
  netns_up "$(python3 -c 'import sys; n = 2 * int(sys.argv[1]); print(1 << (n - 1).bit_length())' "$n")"
  "${IN[@]}" sysctl -qw net.core.somaxconn=65535 2>/dev/null
  load_watch "$OUT/$name.load"
  local started=$SECONDS
  "${IN[@]}" "$FANOUT_FLOOR" --conns "$n" --rounds 9 --layout "$FLOOR_LAYOUT" >"$OUT/$name.json" 2>"$OUT/$name.err"
  echo "  exit $? after $((SECONDS - started)) s"
  load_stop
  netns_down
  grep -E '^fanout_floor: .* connected' "$OUT/$name.err" | sed 's/^fanout_floor: /  /'
}
# What this machine charges for open files: a run of a million holds two
# million descriptors, and on some machines another program's work grows
# with that count (this VM's agent scans them: docs/scale.md), taking CPU
# from a fan-out at a million that it leaves to one at 100k. Idle processes
# hold N descriptors on /dev/null (as many as a run of N/2 connections
# holds sockets); the machine's busy share over 10 s, less the idle
# baseline's, is what others spend because they are open.
if has fd-tax; then
  echo; echo "== fd-tax: the machine's CPU while idle processes hold 0, 200,000 and 2,000,000 open descriptors"
  sockets_freed
  python3 - "$OUT/fd-tax.json" <<'PY'
import json, os, sys, time, resource
per = min(resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 100, 19000)
def busy(secs):
    def read():
        f = [int(x) for x in open("/proc/stat").readline().split()[1:9]]
        return sum(f) - f[3] - f[4], sum(f)
    (b0, a0) = read(); time.sleep(secs); (b1, a1) = read()
    return (b1 - b0) / max(a1 - a0, 1)
rows = []
for n in [0, 200000, 2000000]:
    kids = []
    r, w = os.pipe()
    for i in range((n + per - 1) // per):
        pid = os.fork()
        if pid == 0:
            os.close(w)
            keep = [os.open("/dev/null", os.O_RDONLY) for _ in range(min(per, n - i * per))]
            os.read(r, 1)  # until the parent closes its end
            os._exit(0)
        kids.append(pid)
    os.close(r)
    time.sleep(5 if n else 1)
    share = busy(10)
    os.close(w)
    for k in kids:
        os.waitpid(k, 0)
    rows.append({"descriptors": n, "machine_busy": share})
    print(f"  {n:>9} descriptors open: the machine {100 * share:.1f}% busy", flush=True)
json.dump(rows, open(sys.argv[1], "w"))
PY
fi
has kernel-20k && kernel kernel-20k 20000
has ws-20k && bench ws-20k 20000 --messages 3 --message-every 20s
has kernel-100k && kernel kernel-100k 100000
has ws-100k && bench ws-100k 100000 --messages 3 --message-every 20s
has kernel-200k && kernel kernel-200k 200000
has ws-200k && bench ws-200k 200000 --messages 3 --message-every 20s
has kernel-300k && kernel kernel-300k 300000
has ws-300k && bench ws-300k 300000 --messages 3 --message-every 20s
has kernel-500k && kernel kernel-500k 500000
has ws-500k && bench ws-500k 500000 --messages 3 --message-every 20s
has kernel-1m && kernel kernel-1m 1000000
has ws-1m && bench ws-1m 1000000 --messages 3 --message-every 20s
has ws-500k-10 && bench ws-500k-10 500000 --messages 10

# A sleeping-request run: NAME, the rate per second, the schedule's seconds,
# the longest sleep in ms (each request sleeps a random 0..SLEEP: as many in
# flight at the end as the rate over half of it) and the connection cap.
sleepers() {
  local name=$1 rate=$2 secs=$3 sleep_ms=$4 cap=$5
  echo; echo "== $name: throng attack --rate $rate/s --duration ${secs}s -H 'sleep: $sleep_ms' --max-lag 1s against throng serve's /ping"
  netns_up 4194304
  port=$(free_port)
  "${IN[@]}" "$THRONG" serve --listen "127.0.0.1:$port" --max-connections "$cap" --json \
    >"$OUT/$name-serve.json" 2>"$OUT/$name-serve.err" &
  SERVER_PID=$!
  for _ in $(seq 200); do "${IN[@]}" curl -sf "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.1; done
  echo "  server: $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["workers"])' "$OUT/$name-serve.json") workers"
  # The server's workers' RSS (KiB) and the server's CPU (user + system
  # clock ticks, its supervisor's included) once a second; the attack's are
  # in its result file.
  ( while true; do
      t=$(date +%s%N); kb=0; ticks=0
      for p in $(pgrep -P "$SERVER_PID"); do
        k=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status" 2>/dev/null); kb=$((kb + ${k:-0}))
      done
      for p in "$SERVER_PID" $(pgrep -P "$SERVER_PID"); do
        c=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null); ticks=$((ticks + ${c:-0}))
      done
      echo "$t $kb $ticks"; sleep 1
    done ) >"$OUT/$name-serve-rss.txt" &
  SAMPLER_PID=$!
  load_watch "$OUT/$name.load"
  started=$SECONDS
  "${IN[@]}" "$THRONG" attack --url "http://127.0.0.1:$port/ping" -H "sleep: $sleep_ms" --rate "$rate/s" --duration "${secs}s" \
    --max-lag 1s --max-connections "$cap" --timeout 300s --output "$OUT/$name-attack.jsonl" --format json \
    >"$OUT/$name.json" 2>"$OUT/$name.err"
  rc=$?; echo "$rc" >"$OUT/$name.rc"
  echo "  exit $rc after $((SECONDS - started)) s"
  load_stop
  kill "$SAMPLER_PID" 2>/dev/null; SAMPLER_PID=
  kill -TERM "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; SERVER_PID=
  netns_down
  grep -E '^  (workers|max connections|TIMEOUT|thresholds)' "$OUT/$name.err" | sed 's/^/  /'
  grep 'threshold passed' "$OUT/$name.err" | sed 's/^/  /'
}
has sleep-100k && sleepers sleep-100k 4000 50 50000 110000
has sleep-1m && sleepers sleep-1m 10000 200 200000 1050000

echo
echo "== the table ($(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
machine_line
autogroup_line
python3 - "$OUT" "$FLOOR_NS" <<'EOF'
import glob, json, os, sys
out, floor = sys.argv[1], sys.argv[2].split()
def load(name):
    try:
        return float(open(f"{out}/{name}.load").read().split()[0])
    except (OSError, IndexError, ValueError):
        return float("nan")
size = lambda n: f"{n // 1000000}M" if n % 1000000 == 0 else f"{n // 1000}k"
rows = []
for name in ["ws-20k", "ws-100k", "ws-200k", "ws-300k", "ws-500k", "ws-1m", "ws-500k-10"]:
    path = f"{out}/{name}.json"
    if not os.path.exists(path):
        continue
    try:
        r = json.load(open(path))
    except ValueError:
        print(f"{name}: no summary (see {out}/{name}.err)")
        continue
    m, dc = r["memory"], r.get("delivery_cpu", {})
    last = " ".join(f"{x['last_subscriber_us'] / 1e6:.1f}" for x in r["messages"])
    limit = r["limits"][0] if r.get("limits") else None
    rows.append((name, r))
    print(f"{name:<11} {r['verdict']:<4} held {r['held']:>7} of {r['connections']:<7} failed {r['failed']:<5} "
          f"lost {r['lost']:<5} {r['received']}/{r['expected']} delivered  connect {r['connect_rate']:.0f}/s")
    print(f"{'':<11} memory per connection: server {m['server_per_connection']:.0f} B, harness "
          f"{m['harness_per_connection']:.0f} B, kernel {m['kernel_per_connection'] / 1024:.2f} KiB; "
          f"last subscriber (s) per message: {last}")
    print(f"{'':<11} CPU per delivery: server {dc.get('server_ns', 0) / 1e3:.2f} µs, harness "
          f"{dc.get('harness_ns', 0) / 1e3:.2f} µs" + (f" (bare write(2) {int(floor[0]) / 1e3:.2f} µs)" if floor else "")
          + f"; elapsed {r['elapsed_s']:.0f} s; load average up to {load(name):.1f}")
    if dc.get("server_fanout_ns") is not None:
        print(f"{'':<11} idle between fan-outs: server {100 * dc['server_idle_cores']:.1f}%, harness "
              f"{100 * dc['harness_idle_cores']:.1f}% of a core; per delivery above it: server "
              f"{dc['server_fanout_ns'] / 1e3:.2f} µs, harness {dc['harness_fanout_ns'] / 1e3:.2f} µs")
    cc = r.get("connect_cpu", {})
    if cc.get("opened"):
        print(f"{'':<11} CPU per connection opened: server {cc['server_ns'] / 1e3:.1f} µs, harness "
              f"{cc['harness_ns'] / 1e3:.1f} µs: at these costs the cores open at most ~{cc['ceiling_per_s']:.0f}/s")
    print(f"{'':<11} first limit: " + (f"{limit['name']} at {limit['at_s']:.0f} s ({limit['detail']})" if limit else "none reached"))
    for f in r.get("failures", []):
        print(f"{'':<11} FAIL: {f}")
small = dict(rows).get("ws-100k"); big = dict(rows).get("ws-1m")
if small and big:
    a = max(x["last_subscriber_us"] for x in small["messages"]) or 1
    b = max(x["last_subscriber_us"] for x in big["messages"])
    print(f"fan-out 100k -> 1M: last subscriber {a / 1e6:.2f} s -> {b / 1e6:.2f} s, x{b / a:.1f} for x10 subscribers")
# The growth by size: each size's slowest last subscriber, and its time per
# subscriber against 100k's (1.00 = linear).
sizes = [(r["connections"], r) for n, r in rows if n != "ws-500k-10" and r.get("messages")]
if small and len(sizes) > 2:
    base = (max(x["last_subscriber_us"] for x in small["messages"]) or 1) / small["connections"]
    line = []
    for n, r in sorted(sizes, key=lambda x: x[0]):
        t = max(x["last_subscriber_us"] for x in r["messages"])
        line.append(f"{size(n)} {t / 1e6:.2f} s ({t / n / base:.2f})")
    print("fan-out by size: last subscriber (against linear from 100k): " + ", ".join(line))
# The kernel's own fan-out (fanout_floor) at the same sizes, and throng's
# growth beside it, each size by its median (throng: of its messages; the
# kernel: of its rounds).
med = lambda v: sorted(v)[len(v) // 2]
kernel = {}
for name in ["kernel-20k", "kernel-100k", "kernel-200k", "kernel-300k", "kernel-500k", "kernel-1m"]:
    try:
        k = json.load(open(f"{out}/{name}.json"))
    except (OSError, ValueError):
        if os.path.exists(f"{out}/{name}.err"):
            print(f"{name}: no result (see {out}/{name}.err)")
        continue
    kernel[k["conns"]] = k
    rounds = " ".join(f"{x:.2f}" for x in k["last_byte_s"])
    print(f"{name:<11} last byte (s) per round: {rounds}; median {k['median_last_byte_s']:.2f} s")
    print(f"{'':<11} CPU per delivery (median): writers {k['median_writer_cpu_ns_per_delivery'] / 1e3:.2f} µs, "
          f"readers {k.get('median_reader_cpu_ns_per_delivery', 0) / 1e3:.2f} µs, "
          f"the machine {k['median_machine_cpu_ns_per_delivery'] / 1e3:.2f} µs; {k['processes_a_side']} processes a side ({k.get('layout', 'paired')}); "
          f"load average up to {load(name):.1f}")
ours = {r["connections"]: med([x["last_subscriber_us"] / 1e6 for x in r["messages"]])
        for n, r in rows if n != "ws-500k-10" and r.get("messages")}
theirs = {n: k["median_last_byte_s"] for n, k in kernel.items()}
def growth(times):
    if 100000 not in times or len(times) < 2:
        return None
    base = times[100000] / 100000 or 1
    return ", ".join(f"{size(n)} {t:.2f} s ({t / n / base:.2f})" for n, t in sorted(times.items()))
if growth(ours) and growth(theirs):
    print("fan-out by size, medians (against linear from 100k): throng " + growth(ours))
    print("                                                 the kernel alone " + growth(theirs))
# throng against the kernel, size by size: time to the last subscriber
# (median of throng's messages) over the kernel's last byte (median of its
# rounds), and serve's CPU per delivery over the floor writers' (median):
# the fan-outs' own, less what serve spends holding its connections between
# them (pings, timers; the floor's writers do nothing between rounds), when
# the run left quiet seconds to measure that in, else the whole window's.
serve_cpu = {r["connections"]: (r.get("delivery_cpu", {}).get("server_fanout_ns")
                                or r.get("delivery_cpu", {}).get("server_ns"))
             for n, r in rows if n != "ws-500k-10"}
both = sorted(set(ours) & set(theirs))
if both:
    layouts = "/".join(sorted({kernel[n].get("layout", "paired") for n in both}))
    print(f"throng against the kernel's own fan-out (fanout_floor, layout {layouts}), same run; issue 33's bar: 1.25x and 1.10x")
    print(f"{'size':>6} {'throng: last subscriber':>24} {'kernel: last byte':>18} {'ratio':>6}"
          f" {'serve CPU/delivery':>19} {'writers CPU/delivery':>21} {'ratio':>6}")
    for n in both:
        s, w = serve_cpu.get(n), kernel[n].get("median_writer_cpu_ns_per_delivery")
        cpu = (f"{s / 1e3:>16.2f} µs {w / 1e3:>18.2f} µs {s / w:>5.2f}x" if s and w
               else f"{'-':>19} {'-':>21} {'-':>6}")
        print(f"{size(n):>6} {ours[n] * 1e3:>21.0f} ms {theirs[n] * 1e3:>15.0f} ms "
              f"{ours[n] / max(theirs[n], 1e-9):>5.2f}x {cpu}")
try:
    tax = {r["descriptors"]: r["machine_busy"] for r in json.load(open(f"{out}/fd-tax.json"))}
except (OSError, ValueError):
    tax = {}
if tax:
    base = tax.get(0, 0)
    small, big = max(tax.get(200000, 0) - base, 0), max(tax.get(2000000, 0) - base, 0)
    print(f"fd-tax: other programs spend {100 * small:.1f}% of the machine while 200,000 descriptors are open "
          f"(100k connections) and {100 * big:.1f}% at 2,000,000 (a million), over {100 * base:.1f}% idle: a linear "
          f"fan-out would measure x{10 * (1 - small) / max(1 - big, 0.01):.1f} from 100k to 1M here")
if 100000 in ours and 1000000 in ours and 100000 in theirs and 1000000 in theirs:
    a, b = ours[1000000] / ours[100000], theirs[1000000] / theirs[100000]
    print(f"fan-out 100k -> 1M, medians: throng x{a:.1f}, the kernel alone x{b:.1f} in the same run "
          f"(throng {ours[1000000] / theirs[1000000]:.2f}x the kernel's time at 1M, {ours[100000] / theirs[100000]:.2f}x at 100k)")
for name in ["sleep-100k", "sleep-1m"]:
  path = f"{out}/{name}.json"
  if os.path.exists(path):
      try:
          s = json.load(open(path))
      except ValueError:
          s = None
          print(f"{name}: no summary (see {out}/{name}.err)")
      if s:
          # Each side's RSS at the second with the most requests in flight.
          inflight, attack_rss, cpu = {}, {}, {}
          for line in open(f"{out}/{name}-attack.jsonl"):
              rec = json.loads(line)
              if rec.get("type") != "interval":
                  continue
              t = rec["start_ns"]
              if rec["source"].endswith("-supervisor"):
                  host = rec.get("host") or {}
                  attack_rss[t] = sum(b for l, b in host.get("rss_bytes", []) if "/attack-" in l and not l.endswith("supervisor"))
                  if "cpu_all_ns" in host:
                      cpu[t] = (host["at_ns"], host["cpu_all_ns"], host["cpu_busy_ns"],
                                sum(ns for l, ns in host.get("cpu_ns", []) if "/attack-" in l))
              else:
                  inflight[t] = inflight.get(t, 0) + rec.get("gauges", {}).get("requests.in_flight", 0)
          times = sorted(t for t in inflight if t in attack_rss)
          peak_t = max(times, key=lambda t: inflight[t])
          n = inflight[peak_t]
          first = times[0]
          serve = [tuple(map(int, l.split())) for l in open(f"{out}/{name}-serve-rss.txt") if len(l.split()) >= 2]
          near = lambda t: min(serve, key=lambda x: abs(x[0] - t))[1] * 1024
          srv_before = serve[0][1] * 1024
          a_b = (attack_rss[peak_t] - attack_rss[first]) / max(n - inflight[first], 1)
          s_b = (near(peak_t) - srv_before) / max(n, 1)
          ok = s["status"].get("200", 0)
          timeouts = s["errors"].get("timeout", 0)
          # The attack's own thresholds (--max-lag 1s: the harness kept to its
          # schedule within the 1 s lag 'throng bench' allows its connects).
          rc = open(f"{out}/{name}.rc").read().strip() if os.path.exists(f"{out}/{name}.rc") else "?"
          verdict = "PASS" if ok == s["requests"] and not s["errors"] and rc == "0" else "FAIL"
          print(f"{name:<11} {verdict:<4} {s['requests']} requests, {ok} answered, {timeouts} timeouts, "
                f"other errors {sum(v for k, v in s['errors'].items() if k != 'timeout')}; most in flight {n} "
                f"(summary's peak {s['peak_in_flight']})")
          print(f"{'':<11} started late (> {s['late_threshold_us'] / 1000:.0f} ms): {s['late']}; lag p99 "
                f"{s['lag_us']['p99'] / 1000:.1f} ms, max {s['lag_us']['max'] / 1000:.1f} ms; latency p50 "
                f"{s['latency_us']['p50'] / 1e6:.1f} s, max {s['latency_us']['max'] / 1e6:.1f} s")
          print(f"{'':<11} memory per request in flight: attack {a_b:.0f} B, serve {s_b:.0f} B; "
                f"load average up to {load(name):.1f}")
          # Who had the CPU: the machine's busy share, the attack's, the server's, the rest.
          spans = sorted(cpu.values())
          ticked = [x for x in serve if len(x) == 3]
          if len(spans) >= 2 and len(ticked) >= 2:
              (a0, all0, busy0, att0), (a1, all1, busy1, att1) = spans[0], spans[-1]
              inside = [x for x in ticked if a0 <= x[0] <= a1] or ticked
              hz = os.sysconf("SC_CLK_TCK")
              srv = (inside[-1][2] - inside[0][2]) / hz * 1e9 * (a1 - a0) / max(inside[-1][0] - inside[0][0], 1)
              total = max(all1 - all0, 1)
              busy, att = (busy1 - busy0) / total, (att1 - att0) / total
              print(f"{'':<11} CPU over the run ({(a1 - a0) / 1e9:.0f} s): the machine {100 * busy:.0f}% busy: "
                    f"attack {100 * att:.0f}%, serve {100 * srv / total:.0f}%, other programs "
                    f"{100 * max(busy - att - srv / total, 0):.0f}%")
EOF
