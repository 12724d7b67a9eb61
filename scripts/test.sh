#!/usr/bin/env bash
# Run every check and test: formatting, clippy, unit and property tests, and the
# integration tests against a real local control plane (etcd + kube-apiserver +
# kube-controller-manager on loopback), plus the Helm chart checks.
# Installs what it needs on Debian/Ubuntu (root or sudo). Extra args go to the test binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

ensure_tools
provision_control_plane

step "Helm chart and example manifests: lint, template, kubernetes-validate --strict"
LEASEHOLD_HELM=$(scripts/chart-check.sh | sed -n 's/^LEASEHOLD_HELM=//p')
export LEASEHOLD_HELM

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --locked -- -D warnings

step "cargo test (unit, property and integration tests)"
cargo test --locked --no-fail-fast --all-targets -- "$@"
