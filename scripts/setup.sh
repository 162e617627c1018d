#!/usr/bin/env bash
# Installs what outbox-relay's local servers need; safe to run again (it skips what is there).
#   - MariaDB (mariadbd, mariadb-install-db, mariadb client) from Debian's packages
#   - RocketMQ namesrv + broker binaries (rocketmq-rust 1.0.0) from crates.io, built once and
#     cached in $OUTBOX_DEVENV_CACHE (default ~/.cache/outbox-relay): ~15-20 minutes the first
#     time on 2 cores, seconds afterwards.
set -euo pipefail

CACHE="${OUTBOX_DEVENV_CACHE:-$HOME/.cache/outbox-relay}"
ROCKETMQ_VERSION="1.0.0"
ROCKETMQ_ROOT="$CACHE/rocketmq"
STAMP="$ROCKETMQ_ROOT/.installed-$ROCKETMQ_VERSION"

say() { printf '[setup] %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else say "need root for: $*  (run as root or install sudo)"; exit 1
  fi
}

install_mariadb() {
  if [ -x /usr/sbin/mariadbd ] && command -v mariadb-install-db >/dev/null 2>&1 && command -v mariadb >/dev/null 2>&1; then
    say "MariaDB: $(/usr/sbin/mariadbd --version | head -n1)"
    return
  fi
  say "MariaDB: installing mariadb-server from Debian's packages ..."
  as_root apt-get update -qq
  # The package may try to start a system-wide server; ours run on their own ports and datadirs.
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server mariadb-client >/dev/null
  say "MariaDB: $(/usr/sbin/mariadbd --version | head -n1)"
}

install_rocketmq() {
  if [ -f "$STAMP" ] && [ -x "$ROCKETMQ_ROOT/bin/rocketmq-broker-rust" ] && [ -x "$ROCKETMQ_ROOT/bin/rocketmq-namesrv-rust" ]; then
    say "RocketMQ: cached binaries $ROCKETMQ_VERSION in $ROCKETMQ_ROOT/bin"
    return
  fi
  say "RocketMQ: building rocketmq-namesrv + rocketmq-broker $ROCKETMQ_VERSION into $ROCKETMQ_ROOT"
  say "          (first time only: 15-20 minutes on 2 cores; progress below)"
  mkdir -p "$ROCKETMQ_ROOT"
  CARGO_TARGET_DIR="$CACHE/rocketmq-build" cargo install --locked --root "$ROCKETMQ_ROOT" \
    "rocketmq-namesrv@$ROCKETMQ_VERSION" "rocketmq-broker@$ROCKETMQ_VERSION"
  touch "$STAMP"
  rm -rf "$CACHE/rocketmq-build"
  say "RocketMQ: installed"
}

install_mariadb
install_rocketmq
say "ready: MariaDB and RocketMQ binaries are installed"
