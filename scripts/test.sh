#!/usr/bin/env bash
# The test command of the README ("Run the tests"); .ci/run calls exactly this.
#
#   scripts/test.sh              every test against Apache RocketMQ 5.3 (the Java broker) and
#                                MariaDB, then the rocketmq-rust compatibility subset
#   scripts/test.sh ARGS...      only the first part, with ARGS passed to `cargo test`
#                                (e.g. `scripts/test.sh --test relay`)
#
# Installs what is missing (scripts/setup.sh), then starts ONE MariaDB and ONE RocketMQ cluster
# (`outbox-relay dev servers`) that every test binary shares: two cores cannot afford a JVM
# broker per binary. Tests that kill, freeze or reconfigure a server start their own. A test
# binary run alone (`cargo test --test X`) starts its own servers.
set -euo pipefail
cd "$(dirname "$0")/.."

# The rocketmq-rust servers are needed only for the compatibility subset of a full run.
if [ $# -eq 0 ]; then scripts/setup.sh --rust-broker; else scripts/setup.sh; fi

FEATURES=(--features failpoints)
say() { printf '[test] %s\n' "$*" >&2; }

echo "== building the tests"
cargo test "${FEATURES[@]}" --no-run "$@"
cargo build "${FEATURES[@]}" --quiet
BIN="${CARGO_TARGET_DIR:-target}/debug/outbox-relay"

SERVERS_PID=""
stop_servers() {
  if [ -n "$SERVERS_PID" ]; then
    kill -TERM "$SERVERS_PID" 2>/dev/null || true
    wait "$SERVERS_PID" 2>/dev/null || true
    SERVERS_PID=""
  fi
}
trap stop_servers EXIT

# Starts the shared servers of broker kind $1 and exports their addresses.
start_servers() {
  local env_file
  env_file="$(mktemp -u "${TMPDIR:-/tmp}/outbox-test-servers.XXXXXX")"
  OUTBOX_BROKER="$1" "$BIN" dev servers --env-file "$env_file" &
  SERVERS_PID=$!
  for _ in $(seq 1 600); do
    [ -f "$env_file" ] && break
    kill -0 "$SERVERS_PID" 2>/dev/null || { say "the shared servers did not start"; exit 1; }
    sleep 0.2
  done
  [ -f "$env_file" ] || { say "the shared servers were not ready after 120 s"; exit 1; }
  set -a
  # shellcheck disable=SC1090
  . "$env_file"
  set +a
  rm -f "$env_file"
}

echo "== tests against Apache RocketMQ (Java) and MariaDB"
start_servers apache
cargo test "${FEATURES[@]}" "$@"
stop_servers

if [ $# -eq 0 ]; then
  # rocketmq-rust stays supported: the end-to-end, kill, broker-restart and bad-input tests.
  echo "== compatibility subset against rocketmq-rust 1.0"
  start_servers rust
  cargo test "${FEATURES[@]}" --test relay --test relay_faults --test relay_resume \
    --test broker --test message_ids --test bad_input --test bad_input_schema
  stop_servers
fi
