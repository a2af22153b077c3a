#!/usr/bin/env bash
# What access control costs `throng serve` (issue 17), in one run, taking
# turns: the client of scripts/bench-serve.sh (throng-bench's serve_bench:
# one worker, N idle subscribers held by one client process, then fan-out
# rounds) against the same binary configured four ways:
#
#   none     no auth, no limits (the baseline)
#   hs256    every upgrade and publish carries an HS256 token (?token=, Bearer)
#   es256    the same with an ES256 token (ECDSA P-256: a verify per upgrade)
#   per-ip   no token, but --max-connections-per-ip and --handshakes-per-ip set
#            high enough never to refuse: the cost of asking the supervisor
#            about every new connection
#
# and prints, per configuration, the medians over the rounds of:
#   user_bytes_per_more_conn   worker RSS from N/2 to N subscribers, over N/2: what one
#                              more idle subscriber costs (target: an authenticated one
#                              <= none + 16 B)
#   user_bytes_per_conn        worker RSS with N subscribers minus at 0, over N: also
#                              holds what the 200 upgrades in flight left in the heap,
#                              which a token's verification makes larger (a fixed
#                              amount, not per subscriber)
#   upgrades_per_sec           WebSocket upgrades accepted per second (200 in flight)
#   fanout_cpu_ns_per_frame    worker CPU per delivered frame in the fan-out loop
#   ratio_in_loop              that over a bare write(2) loop of the same frame
#                              (the fan-out cost: unchanged within noise)
#
#   scripts/bench-auth.sh [--conns 10000] [--rounds 5] [--repeat 3] [--before BIN]
#
# --before BIN adds a fifth configuration: BIN (e.g. a build of the commit
# before this change) with no auth, for the memory of a subscriber before
# and after. Tokens come from tests/peers/jwt_mint.py (PyJWT and
# cryptography: python3 -m pip install PyJWT cryptography).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
CONNS=10000 ROUNDS=5 REPEAT=3 BEFORE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --conns) CONNS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --repeat) REPEAT=$2; shift 2 ;;
    --before) BEFORE=$2; shift 2 ;;
    *) echo "unknown option $1 (--conns N --rounds N --repeat N --before BIN)" >&2; exit 2 ;;
  esac
done
if [ -n "$BEFORE" ] && [ ! -x "$BEFORE" ]; then
  echo "$BEFORE is not an executable" >&2
  exit 2
fi
python3 -c 'import jwt, cryptography' 2>/dev/null || {
  echo "needs PyJWT and cryptography: python3 -m pip install 'PyJWT>=2.8' 'cryptography>=41'" >&2
  exit 1
}
target=${CARGO_TARGET_DIR:-target}
cargo build --quiet --release -p throng --features bench-floor
cargo build --quiet --release -p throng-bench --bin serve_bench
THRONG=$target/release/throng
CLIENT=$target/release/serve_bench
OUT=${OUT:-$(mktemp -d /tmp/throng-bench-auth.XXXXXX)}
mkdir -p "$OUT/keys"
echo "results in $OUT"
machine_line

python3 tests/peers/jwt_mint.py keys "$OUT/keys"
claims='{"exp_in": 86400, "channels": ["bench"], "publish": ["bench"]}'
tokens=$(python3 tests/peers/jwt_mint.py tokens "$OUT/keys" \
  "[{\"alg\": \"HS256\", \"claims\": $claims}, {\"alg\": \"ES256\", \"claims\": $claims}]")
HS_TOKEN=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[0])' "$tokens")
ES_TOKEN=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[1])' "$tokens")

CONFIGS=(none hs256 es256 per-ip)
[ -n "$BEFORE" ] && CONFIGS+=(before)

# Runs configuration $1 once as round $2; its JSON goes to $OUT/$1-$2.json.
run() {
  local bin=$THRONG args=()
  case "$1" in
    none) ;;
    hs256) args=(--serve-arg --auth-hs256-secret-file --serve-arg "$OUT/keys/hs256.key" --token "$HS_TOKEN") ;;
    es256) args=(--serve-arg --auth-public-key --serve-arg "$OUT/keys/ec.pub.pem" --token "$ES_TOKEN") ;;
    per-ip) args=(--serve-arg --max-connections-per-ip --serve-arg 1000000
                  --serve-arg --handshakes-per-ip --serve-arg 1000000/s) ;;
    before) bin=$BEFORE ;;
  esac
  "$CLIENT" --throng "$bin" --conns "$CONNS" --rounds "$ROUNDS" "${args[@]}" >"$OUT/$1-$2.json"
}

for r in $(seq 1 "$REPEAT"); do
  for c in "${CONFIGS[@]}"; do
    run "$c" "$r"
    python3 - "$OUT/$c-$r.json" "$c" "$r" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
print(f"round {sys.argv[3]} {sys.argv[2]:7s} {j['user_bytes_per_more_conn']:6.0f} B/more conn  "
      f"{j['user_bytes_per_conn']:6.0f} B/conn  "
      f"{j['upgrades_per_sec']:7.0f} upgrades/s  {j['fanout_cpu_ns_per_frame_in_loop']:6.0f} ns/frame  "
      f"{j['ratio_in_loop']:.3f}x floor  failed {j['failed']}  missing {j['subscribers_missing_a_frame']}")
EOF
  done
done

python3 - "$OUT" "${CONFIGS[@]}" <<'EOF'
import glob, json, statistics, sys
out, configs = sys.argv[1], sys.argv[2:]
keys = ["user_bytes_per_more_conn", "user_bytes_per_conn", "upgrades_per_sec", "fanout_cpu_ns_per_frame_in_loop", "ratio_in_loop",
        "failed", "subscribers_missing_a_frame"]
med = {}
for c in configs:
    runs = [json.load(open(p)) for p in sorted(glob.glob(f"{out}/{c}-*.json"))]
    med[c] = {k: round(statistics.median(r[k] for r in runs), 3) for k in keys}
    print(json.dumps({"config": c, "runs": len(runs), "medians": med[c]}))
base = med["none"]
for c in configs:
    if c == "none":
        continue
    m = med[c]
    print(f"{c:7s} vs none: {m['user_bytes_per_more_conn'] - base['user_bytes_per_more_conn']:+.0f} B per more conn, "
          f"{m['user_bytes_per_conn'] - base['user_bytes_per_conn']:+.0f} B/conn from 0, "
          f"upgrades/s x{m['upgrades_per_sec'] / base['upgrades_per_sec']:.2f}, "
          f"fan-out x{m['fanout_cpu_ns_per_frame_in_loop'] / base['fanout_cpu_ns_per_frame_in_loop']:.2f}")
EOF
