#!/usr/bin/env bash
# The test command of the README ("Run the tests"); .ci/run calls exactly this.
# Installs MariaDB and the RocketMQ binaries if missing (scripts/setup.sh), then runs every test.
# The integration tests start their own MariaDB and RocketMQ on free loopback ports with
# temporary data directories and stop them when they end.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo test --features failpoints "$@"
