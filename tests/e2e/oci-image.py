#!/usr/bin/env python3
"""Write an OCI image layout tarball from a root filesystem directory, for
`ctr images import` (no registry, no Docker). One uncompressed layer.

usage: oci-image.py NAME ROOTFS OUT.tar -- ENTRYPOINT...
NAME is the full reference containerd stores, e.g. docker.io/library/leasehold:e2e.
"""
import hashlib
import io
import json
import sys
import tarfile


def blob(tar, data):
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"digest": f"sha256:{digest}", "size": len(data)}


def owned_by_root(info):
    """tar filter: files owned by root (mutating: TarInfo.replace() deep-copies the archive)."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def main():
    name, rootfs, out = sys.argv[1:4]
    entrypoint = sys.argv[sys.argv.index("--") + 1:]
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as layer:
        layer.add(rootfs, arcname=".", filter=owned_by_root)
    layer_bytes = layer_buf.getvalue()
    with tarfile.open(out, mode="w") as tar:
        layer_desc = blob(tar, layer_bytes)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "Env": ["PATH=/usr/local/bin:/bin"], "WorkingDir": "/"},
            "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        }
        config_desc = blob(tar, json.dumps(config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **config_desc},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", **layer_desc}],
        }
        manifest_desc = blob(tar, json.dumps(manifest).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **manifest_desc,
                "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]},
            }],
        }
        for path, data in (("index.json", json.dumps(index).encode()), ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')):
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    main()
