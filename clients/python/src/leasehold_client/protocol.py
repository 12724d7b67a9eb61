"""The claim protocol's pure rules, as ``docs/protocol.md`` states them.

Nothing here does I/O: what a claim looks like, the patches a client sends, the
hashes and signatures, the timing rules, and how a client reads a lock's status
(whether it is granted, and whether the status records its claim as it wrote it).
Every function mirrors one of the Rust crate's ``leasehold::protocol`` and is held to
the same test vectors (``docs/protocol-vectors.json``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import secrets as _secrets
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

#: The API group and version of DistributedLock.
GROUP = "leasehold.dev"
VERSION = "v1alpha1"
PLURAL = "distributedlocks"

#: The longest lock name a claim can name (it is a label value).
MAX_LOCK_NAME = 63
LOCK_LABEL = "leasehold.dev/lock"
POD_UID_ANNOTATION = "leasehold.dev/pod-uid"
RELEASED_ANNOTATION = "leasehold.dev/released"
RELEASED_LABEL = "leasehold.dev/released"
RELEASE_HASH_ANNOTATION = "leasehold.dev/release-hash"
WAIT_HASH_ANNOTATION = "leasehold.dev/wait-hash"
REQUESTED_AT_ANNOTATION = "leasehold.dev/requested-at"
WAIT_LEASE_ANNOTATION = "leasehold.dev/wait-lease-seconds"
#: Set on a claim at creation ("true"): this process watches its claim while designated,
#: so the controller writes the direct grant there when it cannot tell it over HTTP.
GRANT_WATCH_ANNOTATION = "leasehold.dev/grant-watch"
#: Written by the controller on such a claim: "<token> <signature hex>".
DIRECT_GRANT_ANNOTATION = "leasehold.dev/direct-grant"

#: The lease a lock states when its spec gives none, in seconds.
DEFAULT_LEASE_SECONDS = 15
#: The longest lease a lock or a claim may state, in seconds.
MAX_LEASE_SECONDS = 3600

# --- timing (seconds, float) ---------------------------------------------------

#: Extra time beyond a lease before the controller judges a claim expired.
EXPIRY_GRACE = 2.0
#: The shortest time a renewal request may take before it counts as failed.
MIN_RENEW_TIMEOUT = 0.2
#: The least lease a waiting claim lives by.
WAIT_LEASE = 240.0
#: How often a waiting claimant reads its lock afresh beside its watch (a holder: every
#: ``renew_interval``): the bound on how long a watch stalled on a dead connection can
#: hide a grant.
WAIT_CHECK = 600.0
#: How long the API server keeps a client's watch of its lock open before ending it.
WATCH_TIMEOUT = 1800.0
#: How long a claim may stay unplaced before the client reads it back.
UNQUEUED_NOTICE = 5.0
#: How long ``try_acquire`` waits for the controller to place its claim.
TRY_ACQUIRE_TIMEOUT = 30.0
#: The longest pause before claiming anew within one acquisition.
CLAIM_ANEW_MAX = 5.0


def safety_margin(lease: float) -> float:
    """How long before its lease runs out a holder stops: a quarter, at least 250 ms."""
    return max(lease / 4, 0.25)


def renew_interval(lease: float) -> float:
    """How often a holder renews: a third of its lease."""
    return lease / 3


def wait_lease(lease: float) -> float:
    """The lease a waiting claim lives by: the longer of its lease and 240 s."""
    return max(lease, WAIT_LEASE)


def wait_renew_interval(lease: float) -> float:
    """How often a waiting claim is renewed: a third of its wait lease."""
    return renew_interval(wait_lease(lease))


def renew_retry_max(lease: float) -> float:
    """The longest pause between renewal attempts after failures."""
    return max(renew_interval(lease) / 4, 0.1)


def renew_timeout(lease: float) -> float:
    """How long one renewal request may take before it counts as failed."""
    return max(renew_interval(lease), MIN_RENEW_TIMEOUT)


def client_stop_by(sent: float, lease: float) -> float:
    """By when a holder stops acting on a write sent at ``sent`` (monotonic clock)."""
    return sent + max(lease - safety_margin(lease), 0.0)


def may_hold(now: float, valid_until: float, lease: float) -> bool:
    """Whether a granted claim may start acting: its deadline a margin ahead."""
    return now + safety_margin(lease) < valid_until


def claim_anew_pause(n: int) -> float:
    """How long to pause before the ``n``-th claim of one acquisition (0: the first):
    none before the first two, then 100 ms doubling up to ``CLAIM_ANEW_MAX``, so a
    claim that keeps going costs a create every few seconds, not a loop."""
    if n < 2:
        return 0.0
    return min(0.1 * 2 ** min(n - 2, 16), CLAIM_ANEW_MAX)


def release_budget(lease: float) -> float:
    """How long a finished holder keeps retrying a failed release: half its lease."""
    return lease / 2


def notice_timeout(lease: float) -> float:
    """How long a holder waits for its release notice's answer: lease/8 in [125 ms, 1 s]."""
    return min(max(lease / 8, 0.125), 1.0)


