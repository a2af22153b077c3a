#!/usr/bin/env bash
# TLS benchmark of `throng serve` beside HAProxy (Debian) terminating TLS in
# front of a plain `throng serve` (issue 7). One client for both servers:
# crates/throng-bench/src/bin/tls_bench.rs (rustls on ring; it trusts any
# certificate and checks no signature, so the crypto measured is the server's).
#
#   scripts/bench-tls.sh [--conns 15000] [--secs 5] [--threads 4] [--rounds 10] [--repeat 3]
#                        [--part idle|handshakes|requests|states|plain]...   (default: the first four)
#                        [--bin THRONG]...   (states, plain: the binaries to compare; default the one built)
#
# Prints one JSON object per measurement, then a summary:
#   rustls_heap            live heap rustls holds per idle server connection,
#                          buffered ServerConnection vs UnbufferedServerConnection
#                          (throng-bench's tls_mem, counting allocator)
#   idle_throng_tls        throng worker RSS delta / N with N idle wss subscribers
#                          (one worker), plus fan-out CPU per frame to them
#   idle_throng_plain      the same with N plain ws subscribers (fresh server)
#   idle_haproxy_tls       HAProxy RSS delta / N with N idle keep-alive TLS
#                          connections (one GET each; HAProxy cannot hold N
#                          WebSocket connections here: it would need 2N files,
#                          over this machine's 20,000-per-process limit)
#   handshakes_*           new TLS connections per second (full handshake, one
#                          GET /healthz, close) for an ECDSA P-256 and an RSA
#                          2048 certificate; HAProxy answers /healthz itself;
#                          with the server's CPU per handshake. The servers
#                          take turns --repeat times; the summary has medians,
#                          and the client's own CPU per handshake (it shares
#                          the cores, so it caps the rates both servers see)
#   requests_*             GET /healthz per second over kept-alive TLS
#                          connections; HAProxy forwards to throng (plain)
#   idle_state_*           throng worker RSS delta / N with N idle TLS
#                          connections in each state (one worker, a fresh
#                          server each): a wss subscriber (ws), waiting for
#                          its first request (waiting), kept alive after one
#                          GET /healthz (kept), an SSE subscriber (sse); the
#                          states take turns --repeat times, and so do the
#                          --bin binaries (before/after a change, same run)
#   plain_state_*          the same on the plain listener (no TLS; not in the
#                          default parts): waiting for its first request
#                          (waiting), kept alive after one GET /healthz
#                          (kept), a ws subscriber (ws)
# Both servers get the same 2 cores (throng: 2 workers; HAProxy: 2 threads)
# as the client; every run is bounded by --secs or by N.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
CONNS=15000 SECS=5 THREADS=4 ROUNDS=10 REPEAT=3 PARTS="" BINS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --part)
      case "$2" in idle|handshakes|requests|states|plain) PARTS="$PARTS $2" ;; *) echo "--part is idle, handshakes, requests, states or plain" >&2; exit 2 ;; esac
      shift 2 ;;
    --bin) [ -x "$2" ] || { echo "--bin $2 is not an executable" >&2; exit 2; }; BINS+=("$2"); shift 2 ;;
    --conns) CONNS=$2; shift 2 ;;
    --secs) SECS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    *) echo "unknown argument $1 (--conns N --secs S --threads T --rounds R --repeat K --part P --bin THRONG)" >&2; exit 2 ;;
  esac
done
PARTS=${PARTS:- idle handshakes requests states}
part() { [[ " $PARTS " == *" $1 "* ]]; }
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-tls.XXXXXX)}
mkdir -p "$OUT"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
ulimit -n "$(ulimit -Hn)"
command -v haproxy >/dev/null || { echo "haproxy is missing (apt-get install haproxy)" >&2; exit 1; }
command -v openssl >/dev/null || { echo "openssl is missing (apt-get install openssl)" >&2; exit 1; }

cargo build --release -q -p throng
cargo build --release -q -p throng-bench --bin tls_bench --bin tls_mem
BIN=$CARGO_TARGET_DIR/release/throng
[ "${#BINS[@]}" -gt 0 ] || BINS=("$BIN")
CLIENT=$CARGO_TARGET_DIR/release/tls_bench
echo "results in $OUT" >&2
machine_line >&2

# Certificates: ECDSA P-256 and RSA 2048, end-entity, for localhost.
for kind in ec rsa; do
  if [ "$kind" = rsa ]; then newkey=(-newkey rsa:2048); else newkey=(-newkey ec -pkeyopt ec_paramgen_curve:P-256); fi
  openssl req -x509 -nodes -days 2 -subj /CN=localhost "${newkey[@]}" \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" -addext "basicConstraints=critical,CA:FALSE" \
    -keyout "$OUT/$kind-key.pem" -out "$OUT/$kind-cert.pem" 2>/dev/null
  cat "$OUT/$kind-cert.pem" "$OUT/$kind-key.pem" > "$OUT/$kind-haproxy.pem"
