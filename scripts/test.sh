#!/usr/bin/env bash
# Run every check and test leasehold has: formatting, clippy, unit and property tests,
# and the integration tests against a real local control plane (etcd + kube-apiserver +
# kube-controller-manager, provisioned by scripts/provision-k8s.sh on first use).
#
# Installs what it needs on Debian/Ubuntu (as root or with sudo): protoc-free, so only
# the control-plane packages the provisioner names.
set -euo pipefail
cd "$(dirname "$0")/.."

# Keep cargo's build cache between runs (CI starts from a fresh clone each time).
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/leasehold/target}
export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
step() { printf '\n==> %s\n' "$*" >&2; }

step "provisioning the local control plane binaries"
LEASEHOLD_K8S_BIN=$(scripts/provision-k8s.sh)
export LEASEHOLD_K8S_BIN

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --locked -- -D warnings

step "cargo test (unit, property and integration tests)"
cargo test --locked --all-targets -- "$@"
