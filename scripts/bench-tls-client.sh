#!/usr/bin/env bash
# Benchmark of the TLS client of `throng hold` (wss://) and `throng attack`
# (https://) against HAProxy (Debian) terminating TLS in front of a plain
# `throng serve`, on this machine, loopback only. The certificate is an
# ECDSA P-256 one made here with the openssl CLI.
#
#   scripts/bench-tls-client.sh                 build (release) and run both parts
#   scripts/bench-tls-client.sh memory|attack   one part only
#   N=15000 RATE=600/s SECS=5 ROUNDS=3 scripts/bench-tls-client.sh
#
# 1. memory: user-space memory per idle held connection of one `throng hold`
#    worker: its RSS with N connections open minus with 1, over N-1; for
#    wss:// through HAProxy and, in the same run, for ws:// straight to
#    throng serve (the plain figure must stay <= 1 KiB). Two HAProxy
#    processes (N/2 connections each) because each process may open at most
#    20,000 files and HAProxy needs two per connection.
# 2. attack: https requests/s through HAProxy with keep-alive, and the rate
#    of new TLS connections with a new connection per request
#    (--no-keepalive), throng attack and wrk alternating, ROUNDS rounds each;
#    medians and the throng/wrk ratio. wrk's OpenSSL client resumes its TLS
#    session on every new connection (HAProxy's own counter, printed after
#    each run, says so), so throng runs with --tls-resume beside it, and
#    alone without it: the rate of full handshakes. Generator, HAProxy and
#    throng serve share the machine's cores: figures are comparable within a
#    run only.
#
# Every run is bounded (--duration, timeouts) and everything started here is
# stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
what=${1:-all}
N=${N:-12000}
SECS=${SECS:-5}
ROUNDS=${ROUNDS:-3}
# Connections per second while filling the hold: about what HAProxy's TLS
# handshakes sustain on 2 shared cores, so handshakes do not pile up (a
# pile of thousands in flight leaves the heap more fragmented).
RATE=${RATE:-600/s}
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-tls.XXXXXX)}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
ulimit -n "$(ulimit -Hn)"
for tool in haproxy openssl wrk python3 curl; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed (scripts/test.sh installs it)" >&2; exit 1; }
done

cargo build --release -q -p throng
BIN=$CARGO_TARGET_DIR/release/throng
echo "binary: $BIN; results in $OUT"
machine_line

PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# The certificate: a CA and an ECDSA P-256 server certificate it signs.
(
  cd "$OUT"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -subj /CN=throng-bench-ca -keyout ca.key -out ca.pem 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=localhost \
    -keyout server.key -out server.csr 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\n' > ext.cnf
  openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile ext.cnf -out server.pem 2>/dev/null
  cat server.pem server.key > haproxy.pem
)

backend=$(free_ports 1)
"$BIN" serve --listen "127.0.0.1:$backend" --workers 1 --ping-interval 5m --json \
  > "$OUT/serve.json" 2> "$OUT/serve.log" &
PIDS+=($!)
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$backend/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
tls_first=$(free_ports 2)
per=$(( (N + 1) / 2 + 100 ))
for k in 0 1; do
  port=$((tls_first + k))
  cat > "$OUT/haproxy-$k.cfg" <<EOF
global
  maxconn $per
  stats socket $OUT/haproxy-$k.sock level user
defaults
  mode tcp
  timeout connect 5s
  timeout client 5m
  timeout server 5m
frontend tls
  bind 127.0.0.1:$port ssl crt $OUT/haproxy.pem
  default_backend app
backend app
  server s1 127.0.0.1:$backend
EOF
  haproxy -db -f "$OUT/haproxy-$k.cfg" > "$OUT/haproxy-$k.log" 2>&1 &
  PIDS+=($!)
done
for _ in $(seq 100); do
  curl -sfk "https://127.0.0.1:$((tls_first + 1))/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done
echo "throng serve (1 worker) on 127.0.0.1:$backend; HAProxy $(haproxy -v | awk 'NR == 1 {print $3}') TLS (P-256) on 127.0.0.1:$tls_first-$((tls_first + 1)) (2 processes, maxconn $per each)"

if [ "$what" = all ] || [ "$what" = memory ]; then
echo
echo "== 1. memory per idle held connection, one hold worker, N=1 then N=$N at $RATE"
hold_mem() { # name url tls-args...
  local name=$1 url=$2; shift 2
  timeout 120 "$BIN" hold "$url" -c 1 -w 1 --duration 2s -q "$@" -o "$OUT/$name-1.jsonl" > /dev/null 2>&1
  timeout 300 "$BIN" hold "$url" -c "$N" -w 1 --rate "$RATE" --duration 4s -q --json "$@" \
    -o "$OUT/$name-n.jsonl" > "$OUT/$name-n.json" 2> "$OUT/$name-n.err"
  local r1 rn
  r1=$(rss_at_plateau "$OUT/$name-1.jsonl" 1)
  rn=$(rss_at_plateau "$OUT/$name-n.jsonl" "$N")
  python3 - "$OUT/$name-n.json" "$name" "$r1" "$rn" "$N" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1])); name, r1, rn, n = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
