#!/usr/bin/env bash
# Installs what outbox-relay's local servers need; safe to run again (it skips what is there).
#   - MariaDB (mariadbd, mariadb-install-db, mariadb client) from Debian's packages, with
#     galera-4 and rsync for the two-node Galera cluster of src/devenv/galera.rs (SST by rsync)
#   - Apache RocketMQ 5.3 (namesrv, broker, proxy, mqadmin): jars from Maven Central, fetched with
#     scripts/apache-rocketmq/pom.xml into $OUTBOX_DEVENV_CACHE (default ~/.cache/outbox-relay);
#     about 10 s the first time. Needs Java 17+ and Maven. Beside them, the official RocketMQ 5
#     Java client (scripts/rocketmq-client-java/pom.xml) that tests consume FIFO topics with.
#   - with --rust-broker (or OUTBOX_BROKER=rust): the rocketmq-rust 1.0.0 namesrv + broker
#     binaries from crates.io, built once into the same cache: ~15-20 minutes the first time on
#     2 cores, seconds afterwards.
#   - with --only-rust-broker: just that; with --rust-broker-idle: just that, at the lowest CPU
#     priority in a session of its own (.ci/run and scripts/test.sh start it in the background;
#     kill its process group to stop it). Concurrent installs wait for each other.
#   - with --mysql (or OUTBOX_TEST_DB=mysql): Oracle MySQL (Debian sid's mysql-server-core) in a
#     debootstrap'd chroot $OUTBOX_DEVENV_CACHE/mysql-chroot, from the Debian mirror this
#     machine's apt sources name: about 1 minute the first time, seconds afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

WANT_RUST_BROKER=0
[ "${OUTBOX_BROKER:-}" = "rust" ] && WANT_RUST_BROKER=1
WANT_MYSQL=0
[ "${OUTBOX_TEST_DB:-}" = "mysql" ] && WANT_MYSQL=1
WANT_IMAGE=0
ONLY_RUST_BROKER=0
for arg in "$@"; do
  case "$arg" in
    --rust-broker) WANT_RUST_BROKER=1 ;;
    --only-rust-broker) ONLY_RUST_BROKER=1 ;;
    --rust-broker-idle)
      # `nice` alone does not make a build the lowest: with the kernel's autogroups (Debian's
      # default) each session shares the CPU equally with every other whatever its processes'
      # nice values, so a cold release build took 32 minutes instead of about 13 beside it.
      # A session of its own whose autogroup nice is 19 gets only the CPU the others leave idle.
      # (Run in the background by a script, this process is no group leader: setsid does not
      # fork, so the caller's $! stays the session's leader, its process group, and waitable.)
      exec setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 "$0" --only-rust-broker' "$0" ;;
    --mysql) WANT_MYSQL=1 ;;
    --image) WANT_IMAGE=1 ;;
    *) echo "usage: scripts/setup.sh [--rust-broker] [--mysql] [--image] | --only-rust-broker | --rust-broker-idle" >&2; exit 2 ;;
  esac
done

CACHE="${OUTBOX_DEVENV_CACHE:-$HOME/.cache/outbox-relay}"
ROCKETMQ_VERSION="1.0.0"
APACHE_VERSION="$(sed -n 's:.*<rocketmq.version>\(.*\)</rocketmq.version>.*:\1:p' scripts/apache-rocketmq/pom.xml)"
APACHE_LIB="$CACHE/apache-rocketmq/$APACHE_VERSION/lib"
ROCKETMQ_ROOT="$CACHE/rocketmq"
STAMP="$ROCKETMQ_ROOT/.installed-$ROCKETMQ_VERSION"
# Must match src/devenv/mysql.rs (MySqlOptions' default chroot).
MYSQL_ROOT="$CACHE/mysql-chroot"
MYSQL_STAMP="$MYSQL_ROOT/.outbox-relay-installed"
# Must match tests/image.rs (the image's base root filesystem).
IMAGE_ROOT="$CACHE/image-base-bookworm"

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

