#!/usr/bin/env bash
# The one test command (README, .ci/run): installs what the tests need when it
# is missing, then runs formatting, lints and every test.
#
#   scripts/test.sh            everything
#   scripts/test.sh --no-install   skip the install step (offline re-runs)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

install=1
[ "${1:-}" = "--no-install" ] && install=0

say() { printf '\n== %s\n' "$*"; }

if [ "$install" = 1 ]; then
  say "test peers and services"
  apt_missing=()
  command -v redis-server >/dev/null || apt_missing+=(redis-server)
  command -v haproxy >/dev/null || apt_missing+=(haproxy)
  command -v wrk >/dev/null || apt_missing+=(wrk)
  command -v openssl >/dev/null || apt_missing+=(openssl)
  command -v redis-cli >/dev/null || apt_missing+=(redis-tools)
  command -v chromium >/dev/null || apt_missing+=(chromium)
  command -v openssl >/dev/null || apt_missing+=(openssl)
  if [ ${#apt_missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${apt_missing[@]}" >/dev/null
    else
      echo "warning: not root, cannot install ${apt_missing[*]}; tests needing them will fail" >&2
    fi
  fi
  python3 -c 'import websockets' 2>/dev/null || python3 -m pip install -q 'websockets>=12'
  if [ ! -d tests/peers/node_modules/ws ]; then
    (cd tests/peers && npm install --silent --no-audit --no-fund >/dev/null)
  fi
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

say "cargo fmt --check"
cargo fmt --all -- --check

say "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

if [ -f fuzz/Cargo.toml ]; then
  say "fuzz targets compile"
  cargo check --quiet --manifest-path fuzz/Cargo.toml --bins
fi

say "cargo test"
# The tests open thousands of sockets per process; stay under the hard limit.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
cargo test --workspace --all-targets
