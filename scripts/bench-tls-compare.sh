#!/usr/bin/env bash
# Before/after for a change to throng serve's TLS: runs two (or more)
# `throng` binaries side by side, taking turns, with the one client of
# scripts/bench-tls.sh (throng-bench's tls_bench), and prints per binary:
#   handshakes   new TLS connections per second (full handshake, one
#                GET /healthz, close; ECDSA P-256) and the server's CPU per
#                handshake, each round
#   requests     GET /healthz per second over 4 kept-alive TLS connections
#                and the server's CPU per request, each round
#   https_idle   user-space memory per idle kept-alive https connection
#                (N connections, one GET each, one worker; RSS delta / N)
#
#   scripts/bench-tls-compare.sh [--rounds 4] [--secs 4] [--conns 5000] BIN_BEFORE BIN_AFTER [BIN...]
#
# Build the "before" binary from the earlier commit (e.g. in a git worktree)
# and pass both paths. Every run is bounded by --secs or --conns.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
ROUNDS=4 SECS=4 CONNS=5000
BINS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --secs) SECS=$2; shift 2 ;;
    --conns) CONNS=$2; shift 2 ;;
    -*) echo "unknown option $1 (--rounds R --secs S --conns N)" >&2; exit 2 ;;
    *) BINS+=("$1"); shift ;;
  esac
done
[ "${#BINS[@]}" -ge 2 ] || { echo "give two or more throng binaries to compare" >&2; exit 2; }
for b in "${BINS[@]}"; do [ -x "$b" ] || { echo "$b is not an executable" >&2; exit 2; }; done
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-tls-compare.XXXXXX)}
mkdir -p "$OUT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
ulimit -n "$(ulimit -Hn)"
cargo build --release -q -p throng-bench --bin tls_bench
CLIENT=$CARGO_TARGET_DIR/release/tls_bench
echo "results in $OUT"
machine_line
openssl req -x509 -nodes -days 2 -subj /CN=localhost -newkey ec -pkeyopt ec_paramgen_curve:P-256 \
  -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -keyout "$OUT/key.pem" -out "$OUT/cert.pem" 2>/dev/null

PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true' EXIT

# CPU seconds used so far by process $1 and its children.
cpu_secs() {
  python3 - "$1" <<'EOF'
import os, sys
root, total = sys.argv[1], 0
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    if pid == root or f[1] == root:
        total += int(f[11]) + int(f[12])
print(total / os.sysconf("SC_CLK_TCK"))
EOF
}

# Starts BIN with WORKERS workers; sets PLAIN, TLS, SERVER.
start() { # bin workers
  PLAIN=$(free_port); TLS=$(free_port)
  "$1" serve --workers "$2" --listen "127.0.0.1:$PLAIN" --tls-listen "127.0.0.1:$TLS" \
    --tls-cert "$OUT/cert.pem" --tls-key "$OUT/key.pem" --ping-interval 10000h > /dev/null 2>>"$OUT/serve.log" &
  SERVER=$!; PIDS+=("$SERVER")
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PLAIN/healthz" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "$1 did not come up" >&2; exit 1
}

# One measured turn: prints "rate cpu_us_per_op".
turn() { # pid tls-port mode rate-key
  local c0 c1 out
  c0=$(cpu_secs "$1")
  out=$("$CLIENT" "$3" --target "127.0.0.1:$2" --secs "$SECS" --threads 4)
  c1=$(cpu_secs "$1")
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d[sys.argv[4]], round((float(sys.argv[3]) - float(sys.argv[2])) * 1e6 / d["completed"], 1))' \
    "$out" "$c0" "$c1" "$4"
}

for mode in handshakes requests; do
  key=$([ "$mode" = handshakes ] && echo handshakes_per_sec || echo requests_per_sec)
  declare -a SRV=() PORT=()
  for i in "${!BINS[@]}"; do start "${BINS[$i]}" 2; SRV[$i]=$SERVER; PORT[$i]=$TLS; done
  sleep 0.5
  for r in $(seq "$ROUNDS"); do
    for i in "${!BINS[@]}"; do
      echo "$mode ${BINS[$i]} round $r: $(turn "${SRV[$i]}" "${PORT[$i]}" "$mode" "$key")" | tee -a "$OUT/$mode.txt"
    done
  done
  for i in "${!BINS[@]}"; do kill "${SRV[$i]}"; wait "${SRV[$i]}" 2>/dev/null || true; done
done

for i in "${!BINS[@]}"; do
  start "${BINS[$i]}" 1
  sleep 0.5
  worker=$(curl -s "http://127.0.0.1:$PLAIN/metrics" | sed -n 's/^throng_worker_rss_bytes{.*pid="\([0-9]*\)".*/\1/p' | head -1)
  bytes=$("$CLIENT" idle --target "127.0.0.1:$TLS" --conns "$CONNS" --pid "$worker" --threads 4 |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["user_bytes_per_conn"], "B per idle kept-alive https connection;", d["connections"], "opened,", d["failed"], "failed")')
  echo "https_idle ${BINS[$i]}: $bytes" | tee -a "$OUT/https_idle.txt"
  kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
done

echo
echo "medians (rate, server CPU us per operation):"
for mode in handshakes requests; do
  for b in "${BINS[@]}"; do
    rate=$(grep -F "$mode $b round" "$OUT/$mode.txt" | awk '{print $(NF-1)}' | median)
    cpu=$(grep -F "$mode $b round" "$OUT/$mode.txt" | awk '{print $NF}' | median)
    echo "  $mode  $b: $rate/s, $cpu us"
  done
done