def controller_expiry(seen: float, spec_lease: float, claim_lease: float) -> float:
    """When the controller may expire an unrenewed claim last seen renewed at ``seen``."""
    return seen + max(spec_lease, claim_lease) + EXPIRY_GRACE


# --- secrets and hashes -----------------------------------------------------------


def hash_of(mark: str) -> str:
    """SHA-256 of ``mark``'s UTF-8 bytes, 64 lower-case hex digits."""
    return hashlib.sha256(mark.encode("utf-8")).hexdigest()


def is_hash(text: str) -> bool:
    """Whether ``text`` is 64 lower-case hex digits: the one form a hash takes on a claim."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


class Secret:
    """A claim's release secret: 32 random bytes, hex-encoded. Never logged."""

    __slots__ = ("_value",)

    def __init__(self, value: Optional[str] = None) -> None:
        self._value = value if value is not None else _secrets.token_bytes(32).hex()

    def __repr__(self) -> str:
        return "Secret(..)"

    def reveal(self) -> str:
        """The value written as the release mark (or sent in a notice)."""
        return self._value

    def hash(self) -> str:
        """The release hash written on the claim at creation."""
        return hash_of(self._value)

    def wait_proof(self) -> str:
        """What the owner shows when it waits for a direct grant."""
        return hash_of("leasehold-wait:" + self._value)

    def wait_hash(self) -> str:
        """The wait hash written on the claim at creation."""
        return hash_of(self.wait_proof())


# --- names and objects --------------------------------------------------------------


def claim_name(lock: str) -> str:
    """A fresh claim name: ``<lock head>-<12 hex digits>``, within 63 characters."""
    suffix = "%012x" % _secrets.randbits(48)
    head = lock[: 63 - 1 - len(suffix)].rstrip("-.")
    return f"{head}-{suffix}"


def is_claim_name(name: str, lock: str) -> bool:
    """Whether ``name`` is one :func:`claim_name` makes for ``lock``."""
    head, sep, suffix = name.rpartition("-")
    if not sep or not head:
        return False
    return lock.startswith(head) and len(suffix) == 12 and all(c in "0123456789abcdef" for c in suffix)


