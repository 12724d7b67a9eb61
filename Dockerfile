# The leasehold image: one small non-root image holding the single static `leasehold`
# binary, the controller (`leasehold controller`) and the client wrapper (`leasehold
# run`) in app pods. The binary comes from an image holding only /leasehold: built from
# source by Dockerfile.build (the default, `leasehold-build`), or by CI's real-node e2e
# from the same static binary it tests.
#
#   docker build -f Dockerfile.build -t leasehold-build . && docker build -t leasehold .
#   docker buildx bake release                     # linux/amd64 + linux/arm64, pushed
ARG BINARY_IMAGE=leasehold-build
ARG RUNTIME_IMAGE=alpine:3.20

FROM ${BINARY_IMAGE} AS binary

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
COPY --from=binary /leasehold /usr/local/bin/leasehold
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/leasehold"]
CMD ["controller"]
