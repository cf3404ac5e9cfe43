# syntax=docker/dockerfile:1

# hookinbox: one image carrying both binaries.
#   hookinbox-ingest  (default command)    - webhook listener on 8080, metrics on 9898
#   hookinbox-worker                       - consumer, metrics on 9899; also `migrate`,
#                                            `sweep`, `dlq ...`, `deliveries ...`
#
# Build:  docker build -t hookinbox .
# Run:    docker run hookinbox hookinbox-worker migrate
#         docker run hookinbox hookinbox-worker
# The binaries sit on PATH and there is no ENTRYPOINT, so a command such as
# `hookinbox-worker migrate` (compose `command:`, Kubernetes `command:`)
# picks the binary and its arguments directly.

FROM rust:1.90-bookworm AS build
WORKDIR /src

# 1. Dependencies only: the manifests, the lock file and empty stand-ins for
#    every workspace member's targets. This layer stays cached until a
#    Cargo.toml or Cargo.lock changes.
COPY Cargo.toml Cargo.lock ./
COPY shared/Cargo.toml shared/Cargo.toml
COPY ingest/Cargo.toml ingest/Cargo.toml
COPY operator/Cargo.toml operator/Cargo.toml
COPY worker/Cargo.toml worker/Cargo.toml
COPY tests/Cargo.toml tests/Cargo.toml
RUN mkdir -p shared/src ingest/src operator/src worker/src worker/examples tests/src \
 && echo '' > shared/src/lib.rs \
 && echo '' > operator/src/lib.rs \
 && echo 'fn main() {}' > ingest/src/main.rs \
 && echo 'fn main() {}' > worker/src/main.rs \
 && echo 'fn main() {}' > worker/examples/custom_handler.rs \
 && echo '' > tests/src/lib.rs \
 && cargo build --release --locked -p hookinbox-ingest -p hookinbox-worker \
 && rm -rf shared/src ingest/src operator/src worker/src worker/examples tests/src \
    target/release/hookinbox-ingest target/release/hookinbox-worker \
    target/release/deps/hookinbox_ingest-* target/release/deps/hookinbox_worker-* \
    target/release/deps/hookinbox_operator-* \
    target/release/deps/hookinbox-* target/release/deps/libhookinbox-* \
    target/release/.fingerprint/hookinbox-*

# 2. The real sources. The migrations are embedded at compile time, so they
#    are needed here and nowhere at runtime. `touch` makes sure cargo sees the
#    sources as newer than the stand-ins built above.
COPY shared/src shared/src
COPY shared/migrations shared/migrations
COPY ingest/src ingest/src
COPY operator/src operator/src
COPY worker/src worker/src
COPY worker/examples worker/examples
COPY tests/src tests/src
RUN find shared ingest operator worker tests -type f -exec touch {} + \
 && cargo build --release --locked -p hookinbox-ingest -p hookinbox-worker \
 && cp target/release/hookinbox-ingest target/release/hookinbox-worker /usr/local/bin/

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="hookinbox" \
      org.opencontainers.image.description="GitHub webhook inbox: ingest and worker" \
      org.opencontainers.image.source="https://github.com/hookinbox/hookinbox" \
      org.opencontainers.image.licenses="MIT"

COPY --from=build /usr/local/bin/hookinbox-ingest /usr/local/bin/hookinbox-ingest
COPY --from=build /usr/local/bin/hookinbox-worker /usr/local/bin/hookinbox-worker

ENV HOOKINBOX_LISTEN=0.0.0.0:8080 \
    HOOKINBOX_LOG_FORMAT=json

# The distroless "nonroot" user is uid/gid 65532 and exists in the image's
# /etc/passwd. Kubernetes cannot check runAsNonRoot against a name, so the
# manifests under deploy/k8s also set runAsUser/runAsGroup 65532.
# hadolint ignore=DL3066
USER nonroot
# 8080 webhooks (ingest), 9898 ingest metrics/health, 9899 worker metrics/health,
# 9900 the admin console (`hookinbox-worker admin`)
EXPOSE 8080 9898 9899 9900

# Probes this container's own metrics listener (HOOKINBOX_METRICS_LISTEN).
# A worker container overrides it with `hookinbox-worker healthcheck`.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["/usr/local/bin/hookinbox-ingest", "healthcheck"]

CMD ["/usr/local/bin/hookinbox-ingest"]
