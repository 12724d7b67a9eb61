#!/usr/bin/env bash
# Dockerfile.build (the binary's build) compiles from exactly the context it copies: replay its
# COPY lines (minus .dockerignore) into a temp dir and run its cargo build there. No
# Docker needed; catches a manifest naming a file the image's context lacks.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh

ctx=$(mktemp -d /tmp/leasehold-image-context.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
# Files docker would send: everything not excluded by .dockerignore (its lines are
# plain top-level names here; anything fancier fails the check below).
mapfile -t ignored < <(grep -vE '^\s*(#|$)' .dockerignore)
for pat in "${ignored[@]}"; do
  [[ "$pat" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "image-context-check: unsupported .dockerignore line: $pat" >&2; exit 1; }
done
# The build stage's COPY lines (up to the first FROM after it).
mapfile -t copies < <(awk '/^FROM /{n++} n==1 && /^COPY /{print}' Dockerfile.build)
[ ${#copies[@]} -gt 0 ] || { echo "image-context-check: no COPY in the build stage" >&2; exit 1; }
for line in "${copies[@]}"; do
  read -r -a words <<<"${line#COPY }"
  dest=${words[-1]}; srcs=("${words[@]:0:${#words[@]}-1}")
  [ "$dest" = . ] || [ "$dest" = ./ ] || { echo "image-context-check: only 'COPY ... .' is replayed: $line" >&2; exit 1; }
  for src in "${srcs[@]}"; do
    if [ "$src" = . ]; then
      excludes=(); for pat in "${ignored[@]}"; do excludes+=(--exclude "./$pat"); done
      tar -c "${excludes[@]}" . | tar -x -C "$ctx"
    else
      cp -a "$src" "$ctx/"
    fi
  done
done
# The same cargo command, in the debug profile (which the tests' build has cached): a
# missing file fails the manifest whatever the profile.
cmd=$(awk '/^FROM /{n++} n==1 && /^RUN cargo build/{sub(/^RUN /, ""); sub(/ &&.*/, ""); sub(/ --release/, ""); print}' Dockerfile.build)
[ -n "$cmd" ] || { echo "image-context-check: no 'RUN cargo build' in the build stage" >&2; exit 1; }
step "image context: $cmd (in a copy of Dockerfile.build's context)"
(cd "$ctx" && eval "$cmd" --quiet)
