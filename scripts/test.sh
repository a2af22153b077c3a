#!/usr/bin/env bash
# The one test command (README, .ci/run): installs the test peers that are
# missing and says what it found and what it installed, then runs formatting,
# lints, every test (doc tests too) and the docs build, and prints how long
# each step took.
#
#   scripts/test.sh                everything
#   scripts/test.sh --no-install   skip installing (offline re-runs); still
#                                  lists the peers it finds
#
# Installing needs root and apt (Debian or Ubuntu), python3 with pip, node
# with npm, and network to Debian's, PyPI's and npm's registries. Here a
# missing peer fails its tests (THRONG_TEST_REQUIRE_PEERS=1); a plain
# `cargo test` skips them instead, saying which peer is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

install=1
case "${1:-}" in
  "") ;;
  --no-install) install=0 ;;
  *) echo "usage: scripts/test.sh [--no-install]" >&2; exit 2 ;;
esac

# --- steps and their times -------------------------------------------------
started=$SECONDS
step_name=""
step_started=$SECONDS
times=()
end_step() {
  [ -n "$step_name" ] && times+=("$(printf '%6ss  %s' "$((SECONDS - step_started))" "$step_name")")
  step_name=""
}
step() {
  end_step
  step_name=$*
  step_started=$SECONDS
  printf '\n== %s\n' "$*"
}
trap 'end_step; if [ ${#times[@]} -gt 0 ]; then printf "\n== time per step\n"; printf "%s\n" "${times[@]}"; printf "%6ss  in all\n" "$((SECONDS - started))"; fi' EXIT

# --- the peers the tests run against ---------------------------------------
# Each probe prints the peer's version (or where it is) when it is usable.
probe_redis_server() { redis-server --version 2>/dev/null | cut -d' ' -f1-3; }
probe_redis_cli() { redis-cli --version 2>/dev/null; }
# Debian's redis-sentinel package: the redis-sentinel command (the Sentinel tests).
probe_redis_sentinel() { command -v redis-sentinel >/dev/null && redis-sentinel --version 2>/dev/null | cut -d' ' -f1-3; }
probe_haproxy() { haproxy -v 2>/dev/null | head -1 | cut -d' ' -f1-3; }
probe_openssl() { openssl version 2>/dev/null; }
probe_chromium() {
  local b
  b=$(command -v chromium || command -v chromium-browser) || return 1
  "$b" --version 2>/dev/null | head -1 | cut -d' ' -f1-2
}
# wrk exits 1 on --version; only the benchmark scripts use it.
probe_wrk() { command -v wrk >/dev/null && { wrk --version 2>&1 | head -1 | cut -d' ' -f1-2; }; }
# The peers use websockets' asyncio API, which came in websockets 13.
probe_python_websockets() {
  python3 -c 'import websockets.asyncio.server, websockets; print("websockets", websockets.__version__)' 2>/dev/null
}
# doctor's fixes run in scratch mount and network namespaces: root, unshare, sysctl.
probe_namespaces() {
  unshare --mount --net sysctl -n net.core.somaxconn >/dev/null 2>&1 && echo "unshare and sysctl as root"
}
# The auth tests' tokens come from PyJWT with cryptography (RS256, ES256, EdDSA).
probe_python_jwt() {
  python3 -c 'import jwt, cryptography, cryptography.hazmat.primitives.asymmetric.ed25519; print("PyJWT", jwt.__version__, "cryptography", cryptography.__version__)' 2>/dev/null
}
probe_mosquitto() { mosquitto -h 2>/dev/null | head -1 | cut -d' ' -f1-3; }
# The MQTT tests' independent client.
probe_python_paho() {
  python3 -c 'import paho.mqtt; print("paho-mqtt", paho.mqtt.__version__)' 2>/dev/null
}
# The harness's --metrics-listen text is read by Prometheus's own Python parser.
probe_python_h2() {
  python3 -c 'import h2.connection, importlib.metadata as m; print("h2", m.version("h2"))' 2>/dev/null
}
probe_python_prometheus() {
  python3 -c 'import prometheus_client.parser, importlib.metadata as m; print("prometheus-client", m.version("prometheus-client"))' 2>/dev/null
}
# --help exits 1 but prints the version (what counts is the output).
probe_mosquitto_clients() {
  command -v mosquitto_sub >/dev/null && mosquitto_pub --help 2>/dev/null | sed -n 2p | cut -d' ' -f1-3
}
# The MQTT tests' third independent client (Node `mqtt`), beside paho and mosquitto_sub.
probe_node_mqtt() {
  (cd tests/peers && node -e 'console.log("mqtt", require("mqtt/package.json").version)') 2>/dev/null
}
probe_node_ws() {
  (cd tests/peers && node -e 'require.resolve("eventsource"); console.log("ws", require("ws/package.json").version, "on node", process.version)') 2>/dev/null
}
# Built from the Go module registry below (scripts/test.sh pins the version).
probe_vegeta() { command -v vegeta >/dev/null && vegeta -version 2>/dev/null | grep -q Runtime && echo "vegeta at $(command -v vegeta)"; }
VEGETA_MODULE=github.com/tsenart/vegeta/v12@v12.13.0

