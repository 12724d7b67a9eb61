#!/usr/bin/env bash
# Regenerate the CRD YAML from the Rust types: crds/ and the chart's copy.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo run -q --features cli -- crd > crds/distributedlock.yaml
cp crds/distributedlock.yaml charts/leasehold/files/distributedlock.yaml