# The Galera provider and rsync (its state transfers), for src/devenv/galera.rs.
install_galera() {
  if [ -f /usr/lib/galera/libgalera_smm.so ] && command -v rsync >/dev/null 2>&1; then
    say "Galera: $(dpkg-query -W -f '${Version}' galera-4 2>/dev/null || echo present), rsync $(rsync --version | awk 'NR == 1 { print $3 }')"
    return
  fi
  say "Galera: installing galera-4 and rsync from Debian's packages ..."
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq galera-4 rsync >/dev/null
  say "Galera: $(dpkg-query -W -f '${Version}' galera-4)"
}

install_rocketmq() {
  # One install at a time (.ci/run starts one early, scripts/test.sh another): a second waits
  # for the first, then finds its binaries.
  mkdir -p "$CACHE"
  exec 9>"$CACHE/rocketmq-install.lock"
  if ! flock -n 9; then
    say "RocketMQ: another install is running; waiting for it"
    flock 9
  fi
  if [ -f "$STAMP" ] && [ -x "$ROCKETMQ_ROOT/bin/rocketmq-broker-rust" ] && [ -x "$ROCKETMQ_ROOT/bin/rocketmq-namesrv-rust" ]; then
    say "RocketMQ: cached binaries $ROCKETMQ_VERSION in $ROCKETMQ_ROOT/bin"
    return
  fi
  say "RocketMQ: building rocketmq-namesrv + rocketmq-broker $ROCKETMQ_VERSION into $ROCKETMQ_ROOT"
  say "          (first time only: 15-20 minutes on 2 cores; progress below)"
  mkdir -p "$ROCKETMQ_ROOT"
  # At opt-level 1: it is a peer for the compatibility tests, not what we measure, and a lower
  # opt level shortens its first build (by how much was not measured back to back).
  CARGO_PROFILE_RELEASE_OPT_LEVEL=1 CARGO_TARGET_DIR="$CACHE/rocketmq-build" \
    cargo install --locked --root "$ROCKETMQ_ROOT" \
    "rocketmq-namesrv@$ROCKETMQ_VERSION" "rocketmq-broker@$ROCKETMQ_VERSION"
  touch "$STAMP"
  rm -rf "$CACHE/rocketmq-build"
  say "RocketMQ: installed"
}

install_java() {
  if command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then
    return
  fi
  say "Java/Maven: installing openjdk-17-jdk-headless and maven from Debian's packages ..."
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
}

# Copies the jars of Maven project $1 (a pom listing dependencies) into $2, once per version of
# the pom: the stamp names the pom it was fetched for, so a pom that gains a jar fetches again.
fetch_jars() {
  local pom="$1" dir="$2" what="$3" pom_sum
  pom_sum="$(sha256sum "$pom" | cut -c1-16)"
  if [ -f "$dir/.complete-$pom_sum" ]; then
    say "$what: cached jars in $dir"
    return
  fi
  install_java
  say "$what: fetching from Maven Central ..."
  rm -rf "$dir"
  mkdir -p "$dir"
  mvn -q -B -f "$pom" dependency:copy-dependencies \
    -DoutputDirectory="$dir" -Dmaven.repo.local="$CACHE/m2"
  touch "$dir/.complete-$pom_sum"
  say "$what: $(ls "$dir" | wc -l) jars in $dir"
}

install_apache_rocketmq() {
  fetch_jars scripts/apache-rocketmq/pom.xml "$APACHE_LIB" \
    "Apache RocketMQ $APACHE_VERSION (namesrv, broker, proxy, mqadmin)"
  # The official RocketMQ 5 Java client, which tests read FIFO topics with through the proxy.
  fetch_jars scripts/rocketmq-client-java/pom.xml "$CACHE/rocketmq-client-java/lib" \
    "RocketMQ 5 Java client"
}

