#!/usr/bin/env bash
# The long demonstrations of tests/memory.rs (the suite runs them short):
#   - a topic read-only for 10 minutes beside a healthy one, both written at 200 events/s:
#     relay RSS, the healthy topic's p99 before and during, the checkpoint mirror's lag, two
#     healthy rows written without binlog (only the sweeper sees them), then every event of both
#     topics on the broker in key order after a kill -9 and a restart;
#   - one XA branch prepared while 1,000,000 more transactions commit: relay RSS.
# Figures are printed as `memory: ...` lines. Takes about 25 minutes on 2 cores.
#
#   scripts/demo-stuck-topic.sh                 both
#   OUTBOX_MEMORY_STUCK_FOR=20m scripts/demo-stuck-topic.sh stuck
#   OUTBOX_TEST_DB=mysql scripts/demo-stuck-topic.sh        against Oracle MySQL (as root)
set -euo pipefail
cd "$(dirname "$0")/.."
export OUTBOX_MEMORY_STUCK_FOR="${OUTBOX_MEMORY_STUCK_FOR:-10m}"
export OUTBOX_MEMORY_TRANSACTIONS="${OUTBOX_MEMORY_TRANSACTIONS:-1000000}"
case "${1:-both}" in
  stuck) filter=(memory::a_stuck_topic) ;;
  xa) filter=(memory::a_prepared_xa) ;;
  both) filter=(memory::) ;;
  *) echo "usage: scripts/demo-stuck-topic.sh [stuck|xa|both]" >&2; exit 2 ;;
esac
# One at a time: each measures one relay's memory and latency on a quiet machine.
RUST_TEST_THREADS=1 exec scripts/test.sh --test suite -- "${filter[@]}" --nocapture