# peer | its probe | its Debian package (none: installed by pip or npm below)
peers=(
  "redis-server probe_redis_server redis-server"
  "redis-cli probe_redis_cli redis-tools"
  "redis-sentinel probe_redis_sentinel redis-sentinel"
  "haproxy probe_haproxy haproxy"
  "openssl probe_openssl openssl"
  "chromium probe_chromium chromium"
  "namespaces probe_namespaces procps"
  "wrk probe_wrk wrk"
  "mosquitto probe_mosquitto mosquitto"
  "python3-websockets probe_python_websockets"
  "python3-jwt probe_python_jwt"
  "mosquitto-clients probe_mosquitto_clients mosquitto-clients"
  "python3-paho-mqtt probe_python_paho"
  "python3-prometheus probe_python_prometheus"
  "python3-h2 probe_python_h2"
  "node-ws probe_node_ws"
  "node-mqtt probe_node_mqtt"
  "vegeta probe_vegeta"
)

declare -A before=()
for p in "${peers[@]}"; do
  read -r name probe _ <<<"$p"
  before[$name]=$($probe || true)
done

if [ "$install" = 1 ]; then
  step "install the missing test peers"
  apt_missing=()
  for p in "${peers[@]}"; do
    read -r name _ package <<<"$p"
    if [ -z "${before[$name]}" ] && [ -n "${package:-}" ]; then
      apt_missing+=("$package")
    fi
  done
  if ! command -v python3 >/dev/null; then
    apt_missing+=(python3 python3-pip)
  elif ! python3 -m pip --version >/dev/null 2>&1; then
    apt_missing+=(python3-pip)
  fi
  command -v npm >/dev/null || apt_missing+=(nodejs npm)
  if [ ${#apt_missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "apt-get install ${apt_missing[*]}"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${apt_missing[@]}" >/dev/null
    else
      echo "cannot install ${apt_missing[*]} (needs root and apt-get):" \
        "the tests that need them will fail" >&2
    fi
  fi
  # pip_install REQUIREMENT...: installs the Python packages a peer needs.
  pip_install() {
    echo "python3 -m pip install $*"
    pip_err=$(mktemp)
    if ! python3 -m pip install -q "$@" 2>"$pip_err"; then
      if grep -q externally-managed "$pip_err"; then
        # Debian's own Python refuses pip (PEP 668), and its packages
        # (python3-websockets) are older than the peers' APIs.
        echo "python3 is the system's: pip install --break-system-packages $*"
        python3 -m pip install -q --break-system-packages "$@"
      else
        cat "$pip_err" >&2
        exit 1
      fi
    fi
    rm -f "$pip_err"
  }
  if [ -z "${before[python3-websockets]}" ]; then
    pip_install 'websockets>=13'
  fi
  if [ -z "${before[python3-jwt]}" ]; then
    pip_install 'PyJWT>=2.8' 'cryptography>=41'
  fi
  if [ -z "${before[python3-paho-mqtt]}" ]; then
    pip_install 'paho-mqtt>=2'
  fi
  if [ -z "${before[python3-prometheus]}" ]; then
    pip_install 'prometheus-client>=0.17'
  fi
  if [ -z "${before[python3-h2]}" ]; then
    pip_install 'h2>=4.1'
  fi
  if [ -z "${before[node-ws]}" ] || [ -z "${before[node-mqtt]}" ]; then
    echo "npm install (tests/peers)"
    (cd tests/peers && npm install --silent --no-audit --no-fund >/dev/null)
  fi
  if [ -z "${before[vegeta]}" ]; then
    # Go 1.22 or later (Debian's golang-go is older): the toolchain this
    # machine has, on PATH or where the Go project's archive unpacks.
    go=$(command -v go || { [ -x /usr/local/go/bin/go ] && echo /usr/local/go/bin/go; } || true)
    if [ -z "$go" ]; then
      echo "cannot install vegeta: no Go toolchain (1.22 or later) on PATH or in /usr/local/go;" \
        "the Vegeta interoperability tests will fail" >&2
    elif ! "$go" mod download -json "$VEGETA_MODULE" >/dev/null 2>&1; then
      # The one case a peer may be missing: its registry cannot be reached.
      echo "cannot reach the Go module registry for $VEGETA_MODULE:" \
        "the Vegeta interoperability tests are SKIPPED (not passed)" >&2
      export THRONG_TEST_UNREACHABLE_PEERS=vegeta
    else
      echo "go install $VEGETA_MODULE (into /usr/local/bin)"
      GOBIN=/usr/local/bin "$go" install "$VEGETA_MODULE"
    fi
  fi
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

step "test peers"
for p in "${peers[@]}"; do
  read -r name probe _ <<<"$p"
  now=$($probe || true)
  if [ -z "$now" ]; then
    state=MISSING
  elif [ -n "${before[$name]}" ]; then
    state=found
  else
    state=installed
  fi
  printf '  %-20s %-10s %s\n' "$name" "$state" "$now"
done

# A test whose peer is missing fails here instead of skipping.
export THRONG_TEST_REQUIRE_PEERS=1
# Run as from a shell with the common default soft limit of 1024 files:
# the tests raise their own limit (their peers inherit it), and running
# under 1024 here keeps them doing so.
ulimit -Sn 1024 2>/dev/null || true

step "cargo fmt --check"
cargo fmt --all -- --check

# With the benchmark-only route (scripts/bench-serve.sh builds it) checked too.
step "cargo clippy --workspace --all-targets -- -D warnings (and --features throng/bench-floor)"
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --all-targets --features throng/bench-floor -- -D warnings

if [ -f fuzz/Cargo.toml ]; then
  step "fuzz targets compile"
  cargo check --quiet --manifest-path fuzz/Cargo.toml --bins
fi

# Every test binary runs even after a failure, without backtraces, and each
# failure's last lines are printed again at the end: a CI log cut to its head
# and tail still says why each test failed.
step "cargo test --workspace --all-targets"
test_log=$(mktemp)
if ! RUST_BACKTRACE=0 cargo test --workspace --all-targets --no-fail-fast 2>&1 | tee "$test_log"; then
  printf '\n== the failures, each with the last lines it printed\n'
  awk '
    /^---- .* stdout ----$/ { if (name != "") flush(); name = $2; n = 0; next }
    name != "" && (/^failures:$/ || /^note: run with `RUST_BACKTRACE=1`/) { flush(); name = ""; next }
    name != "" { lines[n++] = $0 }
    function flush(  i, from) {
      print "-- " name
      from = n > 8 ? n - 8 : 0
      for (i = from; i < n; i++) print "   " substr(lines[i], 1, 400)
    }
  ' "$test_log"
  rm -f "$test_log"
  exit 1
fi
rm -f "$test_log"

# The Paho MQTT interoperability suite against throng and Mosquitto (the
# suite beside the clone, as CI has it): fails when throng fails a test
# Mosquitto passes that scripts/mqtt-conformance.known does not list.
step "MQTT conformance (Paho interoperability, throng against Mosquitto)"
PAHO_DIR="$(dirname "$PWD")/shared/peers/paho.mqtt.testing" THRONG=target/debug/throng \
  scripts/mqtt-conformance.sh

# --all-targets leaves out doc tests.
step "cargo test --workspace --doc"
cargo test --workspace --doc

step "cargo doc --workspace --no-deps, warnings as errors"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
