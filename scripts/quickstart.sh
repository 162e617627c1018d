#!/usr/bin/env bash
# The README's first command: install what is missing, start a local MariaDB + RocketMQ,
# apply the migrations and enqueue sample events with the producer API.
# Extra arguments go to `outbox-relay dev up` (e.g. --exit to stop right after the demo).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo run --quiet -- dev up "$@"