def micro_time(at: Optional[_dt.datetime] = None) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with microseconds, ``Z``."""
    at = at or _dt.datetime.now(_dt.timezone.utc)
    return at.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class PodIdentity:
    """The pod a process claims for."""

    name: str
    namespace: str
    uid: str


def claim_lease(name: str, lock: str, pod: PodIdentity, lease_seconds: int, secret: Secret) -> dict:
    """The claim Lease a process creates to ask for ``lock``."""
    waiting = int(wait_lease(float(max(lease_seconds, 1))))
    now = micro_time()
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": pod.namespace,
            "labels": {LOCK_LABEL: lock},
            "annotations": {
                POD_UID_ANNOTATION: pod.uid,
                REQUESTED_AT_ANNOTATION: now,
                WAIT_LEASE_ANNOTATION: str(waiting),
                RELEASE_HASH_ANNOTATION: secret.hash(),
                WAIT_HASH_ANNOTATION: secret.wait_hash(),
                GRANT_WATCH_ANNOTATION: "true",
            },
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}],
        },
        "spec": {"holderIdentity": pod.name, "leaseDurationSeconds": lease_seconds, "renewTime": now},
    }


def renew_patch(uid: Optional[str]) -> dict:
    """The merge patch that renews a claim; with its UID it renews only that object."""
    patch: dict = {"spec": {"renewTime": micro_time()}}
    if uid:
        patch["metadata"] = {"uid": uid}
    return patch


def release_patch(lock: str, secret: Secret) -> dict:
    """The merge patch that releases (or withdraws) a claim: the mark, its label, the lock label."""
    return {
        "metadata": {
            "annotations": {RELEASED_ANNOTATION: secret.reveal()},
            "labels": {RELEASED_LABEL: "true", LOCK_LABEL: lock},
        }
    }


# --- reading a lock's status ---------------------------------------------------------

Status = Mapping[str, Any]


def granted_token(status: Status, claim: str) -> Optional[int]:
    """The token with which ``status`` grants ``claim``: listed as an unrevoked holder."""
    for h in status.get("holders") or []:
        if h.get("claim") == claim and h.get("revoked") is None:
            return int(h["fencingToken"])
    return None


def still_grants(status: Status, claim: str, token: int) -> bool:
    """Whether ``status`` still lets the holder of ``claim``'s grant with ``token`` act."""
    if granted_token(status, claim) == token:
        return True
    s = status.get("successor") or {}
    return s.get("claim") == claim and s.get("fencingToken") == token


def held_back(status: Status, claim: str) -> bool:
    """Whether ``status`` lists ``claim`` as a revoked holder whose slot is held back."""
    return any(h.get("claim") == claim and h.get("revoked") is not None for h in status.get("holders") or [])


def names_claim(status: Status, claim: str) -> bool:
    """Whether ``status`` names ``claim`` as a holder (revoked or not) or a waiter."""
    return any(h.get("claim") == claim for h in status.get("holders") or []) or any(
        w.get("claim") == claim for w in status.get("queue") or []
    )


def refusal(status: Status, claim: str) -> Optional[str]:
    """The reason ``status`` gives for refusing ``claim``, if it lists one."""
    for r in status.get("refused") or []:
        if r.get("claim") == claim:
            return r.get("reason")
    return None


#: A refusal a client gives up on at once (the others may be the controller's cache lagging).
FINAL_REFUSALS = frozenset({"QueueFull"})


@dataclass(frozen=True)
class Written:
    """What a claim's owner wrote on its claim at creation: what every status must record."""

    pod: str
    pod_uid: str
    release_hash: Optional[str]
    wait_hash: Optional[str]
    lease_seconds: int


#: The claim field each check names, as a user knows it.
TAMPERED_FIELDS = {
    "Pod": "spec.holderIdentity",
    "PodUid": POD_UID_ANNOTATION,
    "ReleaseHash": RELEASE_HASH_ANNOTATION,
    "Lease": "spec.leaseDurationSeconds",
    "Lock": f"metadata.labels[{LOCK_LABEL}]",
    "Owner": "metadata.ownerReferences",
    "WaitHash": WAIT_HASH_ANNOTATION,
}


