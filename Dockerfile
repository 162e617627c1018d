# syntax=docker/dockerfile:1
# The outbox-relay image: the release binary and the migrations on Debian 12 (bookworm-slim,
# the glibc the binary is built against), run as a non-root user. No shell tools are added.
#
#   docker build --build-arg OUTBOX_RELAY_GIT_COMMIT="$(git rev-parse --short=12 HEAD)" \
#     -t outbox-relay:0.1.0 .
#   docker run --rm outbox-relay:0.1.0 --version
#
# The image runs `outbox-relay run` with the config at /etc/outbox-relay/relay.toml (mount it),
# serves /metrics, /healthz and /readyz on 0.0.0.0:9464, and keeps its local checkpoint in
# /var/lib/outbox-relay (a volume; the leader's checkpoint is mirrored to MySQL as well).
# Our CI has no Docker engine: it lints this file (hadolint) and runs the release binary from a
# root filesystem made by the same deploy/image/runtime-setup.sh (scripts/image-rootfs.sh,
# tests/image.rs, which also checks that this file still names the paths it tests).

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# Only what the build reads (.dockerignore keeps target/ and .git out of the context).
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY crates crates
# crates/producer/migrations is a link to the top-level migrations/.
COPY migrations migrations
COPY bench bench
COPY tests tests
# `outbox-relay --version` names this commit (the context has no .git to ask).
ARG OUTBOX_RELAY_GIT_COMMIT=unknown
ENV OUTBOX_RELAY_GIT_COMMIT=${OUTBOX_RELAY_GIT_COMMIT}
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p rocketmq-outbox-relay \
    && install -m 0755 target/release/outbox-relay /usr/local/bin/outbox-relay

# The demo producer of docker-compose.yml (`outbox-dev demo`): development tooling, never in the
# relay's image. Built only for `--target demo`.
FROM build AS dev-build
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p outbox-dev \
    && install -m 0755 target/release/outbox-dev /usr/local/bin/outbox-dev

FROM debian:bookworm-slim AS demo
COPY deploy/image/runtime-setup.sh /tmp/runtime-setup.sh
RUN sh /tmp/runtime-setup.sh && rm /tmp/runtime-setup.sh
COPY --from=dev-build /usr/local/bin/outbox-dev /usr/local/bin/outbox-dev
USER 10001:10001
ENV OUTBOX_RELAY_CONFIG=/etc/outbox-relay/relay.toml
ENTRYPOINT ["/usr/local/bin/outbox-dev"]

# The relay's image (the default target).
FROM debian:bookworm-slim AS runtime
# ca-certificates, the non-root user 10001 and the state directory: one script, which CI runs too.
COPY deploy/image/runtime-setup.sh /tmp/runtime-setup.sh
RUN sh /tmp/runtime-setup.sh && rm /tmp/runtime-setup.sh
COPY --from=build /usr/local/bin/outbox-relay /usr/local/bin/outbox-relay
COPY migrations /usr/share/outbox-relay/migrations
USER 10001:10001
WORKDIR /var/lib/outbox-relay
ENV OUTBOX_RELAY_CONFIG=/etc/outbox-relay/relay.toml \
    OUTBOX_RELAY_RELAY__CHECKPOINT_DIR=/var/lib/outbox-relay \
    OUTBOX_RELAY_METRICS__LISTEN=0.0.0.0:9464
EXPOSE 9464
VOLUME ["/var/lib/outbox-relay"]
ENTRYPOINT ["/usr/local/bin/outbox-relay"]
CMD ["run"]
