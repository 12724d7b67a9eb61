#!/usr/bin/env bash
# Provision the binaries of a local Kubernetes control plane (etcd, kube-apiserver,
# kube-controller-manager) and print the directory that holds them. With --node, also
# kubelet, kube-scheduler and kube-proxy (for the real-node and multi-node clusters,
# tests/e2e/real-node.sh and tests/e2e/cluster.sh).
#
# Order of search:
#   1. $KUBEBUILDER_ASSETS (the envtest layout: kube-apiserver, etcd, ... in one dir)
#   2. the cache, $LEASEHOLD_CACHE (default ~/.cache/leasehold)/k8s-v1.20.2/bin
#   3. on Debian-like systems: build Kubernetes v1.20.2 from Debian's source package
#      into that cache (about 4-5 minutes cold on 2 cores; apt-get needs root)
# Elsewhere it fails, saying how to supply the binaries.
#
# Idempotent, and safe when several processes provision at once (flock on the cache).
# Progress goes to stderr; the only line on stdout is the bin directory.
set -euo pipefail
# `leasehold dev` runs this script with scripts/apt.sh prepended; run as a file, source it.
declare -F apt_install >/dev/null || . "$(dirname "$0")/apt.sh"

K8S_VERSION=1.20.2
DEB_VERSION=1.20.5+really1.20.2-1.1+deb12u1
CACHE=${LEASEHOLD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/leasehold}
OUT=$CACHE/k8s-v$K8S_VERSION
BIN=$OUT/bin
NEEDED=(kube-apiserver kube-controller-manager etcd)
[ "${1:-}" = --node ] && NEEDED+=(kubelet kube-scheduler kube-proxy)

log() { printf '[provision] %s\n' "$*" >&2; }
have_all() { local d=$1 b; for b in "${NEEDED[@]}"; do [ -x "$d/$b" ] || return 1; done; }

if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ "${1:-}" != --node ]; then
  # envtest ships no kube-controller-manager; it is optional there (no GC of claims).
  if [ -x "$KUBEBUILDER_ASSETS/kube-apiserver" ] && [ -x "$KUBEBUILDER_ASSETS/etcd" ]; then
    echo "$KUBEBUILDER_ASSETS"; exit 0
  fi
  log "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS lacks kube-apiserver or etcd; ignoring it"
fi
if have_all "$BIN"; then echo "$BIN"; exit 0; fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.provision.lock"
if ! flock -n 9; then
  log "another process is provisioning $OUT; waiting for it"
  flock 9
fi
if have_all "$BIN"; then echo "$BIN"; exit 0; fi

if ! command -v apt-get >/dev/null 2>&1; then
  cat >&2 <<MSG
[provision] cannot build Kubernetes here: no apt-get (not Debian-like).
Supply the binaries instead, either:
  - set KUBEBUILDER_ASSETS to a dir with kube-apiserver and etcd
    (e.g. \`setup-envtest use 1.30 -p path\`), or
  - put kube-apiserver, kube-controller-manager and etcd in $BIN
MSG
  exit 1
fi

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
start=$(date +%s)
pkgs=(golang-go rsync make etcd-server etcd-client golang-github-modern-go-reflect2-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
src_list=/etc/apt/sources.list.d/leasehold-deb-src.sources
if [ ${#missing[@]} -gt 0 ] || [ ! -f "$src_list" ]; then
  if [ ! -f "$src_list" ]; then
    log "adding a deb-src entry for bookworm ($src_list)"
    $SUDO tee "$src_list" >/dev/null <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    apt_install "${missing[@]}"
  else
    $SUDO apt-get update -qq >&2 # for the new deb-src entry
  fi
fi

work=$(mktemp -d "$CACHE/build.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "downloading Debian's kubernetes $DEB_VERSION source (34 MB)"
(cd "$work" && apt-get source --download-only "kubernetes=$DEB_VERSION" >&2)
orig=$(ls "$work"/kubernetes_*.orig.tar.gz | head -n1)
log "unpacking $orig"
mkdir "$work/src"
tar -xzf "$orig" -C "$work/src" --strip-components=1
cd "$work/src"
log "swapping vendored reflect2 for Debian's v1.0.2 (v1.0.1 + Go>=1.18 crashes the apiserver)"
rm -rf vendor/github.com/modern-go/reflect2
cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
rm -f vendor/github.com/modern-go/reflect2/go.mod
mkdir -p .go/src/k8s.io && ln -s ../../.. .go/src/k8s.io/kubernetes
build=()
for b in "${NEEDED[@]}"; do [ "$b" = etcd ] || [ -x "$BIN/$b" ] || build+=("cmd/$b"); done
log "building ${build[*]} (about 4 minutes on 2 cores)"
if ! GOPATH=$PWD/.go GO111MODULE=off CGO_ENABLED=0 GOFLAGS= make WHAT="${build[*]}" >"$work/make.log" 2>&1; then
  tail -50 "$work/make.log" >&2
  log "building Kubernetes failed (the last 50 lines of its output are above)"
  exit 1
fi
mkdir -p "$BIN"
for target in "${build[@]}"; do cp "_output/bin/${target#cmd/}" "$BIN/.new-${target#cmd/}"; mv "$BIN/.new-${target#cmd/}" "$BIN/${target#cmd/}"; done
[ -e "$BIN/etcd" ] || ln -sf "$(command -v etcd || echo /usr/bin/etcd)" "$BIN/etcd"
log "done in $(( $(date +%s) - start ))s: $BIN"
echo "$BIN"
