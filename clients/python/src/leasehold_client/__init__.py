"""leasehold-client: fair (FIFO), fenced distributed locks for Kubernetes pods.

The Python client of `leasehold <https://github.com/leasehold-dev/leasehold>`_'s
``DistributedLock`` (``leasehold.dev/v1alpha1``), speaking the claim protocol of
``docs/protocol.md``:

.. code-block:: python

    from leasehold_client import Lock

    with Lock("db-migration") as guard:      # waits its turn, woken by a watch
        migrate(fencing_token=guard.fencing_token)
        guard.check()                         # raises LockLost once the grant is gone
"""

from ._kube import api_client
from .aio import AsyncGuard, AsyncLock
from .errors import (
    ApiError,
    ClaimCollected,
    ClaimLost,
    CrossNamespace,
    EtcdUnsupported,
    LeaseholdError,
    LockLost,
    MissingIdentity,
    NameTooLong,
    NoSuchLock,
    Refused,
    Timeout,
)
from .lock import Cancelled, Guard, Lock
from .protocol import PodIdentity

__version__ = "0.1.0"
#: The protocol version (the leasehold release whose docs/protocol.md this client follows).
PROTOCOL_VERSION = "0.1.0"

__all__ = [
    "ApiError",
    "AsyncGuard",
    "AsyncLock",
    "Cancelled",
    "ClaimCollected",
    "ClaimLost",
    "CrossNamespace",
    "EtcdUnsupported",
    "Guard",
    "LeaseholdError",
    "Lock",
    "LockLost",
    "MissingIdentity",
    "NameTooLong",
    "NoSuchLock",
    "PodIdentity",
    "Refused",
    "Timeout",
    "api_client",
]