done

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

wait_http() { # port
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$1/healthz" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "server on $1 did not come up" >&2; exit 1
}

# Starts throng serve: $1 workers, $2 cert kind ("" for no TLS), then any
# further options. Sets
# PLAIN, TLS, SERVER, WORKER (the first worker's pid).
start_throng() {
  PLAIN=$(free_port); TLS=$(free_port)
  local tls=()
  [ -n "$2" ] && tls=(--tls-listen "127.0.0.1:$TLS" --tls-cert "$OUT/$2-cert.pem" --tls-key "$OUT/$2-key.pem")
  "$BIN" serve --workers "$1" --listen "127.0.0.1:$PLAIN" "${tls[@]}" "${@:3}" --ping-interval 10000h --json \
    > "$OUT/serve-$PLAIN.json" 2> "$OUT/serve-$PLAIN.log" &
  SERVER=$!; PIDS+=("$SERVER")
  wait_http "$PLAIN"
  sleep 0.5
  WORKER=$(curl -s "http://127.0.0.1:$PLAIN/metrics" | sed -n 's/^throng_worker_rss_bytes{.*pid="\([0-9]*\)".*/\1/p' | head -1)
}
stop_throng() { kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; }

# Starts HAProxy with $1 cert kind; with $2 = proxy, /healthz goes to the
# throng on port $3, else HAProxy answers it. Sets HA (port) and HAPID.
start_haproxy() {
  HA=$(free_port)
  local cfg="$OUT/haproxy-$HA.cfg" route
  if [ "$2" = proxy ]; then
    route="default_backend be"
  else
    route='http-request return status 200 content-type text/plain string "ok" if { path /healthz }'
  fi
  cat > "$cfg" <<EOF
global
  maxconn $((CONNS + 1000))
  nbthread 2
  no strict-limits
  # The order throng serve chooses in (SHA-256 suites first: see
  # docs/tls.md), so both servers run the same cipher suite.
  ssl-default-bind-ciphersuites TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_256_GCM_SHA384
  ssl-default-bind-ciphers ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305:ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-RSA-AES256-GCM-SHA384
defaults
  mode http
  timeout connect 5s
  timeout client 600s
  timeout server 600s
  timeout http-keep-alive 600s
  timeout http-request 10s
frontend fe
  bind 127.0.0.1:$HA ssl crt $OUT/$1-haproxy.pem alpn http/1.1
  $route
backend be
  http-reuse always
  server throng 127.0.0.1:${3:-1} maxconn 1000
EOF
  haproxy -f "$cfg" -db > "$OUT/haproxy-$HA.log" 2>&1 &
  HAPID=$!; PIDS+=("$HAPID")
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$HA") 2>/dev/null && break; sleep 0.1; done
  sleep 0.3
}
stop_haproxy() { kill "$HAPID" 2>/dev/null || true; wait "$HAPID" 2>/dev/null || true; }

# CPU seconds used so far by process $1 and its children (throng's
# supervisor and workers; HAProxy's one process).
cpu_secs() {
  python3 - "$1" <<'EOF'
import os, sys
root = sys.argv[1]
total = 0
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        continue
    f = stat.rsplit(")", 1)[1].split()
    if pid == root or f[1] == root:
        total += int(f[11]) + int(f[12])
print(total / os.sysconf("SC_CLK_TCK"))
EOF
}

# Runs the client ($2...) against server process $1; adds the server's CPU
# seconds during the run to the client's JSON.
measured() {
  local pid=$1; shift
  local c0 c1 out
  c0=$(cpu_secs "$pid")
  out=$("$CLIENT" "$@")
  c1=$(cpu_secs "$pid")
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["server_cpu_seconds"]=round(float(sys.argv[3])-float(sys.argv[2]),2); print(json.dumps(d))' "$out" "$c0" "$c1"
}

results="$OUT/results.jsonl"
: > "$results"
record() { # name json
  local line; line=$(printf '{"name":"%s","result":%s}' "$1" "$2")
  echo "$line" | tee -a "$results"
}

if part idle; then
  record rustls_heap "$("$CARGO_TARGET_DIR/release/tls_mem" --conns 2000 \
    --sign-key "$OUT/rsa-key.pem" --sign-key "$OUT/ec-key.pem")"
  # The same signatures with OpenSSL (HAProxy's library), for the RSA figures.
  record openssl_speed "$(openssl speed -seconds 2 rsa2048 ecdsap256 2>/dev/null | python3 -c '