def check_record(status: Status, claim: str, wrote: Written) -> Optional[str]:
    """The first field ``status`` records for ``claim`` otherwise than ``wrote`` says
    (a key of :data:`TAMPERED_FIELDS`); ``None`` when it matches or records nothing."""
    holder = next((h for h in status.get("holders") or [] if h.get("claim") == claim), None)
    if holder is not None:
        rec, granted, wait_hash = holder, True, None
        lease = holder.get("leaseDurationSeconds")
    else:
        rec = next((w for w in status.get("queue") or [] if w.get("claim") == claim), None)
        if rec is None:
            return None
        granted, wait_hash = False, rec.get("waitHash")
        s = status.get("successor") or {}
        leases = [x for x in (rec.get("leaseDurationSeconds"), s.get("leaseDurationSeconds") if s.get("claim") == claim else None) if x is not None]
        lease = max(leases) if leases else None
    if rec.get("pod") != wrote.pod:
        return "Pod"
    if rec.get("podUID") != wrote.pod_uid:
        return "PodUid"
    if rec.get("releaseHash") != wrote.release_hash:
        return "ReleaseHash"
    if not granted and wait_hash != wrote.wait_hash:
        return "WaitHash"
    # The owner's lease exactly: shorter, its process judged by less than it acts on;
    # longer (raised before the record), a revoked holder's slot held back that long.
    if lease != wrote.lease_seconds:
        return "Lease"
    return None


def claim_differs(stored: Mapping[str, Any], wrote: Written, lock: str) -> Optional[str]:
    """The first field of the claim Lease ``stored`` (as the API server has it now) that
    differs from what its owner wrote for ``lock``."""
    meta = stored.get("metadata") or {}
    labels = meta.get("labels") or {}
    ann = meta.get("annotations") or {}
    spec = stored.get("spec") or {}
    owned = any(
        o.get("kind") == "Pod" and o.get("name") == wrote.pod and o.get("uid") == wrote.pod_uid
        for o in meta.get("ownerReferences") or []
    )
    if (labels.get(LOCK_LABEL) or None) != lock:
        return "Lock"
    if spec.get("holderIdentity") != wrote.pod:
        return "Pod"
    if ann.get(POD_UID_ANNOTATION) != wrote.pod_uid:
        return "PodUid"
    if ann.get(RELEASE_HASH_ANNOTATION) != wrote.release_hash:
        return "ReleaseHash"
    if not owned:
        return "Owner"
    if ann.get(WAIT_HASH_ANNOTATION) != wrote.wait_hash:
        return "WaitHash"
    if spec.get("leaseDurationSeconds") != wrote.lease_seconds:
        return "Lease"
    return None


# --- signatures -------------------------------------------------------------------------


def grant_message(namespace: str, lock: str, lock_uid: str, claim: str, token: int) -> bytes:
    """The bytes a direct grant's signature signs."""
    return f"leasehold direct grant v1\n{namespace}\n{lock}\n{lock_uid}\n{claim}\n{token}\n".encode()


def told_by_annotation(public_key_hex: str, message: bytes, token: int, value: str) -> bool:
    """Whether ``value`` (the claim's ``DIRECT_GRANT_ANNOTATION``) tells the grant of
    ``token`` whose signed bytes are ``message``: the token, a space, its signature by
    ``public_key_hex``. Anyone who may patch Leases can write the annotation; none but
    the controller can sign it."""
    written, sep, signature = value.partition(" ")
    return bool(sep) and written == str(token) and verify(public_key_hex, message, signature)


def written_message(namespace: str, lock: str, lock_uid: str, claim: str) -> bytes:
    """The bytes a written release answer's signature signs."""
    return f"leasehold release written v1\n{namespace}\n{lock}\n{lock_uid}\n{claim}\n".encode()


_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")


def verify(public_key_hex: str, message: bytes, signature_hex: str) -> bool:
    """Whether ``signature_hex`` signs ``message`` by the Ed25519 key ``public_key_hex``
    (hex digits only: ``bytes.fromhex`` would pass over spaces, Rust's reading does not)."""
    if not all(c in _HEX_DIGITS for c in public_key_hex + signature_hex):
        return False
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key_hex))
        key.verify(bytes.fromhex(signature_hex), message)
        return True
    except (ValueError, InvalidSignature):
        return False


def endpoint(release_url: str, path: str) -> Optional[str]:
    """``release_url`` + ``path`` if the URL is a plain ``http://host:port``; else ``None``."""
    from urllib.parse import urlsplit

    url = release_url.rstrip("/") + path
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme != "http" or not parts.hostname or port is None:
        return None
    return url
