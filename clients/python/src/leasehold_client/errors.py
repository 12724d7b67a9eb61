"""The client's errors, each naming what failed."""

from __future__ import annotations

from typing import Optional

#: What each refusal reason means, as the controller explains it.
REFUSE_MESSAGES = {
    "PodNotFound": "no pod of the name the claim gives (POD_NAME) exists in the lock's namespace",
    "PodUidMismatch": "the pod of that name has another UID than the claim gives (POD_UID)",
    "PodFinished": "the claim's pod has already finished",
    "QueueFull": "the lock's queue is full (spec.maxQueue claims wait): try again later",
    "LeaseMissing": "the claim states no positive spec.leaseDurationSeconds (removed by someone who may patch Leases)",
    "InvalidClaim": "the claim does not name its pod as a client writes it (changed by someone who may patch Leases)",
}


class LeaseholdError(Exception):
    """Any error of the leasehold client."""


class MissingIdentity(LeaseholdError):
    """The process's pod identity is incomplete."""

    def __init__(self, variable: str) -> None:
        super().__init__(
            f"missing pod identity: set {variable} (the downward API gives it), or run where the pod's "
            "service-account token names its pod (Kubernetes >= 1.21)"
        )
        self.variable = variable


class CrossNamespace(LeaseholdError):
    """Claims live in their pod's namespace."""

    def __init__(self, lock: str, pod: str) -> None:
        super().__init__(
            f"lock namespace {lock} differs from the pod's namespace {pod}: a pod can only lock in its own namespace"
        )


class NameTooLong(LeaseholdError):
    """The lock's name cannot go in a label value."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"lock name {name!r} is longer than 63 characters: claims name their lock in a label value, which holds at most 63"
        )


class NoSuchLock(LeaseholdError):
    """Taking the lock at once found no such DistributedLock."""

    def __init__(self, name: str) -> None:
        super().__init__(f"taking DistributedLock {name} at once: it does not exist")
        self.name = name


class EtcdUnsupported(LeaseholdError):
    """The lock keeps its claims in etcd: only the Rust client speaks that backend."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"DistributedLock {name} keeps its claims in etcd (spec.backend.etcd); the Python client "
            "supports the Kubernetes backend only (use the Rust client or `leasehold run`)"
        )


class Refused(LeaseholdError):
    """The controller does not queue the claim, and says why in the lock's status."""

    def __init__(self, lock: str, claim: str, reason: str) -> None:
        message = REFUSE_MESSAGES.get(reason, "unknown reason")
        super().__init__(f"the controller refuses claim {claim} of DistributedLock {lock}: {reason} ({message})")
        self.lock, self.claim, self.reason = lock, claim, reason


class ClaimCollected(LeaseholdError):
    """Two claims in a row (a try's one) were deleted before any status placed them:
    garbage-collected, their pod is not this one."""

    def __init__(self, claim: str, pod: str, uid: str) -> None:
        super().__init__(
            f"the claim Lease {claim} was deleted before any controller queued it: the garbage collector "
            f"deletes a claim whose ownerReference names no existing pod, so POD_NAME ({pod}) and POD_UID "
            f"({uid}) must be this pod's own (give them with the downward API)"
        )
        self.claim = claim


class ClaimLost(LeaseholdError):
    """The claim was lost while waiting (renewals failed for too long)."""

    def __init__(self, claim: str) -> None:
        super().__init__(f"the claim Lease {claim} was removed while waiting for the lock")
        self.claim = claim


class Timeout(LeaseholdError):
    """The lock was not granted in time (the claim was withdrawn)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the lock was not granted within {seconds:g} s")
        self.seconds = seconds


class ApiError(LeaseholdError):
    """A request to the API server failed."""

    def __init__(self, action: str, cause: BaseException, status: Optional[int] = None) -> None:
        super().__init__(f"{action}: {cause}")
        self.action, self.status = action, status


class LockLost(LeaseholdError):
    """Raised by :meth:`Guard.check` once the grant is lost: stop acting on the lock's behalf."""

    def __init__(self, claim: str, reason: str) -> None:
        super().__init__(f"the grant of claim {claim} is lost ({reason}): stop acting on the lock's behalf")
        self.claim, self.reason = claim, reason