import json, sys
out = {}
for line in sys.stdin:
    f = line.split()
    if line.startswith("rsa 2048 bits") and len(f) >= 7:
        out["openssl_sign_us_rsa2048"] = round(1e6 / float(f[5]), 1)
    if "(nistp256)" in line and len(f) >= 8:
        out["openssl_sign_us_ecdsa_p256"] = round(1e6 / float(f[6]), 1)
print(json.dumps(out))')"

  # Idle memory and fan-out: one worker holds every connection.
  start_throng 1 ec
  record idle_throng_tls "$("$CLIENT" idle --target "127.0.0.1:$TLS" --conns "$CONNS" --pid "$WORKER" --ws \
    --publish "127.0.0.1:$PLAIN" --rounds "$ROUNDS" --threads "$THREADS")"
  stop_throng
  start_throng 1 ""
  record idle_throng_plain "$("$CLIENT" idle --plain --target "127.0.0.1:$PLAIN" --conns "$CONNS" --pid "$WORKER" --ws \
    --publish "127.0.0.1:$PLAIN" --rounds "$ROUNDS" --threads "$THREADS")"
  stop_throng
  start_haproxy ec local
  record idle_haproxy_tls "$("$CLIENT" idle --target "127.0.0.1:$HA" --conns "$CONNS" --pid "$HAPID" --threads "$THREADS")"
  stop_haproxy
fi

if part handshakes; then
  # New handshakes per second, per certificate, same client. Both servers
  # run at once (the idle one costs nothing) and take turns, --repeat times,
  # so a change in the machine's other load hits both alike; medians.
  for kind in ec rsa; do
    start_throng 2 "$kind"
    start_haproxy "$kind" local
    for _ in $(seq "$REPEAT"); do
      record "handshakes_throng_$kind" "$(measured "$SERVER" handshakes --target "127.0.0.1:$TLS" --secs "$SECS" --threads "$THREADS")"
      record "handshakes_haproxy_$kind" "$(measured "$HAPID" handshakes --target "127.0.0.1:$HA" --secs "$SECS" --threads "$THREADS")"
    done
    stop_haproxy
    stop_throng
  done
fi

if part requests; then
  # Requests per second over kept-alive TLS: throng itself, and HAProxy in
  # front of a plain throng; taking turns too.
  start_throng 2 ec
  start_haproxy ec proxy "$PLAIN"
  for _ in $(seq "$REPEAT"); do
    record requests_throng "$(measured "$SERVER" requests --target "127.0.0.1:$TLS" --secs "$SECS" --threads "$THREADS")"
    record requests_haproxy_to_throng "$(measured "$HAPID" requests --target "127.0.0.1:$HA" --secs "$SECS" --threads "$THREADS")"
  done
  stop_haproxy
  stop_throng
fi

# Idle connections in each state a connection can wait in (the states
# after $3), N on one worker of a fresh server per measurement, recorded as
# $1_<state>; $2: tls or plain. --handshake-timeout long enough that none
# is closed while counted. The states take turns --repeat times, and so do
# the --bin binaries.
states_part() { # prefix tls|plain states...
  local prefix=$1 kind=$2; shift 2
  local cert=ec port flag=()
  if [ "$kind" = plain ]; then cert="" flag=(--plain); fi
  for r in $(seq "$REPEAT"); do
    for state in "$@"; do
      for b in "${BINS[@]}"; do
        BIN=$b start_throng 1 "$cert" --handshake-timeout 10m
        if [ "$kind" = plain ]; then port=$PLAIN; else port=$TLS; fi
        out=$("$CLIENT" idle "${flag[@]}" --target "127.0.0.1:$port" --conns "$CONNS" --pid "$WORKER" --state "$state" --threads "$THREADS")
        record "${prefix}_$state" "$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d["bin"]=sys.argv[2]; print(json.dumps(d))' "$out" "$b")"
        stop_throng
      done
    done
  done
  python3 - "$results" "$prefix" "$kind" "$*" "${BINS[@]}" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
prefix, kind, states = sys.argv[2], sys.argv[3], sys.argv[4].split()
target = "; target <= 4096" if kind == "tls" else ""
print(f"idle {kind.upper() if kind == 'tls' else kind} connections, user-space bytes per connection (medians{target}):", file=sys.stderr)
for b in sys.argv[5:]:
    row = []
    for state in states:
        v = [r["result"]["user_bytes_per_conn"] for r in runs
             if r["name"] == f"{prefix}_{state}" and r["result"].get("bin") == b]
        row.append(f"{state} {statistics.median(v):,.0f}" if v else f"{state} -")
    print(f"  {b}: " + ", ".join(row), file=sys.stderr)
EOF
}
# TLS beside a wss subscriber; plain: what a connection costs before it is
# a subscriber (issue 33: parked before its first request, as TLS ones are).
part states && states_part idle_state tls ws waiting kept sse
part plain && states_part plain_state plain ws waiting kept

