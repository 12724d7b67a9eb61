# One small non-root image holding the single static `leasehold` binary: the controller
# (`leasehold controller`) and the client wrapper (`leasehold run`) in app pods.
#
#   docker build -t leasehold:dev .                       # one platform, local
#   docker buildx bake release                            # linux/amd64 + linux/arm64 (docker-bake.hcl)
#
# CI here checks the build stage from exactly this context (scripts/image-context-check.sh)
# but runs no Docker build (see the README's test tiers).
ARG RUST_IMAGE=rust:1.89-alpine
ARG RUNTIME_IMAGE=alpine:3.20

# Alpine's Rust targets musl and links statically: the binary needs no libc at run time.
FROM ${RUST_IMAGE} AS build
RUN apk add --no-cache musl-dev
WORKDIR /src
# The whole tree (minus .dockerignore): a manifest naming a file the context lacks
# (a bench, an example) would fail the build.
COPY . .
RUN cargo build --release --locked --bin leasehold && strip target/release/leasehold

# Alpine keeps a `sh` for `leasehold run -- sh -c ...` in the examples (about 8 MB).
FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="leasehold" \
      org.opencontainers.image.description="Fair (FIFO), fenced distributed locks for Kubernetes pods" \
      org.opencontainers.image.source="https://github.com/leasehold-dev/leasehold" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /src/target/release/leasehold /usr/local/bin/leasehold
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/leasehold"]
CMD ["controller"]
