# Multi-arch release build: `docker buildx bake release` (REGISTRY, VERSION and
# REVISION from the environment). Used by .github/workflows/release.yml.
variable "REGISTRY" { default = "ghcr.io/leasehold-dev" }
variable "VERSION" { default = "0.1.0" }
variable "REVISION" { default = "unknown" }

target "release" {
  context    = "."
  dockerfile = "Dockerfile"
  platforms  = ["linux/amd64", "linux/arm64"]
  args = {
    VERSION  = VERSION
    REVISION = REVISION
  }
  tags = ["${REGISTRY}/leasehold:${VERSION}"]
}
