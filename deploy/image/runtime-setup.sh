#!/bin/sh
# The runtime image's root filesystem, made in one place: the Dockerfile's runtime stage runs
# this on debian:bookworm-slim, and CI runs it in a debootstrap'd bookworm (scripts/image-rootfs.sh)
# before tests/image.rs starts the release binary from there. What it leaves:
#   - ca-certificates (TLS to MySQL or brokers whose certificates come from a public CA);
#   - the user outbox-relay, uid/gid 10001, no home, no login shell: the relay never runs as root;
#   - /var/lib/outbox-relay (the local checkpoint, owned by 10001) and /etc/outbox-relay (config).
set -eu
if ! dpkg-query -W -f='${Status}' ca-certificates 2>/dev/null | grep -q 'install ok installed'; then
  apt-get update
  apt-get install -y --no-install-recommends ca-certificates
fi
rm -rf /var/lib/apt/lists/*
getent group outbox-relay >/dev/null || groupadd --system --gid 10001 outbox-relay
id -u outbox-relay >/dev/null 2>&1 ||
  useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin outbox-relay
install -d -o 10001 -g 10001 -m 0750 /var/lib/outbox-relay
install -d -m 0755 /etc/outbox-relay
