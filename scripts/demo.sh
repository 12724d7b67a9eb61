#!/usr/bin/env bash
# The main job on an embedded default: start a local control plane (etcd,
# kube-apiserver, kube-controller-manager on loopback), install the CRD, run the
# controller, and show a lock handed between three clients; then tear it all down.
# Installs what it needs on Debian/Ubuntu (root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

ensure_tools
provision_control_plane
step "building leasehold"
cargo build --locked --quiet --features cli
exec "$CARGO_TARGET_DIR/debug/leasehold" dev --demo