tls = s["connect_tls_us"]
extra = f", TLS handshake p50 {tls['p50']} µs ({s['tls_full']} full)" if tls["count"] else ""
print(f"  {name:>4}: opened {s['opened']}/{n}, failed {sum(s['failed'].values())}{extra}")
if r1 == "none" or rn == "none":
    print(f"  {name:>4}: no interval with all {n} open: see {sys.argv[1]}")
else:
    per = (int(rn) - int(r1)) / (n - 1)
    print(f"  {name:>4}: worker RSS N=1 {int(r1)} bytes, N={n} {int(rn)} bytes: {per:.0f} bytes per idle connection")
    open(sys.argv[1] + ".per", "w").write(f"{per:.0f}\n")
EOF
}
hold_mem ws "ws://127.0.0.1:$backend/mem"
hold_mem wss "wss://127.0.0.1:$tls_first-$((tls_first + 1))/mem" --tls-insecure
if [ -s "$OUT/ws-n.json.per" ] && [ -s "$OUT/wss-n.json.per" ]; then
  awk -v p="$(cat "$OUT/ws-n.json.per")" -v t="$(cat "$OUT/wss-n.json.per")" \
    'BEGIN {printf "  per idle connection: ws %d bytes (target <= 1024), wss %d bytes, TLS adds %d bytes\n", p, t, t - p}'
fi
fi
[ "$what" = all ] || [ "$what" = attack ] || exit 0

echo
echo "== 2. https through HAProxy: throng attack vs wrk, ${SECS}s per run, $ROUNDS rounds alternating"
url="https://localhost:$tls_first/ping"
run_pair() { # label conns keepalive(yes/no) [throng options...]
  local label=$1 c=$2 keep=$3 ta=() wa=()
  shift 3
  ta=("$@")
  [ "$keep" = no ] && { ta+=(--no-keepalive); wa=(-H 'Connection: close'); }
  : > "$OUT/$label-throng.txt"; : > "$OUT/$label-wrk.txt"
  for round in $(seq "$ROUNDS"); do
    local w=0 wr=-
    if [ "$label" != full ]; then
      timeout $((SECS + 60)) wrk -t1 -c"$c" -d"${SECS}s" "${wa[@]}" "$url" > "$OUT/$label-wrk.out" 2>&1 || true
      w=$(awk '/^Requests\/sec/ {print $2}' "$OUT/$label-wrk.out")
      wr=$(reuse)
      echo "${w:-0}" >> "$OUT/$label-wrk.txt"
    fi
    timeout $((SECS + 60)) "$BIN" attack --url "$url" --max --connections "$c" --workers 1 \
      --duration "${SECS}s" --tls-ca "$OUT/ca.pem" "${ta[@]}" --format json -q \
      > "$OUT/$label-throng.json" 2> "$OUT/$label-throng.err" || true
    python3 - "$OUT/$label-throng.json" "$round" "$label" "$c" "${w:-0}" "$wr" "$(reuse)" >> "$OUT/$label-throng.txt" <<'EOF'
import json, sys
path, rnd, label, c, w, wr, tr = sys.argv[1:8]
try:
    s = json.load(open(path))
except Exception:
    print(0); sys.stderr.write(f"  round {rnd} {label}: throng attack gave no summary, see {path}\n"); sys.exit()
errs = sum(s["errors"].values())
tls = s["connect_tls_us"]
wrk = f";  wrk {float(w):8.0f} req/s (HAProxy: {wr}% resumed)" if label != "full" else ""
sys.stderr.write(f"  round {rnd} {label:<10} c={c}: throng {s['throughput']:8.0f} req/s "
                 f"({s['connections_opened']} connections, {s['tls_full']} full + {s['tls_resumed']} resumed handshakes, "
                 f"handshake p50 {tls['p50']} µs, errors {errs}; HAProxy: {tr}% resumed){wrk}\n")
print(f"{s['throughput']:.0f}")
EOF
  done
  local t w
  t=$(median < "$OUT/$label-throng.txt")
  if [ "$label" = full ]; then
    echo "  median $label: throng attack $t req/s (a new connection and a full handshake each)"
    return
  fi
  w=$(median < "$OUT/$label-wrk.txt")
  awk -v t="$t" -v w="$w" -v l="$label" \
    'BEGIN {printf "  median %s: throng attack %.0f req/s, wrk %.0f req/s, ratio %.2f\n", l, t, w, (w > 0 ? t / w : 0)}'
}
run_pair keepalive 64 yes
run_pair resumed 32 no --tls-resume
run_pair full 32 no
