# `docker buildx bake`: the binary (Dockerfile.build) then the image (Dockerfile) in one
# command. `docker buildx bake release` builds linux/amd64 + linux/arm64 and pushes
# (REGISTRY, VERSION, REVISION from the environment); .github/workflows/release.yml runs it.
variable "REGISTRY" { default = "ghcr.io/leasehold-dev" }
variable "VERSION" { default = "0.1.0" }
variable "REVISION" { default = "unknown" }

group "default" { targets = ["image"] }

target "build" {
  context    = "."
  dockerfile = "Dockerfile.build"
  args       = { REVISION = REVISION }
}

target "image" {
  context    = "."
  dockerfile = "Dockerfile"
  contexts   = { "leasehold-build" = "target:build" }
  args       = { VERSION = VERSION, REVISION = REVISION }
  tags       = ["leasehold:${VERSION}"]
}

target "release" {
  inherits  = ["image"]
  contexts  = { "leasehold-build" = "target:build-release" }
  platforms = ["linux/amd64", "linux/arm64"]
  tags      = ["${REGISTRY}/leasehold:${VERSION}"]
}

target "build-release" {
  inherits  = ["build"]
  platforms = ["linux/amd64", "linux/arm64"]
}
