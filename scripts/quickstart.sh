#!/usr/bin/env bash
# The README's first command: install what is missing, start a local MariaDB + RocketMQ,
# apply the migrations and enqueue sample events with the producer API.
# Extra arguments go to `outbox-dev up` (e.g. --exit to stop right after the demo).
#
# The install (scripts/setup.sh: packages, the broker's jars) runs while cargo builds
# `outbox-dev` with the `quickstart` profile (Cargo.toml: no optimisation, no debug info),
# the shortest build from nothing; each step says how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
elapsed() { echo "$(($(date +%s) - START)) s"; }

# The install runs in the background: ask for sudo's password (if it will be needed) first.
if [ "$(id -u)" -ne 0 ] && ! command -v mariadbd >/dev/null 2>&1; then
  sudo -v
fi
SETUP_LOG="${TMPDIR:-/tmp}/outbox-relay-quickstart-setup.log"
scripts/setup.sh >"$SETUP_LOG" 2>&1 &
SETUP=$!
trap 'kill "$SETUP" 2>/dev/null || true' EXIT
echo "== installing MariaDB and the RocketMQ servers if missing, in the background (log: $SETUP_LOG)"
echo "== building outbox-dev (the relay and the local servers' launcher; a few minutes the first time)"
cargo build --locked --profile quickstart -p outbox-dev
echo "== built in $(elapsed)"
if ! wait "$SETUP"; then
  trap - EXIT
  echo "error: installing the servers failed; the end of $SETUP_LOG:" >&2
  tail -n 20 "$SETUP_LOG" >&2
  exit 1
fi
trap - EXIT
grep '^\[setup\] ready' "$SETUP_LOG" || true
echo "== servers installed; starting them ($(elapsed) so far)"
exec "${CARGO_TARGET_DIR:-target}/quickstart/outbox-dev" up "$@"
