#!/usr/bin/env bash
# The benchmark from a fresh machine in one command: installs the local servers if missing
# (scripts/setup.sh; with OUTBOX_TEST_DB=mysql the MySQL chroot too), then runs
# `cargo bench --bench relay` with the given flags. `--peers` adds Debezium Server beside the
# relay: its distribution (~780 MB) is fetched from Maven Central into the cache on first use
# (bench/debezium/pom.xml); it needs a Java 21+ (Temurin 25 under /usr/lib/jvm is found, or
# set DEBEZIUM_JAVA_HOME), and Alibaba Canal 1.1.8, which Maven Central does not have: it is
# built from source with Maven on first use (~2 min, then cached), the source cloned from
# GitHub (tag canal-1.1.8) unless CANAL_SOURCE names a git directory or source tree.
#
#   scripts/bench.sh --peers                                  # MariaDB, Apache RocketMQ
#   OUTBOX_TEST_DB=mysql scripts/bench.sh --peers --out bench/results/mysql
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec cargo bench --bench relay -- "$@"
