#!/usr/bin/env python3
"""Print an example manifest as the e2e cluster runs it, changing only what the
cluster needs, never what the example does:

  tests/e2e/example.py FILE IMAGE=REPLACEMENT... [--host-network API_HOST:API_PORT]

Each IMAGE=REPLACEMENT renames an image (the placeholders to the images imported into
the nodes, whose pull policy then becomes Never: nothing can be pulled here). With
--host-network (the real node has no pod network and no kube-proxy), every pod runs on
the host's network and every container reaches the API server at API_HOST:API_PORT.
"""
import sys

import yaml


def pod_specs(doc):
    """The pod specs of a manifest document (Pod, workload template, CronJob)."""
    kind, spec = doc.get("kind"), doc.get("spec") or {}
    if kind == "Pod":
        yield spec
    elif kind in ("Deployment", "Job", "StatefulSet", "DaemonSet", "ReplicaSet"):
        yield spec["template"]["spec"]
    elif kind == "CronJob":
        yield spec["jobTemplate"]["spec"]["template"]["spec"]


def adapt(doc, images, api):
    for pod in pod_specs(doc):
        if api:
            pod["hostNetwork"] = True
            pod["dnsPolicy"] = "ClusterFirstWithHostNet"
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            if c["image"] in images:
                c["image"] = images[c["image"]]
                c["imagePullPolicy"] = "Never"
            if api:
                host, port = api.rsplit(":", 1)
                c.setdefault("env", []).extend(
                    [{"name": "KUBERNETES_SERVICE_HOST", "value": host},
                     {"name": "KUBERNETES_SERVICE_PORT", "value": port}])
    return doc


def main(argv):
    api = None
    if "--host-network" in argv:
        i = argv.index("--host-network")
        api = argv[i + 1]
        del argv[i:i + 2]
    path, pairs = argv[0], argv[1:]
    images = dict(p.split("=", 1) for p in pairs)
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    yaml.safe_dump_all([adapt(d, images, api) for d in docs], sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main(sys.argv[1:])
