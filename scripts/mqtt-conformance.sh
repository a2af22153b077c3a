#!/usr/bin/env bash
# The Eclipse Paho MQTT interoperability client tests (client_test.py for
# 3.1.1, client_test5.py for 5.0) against `throng serve --mqtt-listen` and
# against Mosquitto in the same run, each test alone against a broker
# started for it (the tests share fixed client ids and clean the broker's
# retained messages, so two on one broker would meet), several at a time,
# each within its own time limit. Prints one table: pass/fail per test per
# broker.
#
# Exit status: 1 when throng fails a test Mosquitto passes, unless that test
# is in scripts/mqtt-conformance.known (a gap with its issue item, one test
# a line); 0 otherwise. A test in the list that throng passes is named, so
# the list can shrink.
#
#   scripts/mqtt-conformance.sh [TEST...]       (e.g. v5:test_basic)
#
# Environment: PAHO_DIR (default: the clone's sibling
# shared/peers/paho.mqtt.testing), THRONG (a built binary; default
# target/debug/throng, built if missing), JOBS (tests at once, default 14),
# LIMIT (seconds per test, default 45).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
paho=${PAHO_DIR:-"$(dirname "$root")/shared/peers/paho.mqtt.testing"}
suite="$paho/interoperability"
jobs=${JOBS:-14}
limit=${LIMIT:-45}
known_file="$root/scripts/mqtt-conformance.known"

if [ ! -f "$suite/client_test5.py" ]; then
  echo "mqtt-conformance: no Paho suite at $suite (set PAHO_DIR); skipped"
  exit 0
fi
if ! command -v mosquitto >/dev/null; then
  echo "mqtt-conformance: no mosquitto to compare with; skipped"
  exit 0
fi
throng=${THRONG:-"$root/target/debug/throng"}
if [ ! -x "$throng" ]; then
  (cd "$root" && cargo build --quiet -p throng) || exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Runs one test of one suite on a free port's broker: the suites' own
# globals (their __main__ sets them) are set here, so that no option
# reaches unittest.
cat >"$work/run.py" <<'EOF'
import importlib, sys, unittest
suite, module, test, port = sys.argv[1:5]
sys.path.insert(0, suite)
m = importlib.import_module(module)
m.host, m.port = "127.0.0.1", int(port)
m.topics = ("TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA")
m.wildtopics = ("TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#")
m.nosubscribe_topics = ("test/nosubscribe",)
m.topic_prefix = ""
if hasattr(m, "setData"):
    # setData resets the topics; keep it from touching host and port.
    m.setData = lambda: None
tests = unittest.defaultTestLoader.loadTestsFromName("Test." + test, m)
ok = unittest.TextTestRunner(stream=sys.stderr, verbosity=0).run(tests).wasSuccessful()
sys.exit(0 if ok else 1)
EOF

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# run_one BROKER SUITE:TEST -> writes $work/<broker>.<suite>.<test> with "pass" or "fail"
run_one() {
  local broker=$1 id=$2
  local kind=${id%%:*} test=${id#*:}
  local module=client_test
  [ "$kind" = v5 ] && module=client_test5
  local port pid log="$work/$broker.$kind.$test.log"
  port=$(free_port)
  if [ "$broker" = throng ]; then
    # The keep-alive check rides the sweep of --ping-interval (30 s by
    # default); the tests use keep-alives of 2-5 s and wait 10 s for the
    # will a missed one sends. test_server_keep_alive wants a server
    # keep-alive of 60 s for a client asking 120: configured on both.
    "$throng" serve --listen 127.0.0.1:0 --mqtt-listen "127.0.0.1:$port" --workers 1 \
      --ping-interval 1s --mqtt-max-keep-alive 60s >"$log.server" 2>&1 &
    pid=$!
  else
    printf 'listener %s 127.0.0.1\nallow_anonymous true\nmax_keepalive 60\n' "$port" \
      >"$work/$broker.$kind.$test.conf"
    mosquitto -c "$work/$broker.$kind.$test.conf" >"$log.server" 2>&1 &
    pid=$!
  fi
  # Ready when the port takes a connection.
  for _ in $(seq 50); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
    sleep 0.1
  done
  local result=fail
  if (cd "$suite" && timeout -k 2 "$limit" python3 "$work/run.py" "$suite" "$module" "$test" "$port") \
    >"$log" 2>&1; then
    result=pass
  fi
  kill "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  echo "$result" >"$work/$broker.$kind.$test"
}

if [ $# -gt 0 ]; then
  ids=("$@")
else
  ids=()
  for t in $(grep -oE 'def (test[A-Za-z0-9_]*)' "$suite/client_test.py" | cut -d' ' -f2); do
    ids+=("v3:$t")
  done
  for t in $(grep -oE 'def (test[A-Za-z0-9_]*)' "$suite/client_test5.py" | cut -d' ' -f2); do
    ids+=("v5:$t")
  done
fi

started=$SECONDS
running=0
for id in "${ids[@]}"; do
  for broker in throng mosquitto; do
    run_one "$broker" "$id" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then
      wait -n
      running=$((running - 1))
    fi
  done
done
wait

known=()
[ -f "$known_file" ] && mapfile -t known < <(grep -vE '^\s*(#|$)' "$known_file" | cut -d' ' -f1)
is_known() {
  local k
  for k in "${known[@]}"; do [ "$k" = "$1" ] && return 0; done
  return 1
}

status=0
declare -A passed=([throng]=0 [mosquitto]=0)
printf '%-36s %-9s %-9s %s\n' "test" "throng" "mosquitto" ""
for id in "${ids[@]}"; do
  kind=${id%%:*} test=${id#*:}
  t=$(cat "$work/throng.$kind.$test" 2>/dev/null || echo fail)
  m=$(cat "$work/mosquitto.$kind.$test" 2>/dev/null || echo fail)
  [ "$t" = pass ] && passed[throng]=$((passed[throng] + 1))
  [ "$m" = pass ] && passed[mosquitto]=$((passed[mosquitto] + 1))
  note=""
  if [ "$t" = fail ] && [ "$m" = pass ]; then
    if is_known "$id"; then
      note="known gap"
    else
      note="REGRESSION"
      status=1
      grep -E 'Error|assert|Exception' "$work/throng.$kind.$test.log" | tail -2 |
        sed 's/^/    /' >"$work/why.$kind.$test"
    fi
  elif [ "$t" = pass ] && is_known "$id"; then
    note="passes now: drop it from mqtt-conformance.known"
  fi
  printf '%-36s %-9s %-9s %s\n' "$id" "$t" "$m" "$note"
  [ -f "$work/why.$kind.$test" ] && cat "$work/why.$kind.$test"
done
printf '%-36s %-9s %-9s\n' "passed of ${#ids[@]}" "${passed[throng]}" "${passed[mosquitto]}"
echo "($((SECONDS - started))s, $jobs at a time, ${limit}s per test)"
exit $status
