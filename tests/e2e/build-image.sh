#!/usr/bin/env bash
# Build the leasehold image with a real Docker engine from the repository's Dockerfile,
# as a release would, but offline: the binary is this tree's static (musl) build, made
# on the host and wrapped in an image holding only /leasehold (what Dockerfile.build
# makes), and the runtime base is a local Debian minbase (no image can be pulled here).
# Then run it once, and write it as a docker archive for `ctr images import`.
#
# With PLAIN.tar, also write the runtime base alone as docker.io/library/plain-app:e2e:
# an application image that has never heard of leasehold (examples/any-image.yaml).
# With PYTHON.tar, also write docker.io/library/leasehold-python:e2e: Debian's python3
# with the Python client (clients/python) and its dependencies, installed by
# $LEASEHOLD_PYTHON's pip (default python3; the same minor version as Debian's).
#
# usage: tests/e2e/build-image.sh NAME OUT.tar [PLAIN.tar [PYTHON.tar]]  (root; installs
#        docker.io, debootstrap, musl-tools; starts dockerd if none runs, and stops it again)
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/common.sh
NAME=$1 OUT=$2 PLAIN_OUT=${3:-} PYTHON_OUT=${4:-}
RUNTIME=leasehold-e2e-runtime:bookworm
TARGET=x86_64-unknown-linux-musl

apt_install docker.io debootstrap musl-tools
if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx "$TARGET"; then
  step "rustup target add $TARGET"
  rustup target add "$TARGET" >&2
fi
step "building the static binary (cargo build --target $TARGET)"
cargo build --locked --quiet --features cli --target "$TARGET" --bin leasehold
BIN=$CARGO_TARGET_DIR/$TARGET/debug/leasehold
file_kind=$(ldd "$BIN" 2>&1 || true)
[[ "$file_kind" == *"statically linked"* || "$file_kind" == *"not a dynamic executable"* ]] ||
  { echo "build-image: $BIN is not static: $file_kind" >&2; exit 1; }

work=$(mktemp -d /tmp/leasehold-image.XXXXXX)
dockerd_pid=""
cleanup() {
  rm -rf "$work"
  if [ -n "$dockerd_pid" ]; then kill "$dockerd_pid" 2>/dev/null; wait "$dockerd_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
if ! docker info >/dev/null 2>&1; then
  step "starting dockerd (stopped again when this script ends)"
  dockerd >"$work/dockerd.log" 2>&1 &
  dockerd_pid=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { tail -20 "$work/dockerd.log" >&2; echo "build-image: dockerd did not start" >&2; exit 1; }
fi
if ! docker image inspect "$RUNTIME" >/dev/null 2>&1; then
  step "runtime base $RUNTIME: debootstrap --variant=minbase bookworm (about a minute)"
  debootstrap --variant=minbase bookworm "$work/rootfs" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  tar -C "$work/rootfs" -c . | docker import - "$RUNTIME" >/dev/null
fi
step "docker build (classic builder) of the Dockerfile with this binary: $NAME"
mkdir -p "$work/binary" && cp "$BIN" "$work/binary/leasehold"
tar -C "$work/binary" -c leasehold | docker import - leasehold-build:e2e >/dev/null
DOCKER_BUILDKIT=0 docker build -q \
  --build-arg BINARY_IMAGE=leasehold-build:e2e --build-arg RUNTIME_IMAGE="$RUNTIME" \
  --build-arg REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)" -t "$NAME" . >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; exit 1; }
user=$(docker image inspect -f '{{.Config.User}}' "$NAME")
[ "$user" = 65532:65532 ] || { echo "build-image: the image runs as '$user', not 65532:65532" >&2; exit 1; }
out=$(docker run --rm "$NAME" --version)
[[ "$out" == "leasehold "* ]] || { echo "build-image: the image's binary said: $out" >&2; exit 1; }
step "$NAME runs as 65532:65532 and says: $out"
docker save -o "$OUT" "$NAME"
if [ -n "$PLAIN_OUT" ]; then
  docker tag "$RUNTIME" docker.io/library/plain-app:e2e
  if docker run --rm plain-app:e2e sh -c 'command -v leasehold || ls /usr/local/bin/leasehold' >/dev/null 2>&1; then
    echo "build-image: plain-app:e2e has a leasehold binary" >&2; exit 1
  fi
  step "plain-app:e2e: the runtime base alone, no leasehold in it"
  docker save -o "$PLAIN_OUT" docker.io/library/plain-app:e2e
fi
if [ -n "$PYTHON_OUT" ]; then
  PY_BASE=leasehold-e2e-python:bookworm
  if ! docker image inspect "$PY_BASE" >/dev/null 2>&1; then
    step "Python base $PY_BASE: debootstrap --variant=minbase --include=python3 bookworm"
    debootstrap --variant=minbase --include=python3 bookworm "$work/pyroot" >"$work/debootstrap-py.log" 2>&1 ||
      { tail -20 "$work/debootstrap-py.log" >&2; exit 1; }
    tar -C "$work/pyroot" -c . | docker import - "$PY_BASE" >/dev/null
  fi
  step "docker.io/library/leasehold-python:e2e: the Python client on $PY_BASE"
  mkdir -p "$work/py"
  "${LEASEHOLD_PYTHON:-python3}" -m pip install --quiet --disable-pip-version-check --target "$work/py/site" ./clients/python
  cat > "$work/py/Dockerfile" <<'DOCKERFILE'
ARG BASE
FROM ${BASE}
COPY site /opt/leasehold-client
ENV PYTHONPATH=/opt/leasehold-client PYTHONUNBUFFERED=1
USER 65532:65532
DOCKERFILE
  DOCKER_BUILDKIT=0 docker build -q --build-arg BASE="$PY_BASE" -t docker.io/library/leasehold-python:e2e "$work/py" \
    >"$work/build-py.log" 2>&1 || { cat "$work/build-py.log" >&2; exit 1; }
  out=$(docker run --rm leasehold-python:e2e python3 -c 'import leasehold_client; print(leasehold_client.__version__)')
  step "leasehold-python:e2e imports leasehold_client $out"
  docker save -o "$PYTHON_OUT" docker.io/library/leasehold-python:e2e
fi
