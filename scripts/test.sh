#!/usr/bin/env bash
# Run every check and test: formatting, clippy, the Helm chart checks, the end-to-end
# scenario on a real node and, with the multi-node faults, on a 3-node cluster (as root),
# the Python client's own tests, and unit, property and integration tests (the
# conformance suite of both clients among them) against a real local control plane
# (etcd + kube-apiserver + kube-controller-manager on loopback).
# Installs what it needs on Debian/Ubuntu (root or sudo). Extra args go to the test binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

ensure_tools
provision_control_plane

step "Dockerfile.build compiles from exactly its context: scripts/image-context-check.sh"
scripts/image-context-check.sh

step "the release workflow parses and validates (GitHub's workflow parser): scripts/workflow-lint.sh"
scripts/workflow-lint.sh

step "the client library embeds in a user's crate with its own k8s-openapi version: tests/embed"
deps() { sed -n '/^\[dependencies\]$/,/^$/{/^$/d;p}' "$@"; }
readme=$(awk '/^```toml$/{f=1;next} /^```$/{if(f)exit} f' README.md | deps)
diff <(echo "$readme") <(deps tests/embed/Cargo.toml) ||
  { echo "tests/embed/Cargo.toml's [dependencies] are not the README's (above: README <, embed >)" >&2; exit 1; }
cargo run --locked --quiet --manifest-path tests/embed/Cargo.toml
unwanted=$(cargo tree --locked -q -e normal --prefix none --manifest-path tests/embed/Cargo.toml -p leasehold |
  awk '{print $1}' | sort -u | grep -E '^(clap|axum|prometheus-client|kube-lease-manager|tracing-subscriber|nix|command-fds|humantime|anyhow|serde_yaml|serde_norway|etcd-client)$' || true)
[ -z "$unwanted" ] || { echo "the client feature pulls in: $unwanted" >&2; exit 1; }

step "the library as published: cargo publish --dry-run (packages it, builds the package with default features)"
# A library selects no Kubernetes version; the dry run's own build takes one from here.
K8S_OPENAPI_ENABLED_VERSION=1.33 cargo publish --dry-run --allow-dirty --locked

step "the API docs as docs.rs builds them (Cargo.toml's package.metadata.docs.rs features), no warnings"
features=$(sed -n '/^\[package.metadata.docs.rs\]/,/^\[/s/^features = \[\(.*\)\]$/\1/p' Cargo.toml | tr -d '" ')
[ -n "$features" ] || { echo "Cargo.toml names no docs.rs features" >&2; exit 1; }
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --locked --features "$features"

step "cargo fmt --check"
cargo fmt --all -- --check

step "the client library's own targets with default features: cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets --locked -- -D warnings

step "cargo clippy --all-targets --features cli -- -D warnings"
cargo clippy --all-targets --locked --features cli -- -D warnings

step "Helm chart and example manifests: lint, template, kubernetes-validate --strict"
tools=$(scripts/chart-check.sh)
LEASEHOLD_HELM=$(sed -n 's/^LEASEHOLD_HELM=//p' <<<"$tools")
export LEASEHOLD_HELM

step "the chart's alert rules and dashboard: promtool check and test rules, every dashboard query parsed"
scripts/check-observability.sh

step "the Python client (clients/python): pip install into a virtualenv, its unit tests with pytest"
# The conformance suite (cargo test below) drives it through this interpreter, and the
# real-node e2e installs it into its Python image with this pip.
venv=${XDG_CACHE_HOME:-$HOME/.cache}/leasehold/python-client
python3 -m venv --clear "$venv" 2>/dev/null || { apt_install python3-venv python3-pip; python3 -m venv --clear "$venv"; }
"$venv/bin/pip" install --quiet --disable-pip-version-check "./clients/python[test]"
# As root, its keepalive test drops packets with iptables in a network namespace.
if [ "$(id -u)" = 0 ]; then
  command -v iptables >/dev/null && command -v unshare >/dev/null || apt_install iptables util-linux
fi
(cd clients/python && "$venv/bin/python" -m pytest -q -p no:cacheprovider && "$venv/bin/python" -m mypy --ignore-missing-imports src)
export LEASEHOLD_PYTHON="$venv/bin/python"

if [ "$(id -u)" = 0 ]; then
  step "end-to-end scenario on a real node (containerd + kubelet): tests/e2e/real-node.sh"
  tests/e2e/real-node.sh
  step "the scenario and the multi-node faults on a 3-node cluster: tests/e2e/multi-node.sh"
  tests/e2e/multi-node.sh
else
  printf '\n*** SKIPPED tests/e2e/real-node.sh and tests/e2e/multi-node.sh: they need root (containerd, kubelet, network namespaces). ***\n\n' >&2
fi

step "chaos soak, short version (60 s): cargo test --features cli --bench soak -- --seconds 60"
cargo test --locked --features cli --bench soak -- --seconds 60

step "cargo test --doc (the examples in the API docs)"
cargo test --locked --features cli --doc

step "cargo test (unit, property and integration tests)"
# No backtraces: a failing test's message, not forty frames of tokio, ends its report (a
# CI log shown in part keeps its tail). Re-run one test with RUST_BACKTRACE=1 for frames.
RUST_BACKTRACE=0 cargo test --locked --features cli --no-fail-fast --lib --bins --tests -- "$@"