# The first Debian mirror (not the security archive) that this machine's apt sources name, in
# either the one-line (`deb URL suite ...`) or the deb822 (`URIs: URL`) format.
debian_mirror() {
  local files=()
  [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] || return 0
  { sed -n 's/^[[:space:]]*deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([a-z]\+:\/\/[^[:space:]]\+\).*/\2/p' "${files[@]}"
    sed -n 's/^[[:space:]]*URIs:[[:space:]]*\([^[:space:]]\+\).*/\1/p' "${files[@]}"
  } | grep -v -e security -e '^cdrom:' | grep -i debian | head -n1
}

# debootstrap_into LABEL DIR SUITE PACKAGES LOG: a fresh Debian SUITE (minbase) with PACKAGES in
# DIR, from the Debian mirror this machine's apt sources name; its output goes to LOG.
debootstrap_into() {
  local label="$1" dir="$2" suite="$3" packages="$4" log="$5"
  if [ "$(id -u)" -ne 0 ]; then
    say "$label: building and running the chroot needs root (debootstrap, chroot)"; exit 1
  fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    say "$label: installing debootstrap from Debian's packages ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  local mirror
  mirror="$(debian_mirror)"
  mirror="${mirror:-http://deb.debian.org/debian}"
  say "$label: debootstrap $suite (minbase + $packages) from $mirror into $dir (about 1 minute) ..."
  rm -rf "$dir"
  mkdir -p "$CACHE"
  debootstrap --variant=minbase --include="$packages" "$suite" "$dir" "$mirror" >"$log" 2>&1 || {
    say "$label: debootstrap failed; last lines of $log:"
    tail -n 20 "$log" >&2
    exit 1
  }
}

install_mysql() {
  if [ -f "$MYSQL_STAMP" ] && [ -x "$MYSQL_ROOT/usr/sbin/mysqld" ]; then
    say "MySQL: $(chroot "$MYSQL_ROOT" /usr/sbin/mysqld --version) (chroot $MYSQL_ROOT)"
    return
  fi
  debootstrap_into MySQL "$MYSQL_ROOT" sid mysql-server-core "$CACHE/mysql-chroot.log"
  touch "$MYSQL_STAMP"
  say "MySQL: $(chroot "$MYSQL_ROOT" /usr/sbin/mysqld --version) (chroot $MYSQL_ROOT)"
}

# The container image's runtime stage without Docker: Debian 12 (minbase, what bookworm-slim is
# made from) and deploy/image/runtime-setup.sh, which the Dockerfile runs too. tests/image.rs adds
# the release binary and the migrations and runs them from there.
install_image_base() {
  local stamp
  stamp="$IMAGE_ROOT/.outbox-relay-$(sha256sum deploy/image/runtime-setup.sh | cut -c1-16)"
  if [ -f "$stamp" ]; then
    say "image base: Debian $(cat "$IMAGE_ROOT/etc/debian_version") ($IMAGE_ROOT)"
    return
  fi
  debootstrap_into "image base" "$IMAGE_ROOT" bookworm ca-certificates "$CACHE/image-base.log"
  cp deploy/image/runtime-setup.sh "$IMAGE_ROOT/tmp/runtime-setup.sh"
  chroot "$IMAGE_ROOT" sh /tmp/runtime-setup.sh >>"$CACHE/image-base.log" 2>&1
  rm -f "$IMAGE_ROOT/tmp/runtime-setup.sh"
  touch "$stamp"
  say "image base: Debian $(cat "$IMAGE_ROOT/etc/debian_version"), user $(chroot "$IMAGE_ROOT" id outbox-relay)"
}

if [ "$ONLY_RUST_BROKER" = 1 ]; then
  install_rocketmq
  exit 0
fi
install_mariadb
install_galera
install_apache_rocketmq
if [ "$WANT_MYSQL" = 1 ]; then
  install_mysql
fi
if [ "$WANT_IMAGE" = 1 ]; then
  install_image_base
fi
if [ "$WANT_RUST_BROKER" = 1 ]; then
  install_rocketmq
fi
say "ready: MariaDB (with Galera)$([ "$WANT_MYSQL" = 1 ] && echo ", MySQL") and the RocketMQ servers are installed"
