# Shared by scripts/demo.sh and scripts/test.sh: install what a fresh Debian/Ubuntu
# machine lacks, and keep cargo's build cache between runs.

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/leasehold/target}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
step() { printf '\n==> %s\n' "$*" >&2; }
. "$(dirname "${BASH_SOURCE[0]}")/apt.sh"

ensure_tools() {
  local sudo="" missing=()
  [ "$(id -u)" = 0 ] || sudo=sudo
  # protoc: the etcd backend's client (etcd-client) compiles etcd's protobufs.
  for tool in openssl curl gcc protoc; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  # ... and protobuf's well-known types (google/protobuf/descriptor.proto), which
  # Debian ships apart from protoc, in libprotobuf-dev (protoc may be there without it).
  [ -f /usr/include/google/protobuf/descriptor.proto ] || missing+=(libprotobuf-dev)
  if [ ${#missing[@]} -gt 0 ]; then
    missing=("${missing[@]/gcc/build-essential}")
    apt_install "${missing[@]/protoc/protobuf-compiler}" ca-certificates
  fi
  if ! command -v cargo >/dev/null 2>&1; then
    [ -x "$HOME/.cargo/bin/cargo" ] || { step "installing the Rust toolchain (rustup)"; curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c clippy,rustfmt >&2; }
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
}

provision_control_plane() {
  step "provisioning the local control plane binaries (first time: builds Kubernetes v1.20.2, ~5-10 min)"
  local node=""
  [ "$(id -u)" = 0 ] && node=--node # root also runs the real-node e2e: build kubelet too
  LEASEHOLD_K8S_BIN=$(scripts/provision-k8s.sh $node)
  export LEASEHOLD_K8S_BIN
}
