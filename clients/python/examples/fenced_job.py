"""A job that takes its turn on a DistributedLock and writes with its fencing token.

Run it in a pod (with examples/rbac.yaml's ServiceAccount, or the downward API's
POD_NAME / POD_NAMESPACE / POD_UID), against a lock such as examples/lock.yaml's:

    python fenced_job.py my-lock
"""

import logging
import sys
import time

from leasehold_client import Lock, LockLost


def write(step: int, token: int) -> None:
    """Stands for a write to storage that rejects tokens lower than the last it saw."""
    print(f"step {step} written with fencing token {token}", flush=True)


def main(name: str) -> int:
    logging.basicConfig(level=logging.INFO)
    lock = Lock(name, on_wait=lambda position, holders: print(f"waiting: #{position}, held by {holders}"))
    with lock as guard:
        print(f"granted {name} with token {guard.fencing_token}", flush=True)
        try:
            for step in range(5):
                guard.check()
                write(step, guard.fencing_token)
                time.sleep(1)
        except LockLost as e:
            print(f"stopped: {e}", file=sys.stderr)
            return 1
    print("released", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "my-lock"))
