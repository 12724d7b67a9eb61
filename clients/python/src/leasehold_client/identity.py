"""Which pod this process runs in, as a claim names it.

``POD_NAME``, ``POD_NAMESPACE`` and ``POD_UID`` win (the downward API gives them);
whatever they leave unset comes from the pod's bound service-account token, which names
its pod on Kubernetes >= 1.21. The token is read, not verified: it is this process's own
credential, and the API server checks it on every request.
"""

from __future__ import annotations

import base64
import json
import os
from typing import Callable, Optional, Tuple

from .errors import MissingIdentity
from .protocol import PodIdentity

#: Where Kubernetes mounts a pod's service-account token.
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def _token_pod(token: str) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    try:
        payload = token.strip().split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        k = claims.get("kubernetes.io") or {}
        pod = k.get("pod") or {}
        return k.get("namespace"), pod.get("name"), pod.get("uid")
    except (IndexError, ValueError, AttributeError):
        return None, None, None


def resolve(env: Callable[[str], Optional[str]], token: Optional[str], default_namespace: str) -> PodIdentity:
    """The identity from ``env`` and the pod's ``token``; the namespace defaults to
    ``default_namespace``. A name or UID found in neither raises :class:`MissingIdentity`."""
    t_ns, t_name, t_uid = _token_pod(token) if token else (None, None, None)
    name = env("POD_NAME") or t_name
    if not name:
        raise MissingIdentity("POD_NAME")
    uid = env("POD_UID") or t_uid
    if not uid:
        raise MissingIdentity("POD_UID")
    return PodIdentity(name=name, namespace=env("POD_NAMESPACE") or t_ns or default_namespace, uid=uid)


def from_pod(default_namespace: str) -> PodIdentity:
    """This process's pod identity: :func:`resolve` over the environment and the token file."""
    try:
        with open(TOKEN_PATH, encoding="utf-8") as f:
            token: Optional[str] = f.read()
    except OSError:
        token = None
    return resolve(lambda k: os.environ.get(k) or None, token, default_namespace)
