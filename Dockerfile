# One small non-root image holding the single `leasehold` binary: the controller
# (`leasehold controller`) and the client wrapper (`leasehold run`) in app pods.
# Not built in CI here (no Docker engine on these machines); see the README.
FROM rust:1.89-bookworm AS build
WORKDIR /src
# The whole tree (minus .dockerignore): a manifest naming a file the context lacks
# (a bench, an example) would fail the build.
COPY . .
RUN cargo build --release --locked --bin leasehold && strip target/release/leasehold

# bookworm-slim keeps `sh` for `leasehold run -- sh -c ...` in the examples.
FROM debian:bookworm-slim
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin leasehold
COPY --from=build /src/target/release/leasehold /usr/local/bin/leasehold
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/leasehold"]
CMD ["controller"]
