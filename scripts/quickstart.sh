#!/usr/bin/env bash
# The README's first command: install what is missing, start a local MariaDB + RocketMQ,
# apply the migrations and enqueue sample events with the producer API.
# Extra arguments go to `outbox-dev up` (e.g. --exit to stop right after the demo).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Cargo shows its progress: the first build takes a few minutes on a new machine.
echo "== building outbox-dev (the relay and the local servers' launcher; minutes the first time)"
cargo run -p outbox-dev -- up "$@"
