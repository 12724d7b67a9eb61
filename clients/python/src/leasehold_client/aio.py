"""The asyncio variant: the same protocol and rules as :class:`~leasehold_client.Lock`,
awaited. The waits run on a worker thread; cancelling an ``acquire`` withdraws its
claim (and gives back a grant that came as it was cancelled).

.. code-block:: python

    async with AsyncLock("db-migration") as guard:
        await do_work(guard.fencing_token)   # check guard.lost before each fenced write
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Optional

from .lock import Cancel, Guard, Lock, _Mode

log = logging.getLogger("leasehold_client")


class AsyncGuard:
    """A held grant, for asyncio: :attr:`lost` is an :class:`asyncio.Event` to await,
    set on the loop's next turn after the loss; :meth:`is_lost` and :meth:`check` read
    the loss itself, at once (use them before each fenced write)."""

    def __init__(self, guard: Guard, loop: asyncio.AbstractEventLoop) -> None:
        self.guard = guard
        self.lost = asyncio.Event()
        def lost(_reason: str) -> None:
            loop.call_soon_threadsafe(self.lost.set)

        guard.on_lost(lost)

    @property
    def fencing_token(self) -> int:
        """The grant's fencing token."""
        return self.guard.fencing_token

    @property
    def claim(self) -> str:
        """The claim Lease's name."""
        return self.guard.claim

    @property
    def lost_reason(self) -> Optional[str]:
        """Why the grant was lost, or ``None``."""
        return self.guard.lost_reason

    def is_lost(self) -> bool:
        """Whether the grant is lost (set no later than the holder's deadline)."""
        return self.guard.is_lost()

    def check(self) -> None:
        """Raise :class:`~leasehold_client.LockLost` if the grant is lost."""
        self.guard.check()

    async def release(self, tries: int = 1) -> None:
        """Release (the last of reentrant acquisitions gives the grant back)."""
        await asyncio.to_thread(self.guard.release, tries)

    async def __aenter__(self) -> "AsyncGuard":
        return self

    async def __aexit__(self, kind: Any, value: Any, tb: Any) -> None:
        await asyncio.to_thread(self.guard.__exit__, kind, value, tb)


class AsyncLock:
    """A handle on one DistributedLock, for asyncio (arguments as :class:`Lock`'s)."""

    def __init__(self, name: str, namespace: Optional[str] = None, **options: Any) -> None:
        self.lock = Lock(name, namespace, **options)
        self._entered: list = []

    async def _run(self, mode: _Mode) -> Optional[AsyncGuard]:
        loop = asyncio.get_running_loop()
        cancel = Cancel()
        future = loop.run_in_executor(None, self.lock._acquire, mode, cancel)
        try:
            guard = await asyncio.shield(future)
        except asyncio.CancelledError:
            cancel.cancel()

            def give_back(done: "asyncio.Future[Optional[Guard]]") -> None:
                granted = None if done.cancelled() or done.exception() is not None else done.result()
                if granted is not None:  # released off the event loop: it blocks
                    threading.Thread(target=granted.release, name="leasehold-release", daemon=True).start()

            future.add_done_callback(give_back)
            raise
        return None if guard is None else AsyncGuard(guard, loop)

    async def acquire(self, timeout: Optional[float] = None) -> AsyncGuard:
        """Wait (FIFO) until granted; with ``timeout`` raise :class:`~leasehold_client.Timeout`."""
        guard = await self._run(_Mode("wait") if timeout is None else _Mode("until", timeout))
        assert guard is not None
        return guard

    async def try_acquire(self) -> Optional[AsyncGuard]:
        """Take the lock only if granted without waiting behind anyone; else ``None``."""
        return await self._run(_Mode("try"))

    async def __aenter__(self) -> AsyncGuard:
        guard = await self.acquire()
        self._entered.append(guard)
        return guard

    async def __aexit__(self, kind: Any, value: Any, tb: Any) -> None:
        await self._entered.pop().__aexit__(kind, value, tb)