python3 - "$results" <<'EOF'
import json, sys
import statistics
runs = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    runs.setdefault(d["name"], []).append(d["result"])
def g(name, key):
    """The median over the runs of `name` (one run: its value)."""
    vals = [x[key] for x in runs.get(name, []) if x.get(key) is not None]
    return statistics.median(vals) if vals else None
t, h = g("idle_throng_tls", "user_bytes_per_conn"), g("idle_haproxy_tls", "user_bytes_per_conn")
summary = {
    "conns": g("idle_throng_tls", "connections"),
    "throng_user_bytes_per_idle_tls_conn": t,
    "haproxy_user_bytes_per_idle_tls_conn": h,
    "throng_plain_user_bytes_per_idle_conn": g("idle_throng_plain", "user_bytes_per_conn"),
    "target_bytes_per_idle_tls_conn": 4096,
    "rustls_unbuffered_heap_bytes_per_conn_tls13": g("rustls_heap", "tls1.3_unbuffered_heap_bytes_per_conn"),
    "rustls_buffered_heap_bytes_per_conn_tls13": g("rustls_heap", "tls1.3_buffered_heap_bytes_per_conn"),
    "fanout_cpu_ns_per_frame_tls": g("idle_throng_tls", "fanout_cpu_ns_per_frame"),
    "fanout_cpu_ns_per_frame_plain": g("idle_throng_plain", "fanout_cpu_ns_per_frame"),
    "frames_missing": (g("idle_throng_tls", "frames_missing_or_out_of_order") or 0)
        + (g("idle_throng_plain", "frames_missing_or_out_of_order") or 0),
}
f, p = summary["fanout_cpu_ns_per_frame_tls"], summary["fanout_cpu_ns_per_frame_plain"]
if f and p:
    summary["fanout_tls_over_plain"] = round(f / p, 2)
for kind in ("ec", "rsa"):
    a, b = g(f"handshakes_throng_{kind}", "handshakes_per_sec"), g(f"handshakes_haproxy_{kind}", "handshakes_per_sec")
    summary[f"handshakes_per_sec_throng_{kind}"] = a
    summary[f"handshakes_per_sec_haproxy_{kind}"] = b
    if a and b:
        summary[f"handshakes_ratio_{kind}"] = round(a / b, 2)
    # Server CPU per handshake: what the rate would be per core with the
    # client elsewhere (the client shares these 2 cores).
    for who in ("throng", "haproxy"):
        us = [d["server_cpu_seconds"] * 1e6 / d["completed"]
              for d in runs.get(f"handshakes_{who}_{kind}", []) if d.get("completed")]
        if us:
            summary[f"server_cpu_us_per_handshake_{who}_{kind}"] = round(statistics.median(us), 1)
    for who in ("throng", "haproxy"):
        us = [d["client_cpu_seconds"] * 1e6 / d["completed"]
              for d in runs.get(f"handshakes_{who}_{kind}", []) if d.get("completed")]
        if us:
            summary[f"client_cpu_us_per_handshake_{who}_{kind}"] = round(statistics.median(us), 1)
    t_us = summary.get(f"server_cpu_us_per_handshake_throng_{kind}")
    h_us = summary.get(f"server_cpu_us_per_handshake_haproxy_{kind}")
    if t_us and h_us:
        summary[f"handshakes_per_cpu_second_ratio_{kind}"] = round(h_us / t_us, 2)
summary["requests_per_sec_throng_tls"] = g("requests_throng", "requests_per_sec")
summary["requests_per_sec_haproxy_tls_to_throng"] = g("requests_haproxy_to_throng", "requests_per_sec")
for name in ("requests_throng", "requests_haproxy_to_throng"):
    us = [d["server_cpu_seconds"] * 1e6 / d["completed"] for d in runs.get(name, []) if d.get("completed")]
    if us:
        summary["server_cpu_us_per_request_" + name[len("requests_"):]] = round(statistics.median(us), 1)
summary["target_handshakes_ratio"] = 1.5
summary["ring_sign_us_rsa2048"] = g("rustls_heap", "ring_sign_us_rsa_pss_sha256")
summary["ring_sign_us_ecdsa_p256"] = g("rustls_heap", "ring_sign_us_ecdsa_nistp256_sha256")
summary["openssl_sign_us_rsa2048"] = g("openssl_speed", "openssl_sign_us_rsa2048")
summary["openssl_sign_us_ecdsa_p256"] = g("openssl_speed", "openssl_sign_us_ecdsa_p256")
print(json.dumps({"summary": summary}, indent=2))
EOF
