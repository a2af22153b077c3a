# Helpers shared by the scripts/bench-*.sh benchmarks (sourced, not run).

# One line about the machine, for the record of every run.
machine_line() {
  echo "machine: $(nproc) cores, $(free -m | awk '/^Mem:/ {print $7}') MiB available; $(uptime | sed 's/.*load/load/')"
}

# For the scripts that drive serve_bench (one client holding every
# subscriber): refuses more than 20,000 subscribers ($1), builds the server
# (with its bench floor) and the client, and sets THRONG, CLIENT and OUT
# (a new directory under /tmp named after $2 unless OUT is set).
serve_bench_setup() { # conns name
  if [ "$1" -gt 20000 ]; then
    echo "--conns $1: this client holds every subscriber; stay at 20000 or under" >&2
    exit 2
  fi
  local target=${CARGO_TARGET_DIR:-target}
  cargo build --quiet --release -p throng --features bench-floor
  cargo build --quiet --release -p throng-bench --bin serve_bench
  THRONG=$target/release/throng
  CLIENT=$target/release/serve_bench
  OUT=${OUT:-$(mktemp -d "/tmp/throng-bench-$2.XXXXXX")}
  mkdir -p "$OUT"
  echo "results in $OUT"
  machine_line
}

# The median of the numbers on stdin, one per line.
median() { sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

# A free port on 127.0.0.1.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# A free range of N consecutive ports on 127.0.0.1.
free_ports() {
  python3 - "$1" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(500):
    first = random.randint(20000, 30000 - n)
    socks = []
    try:
        for p in range(first, first + n):
            s = socket.socket(); s.bind(("127.0.0.1", p)); socks.append(s)
        print(first); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
EOF
}

# From a result file: the worker's RSS in the last interval where all N were open.
rss_at_plateau() { # file n
  python3 - "$1" "$2" <<'EOF'
import json, sys
path, n = sys.argv[1], int(sys.argv[2])
opened, rss = {}, {}
for line in open(path):
    r = json.loads(line)
    if r.get("type") != "interval": continue
    s = r["start_ns"]
    if r["source"].endswith("/hold-supervisor"):
        for label, b in (r.get("host") or {}).get("rss_bytes", []):
            # 0: the worker had exited by the sample (an SSE hold ends at once).
            if label.endswith("/hold-0") and b > 0: rss[s] = b
    else:
        opened[s] = opened.get(s, 0) + r.get("gauges", {}).get("connections.open", 0)
full = [s for s in sorted(opened) if opened[s] == n and s in rss]
print(rss[full[-1]] if full else "none")
EOF
}
