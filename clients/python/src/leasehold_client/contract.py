"""The conformance contract: drive this client from another program, one command a line.

``python -m leasehold_client.contract --lock NAME [--namespace NS] [--asyncio]`` reads
commands on stdin and writes one JSON object a line on stdout (the contract every
leasehold client implements: ``docs/conformance.md``). Commands: ``acquire``,
``acquire-timeout SECS``, ``try``, ``release``, ``report``, ``exit``. Answers: ``ready``,
``acquired`` (token, claim, depth), ``busy``, ``timeout``, ``refused`` (reason),
``no-such-lock``, ``collected``, ``released``, ``report``, ``error`` (message); at any
time ``lost`` (reason, token) once a held grant is lost. ``--asyncio`` drives
:class:`AsyncLock` instead of :class:`Lock`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import threading
from typing import Any, Awaitable, Callable, List, Optional, Union

from . import AsyncLock, Lock
from .errors import ClaimCollected, LeaseholdError, NoSuchLock, Refused, Timeout

_out = threading.Lock()


def say(event: str, **fields: Any) -> None:
    """Write one answer line."""
    with _out:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


def failed(e: LeaseholdError) -> None:
    """The answer for a failed command."""
    if isinstance(e, Refused):
        say("refused", reason=e.reason, message=str(e))
    elif isinstance(e, Timeout):
        say("timeout")
    elif isinstance(e, NoSuchLock):
        say("no-such-lock")
    elif isinstance(e, ClaimCollected):
        say("collected", message=str(e))
    else:
        say("error", message=str(e))


class Driver:
    """The commands, over a sync or an async lock: ``call`` runs a lock operation (awaits
    it under asyncio) and ``watch`` tells of a new grant's loss."""

    def __init__(self, lock: Union[Lock, AsyncLock], call: Callable[[Any], Awaitable[Any]], watch: Callable[[Any], None]) -> None:
        self.lock, self.call, self.watch = lock, call, watch
        self.guards: List[Any] = []

    async def command(self, words: List[str]) -> bool:
        """Run one command; false on ``exit``."""
        command = words[0]
        try:
            if command in ("acquire", "acquire-timeout", "try"):
                if command == "try":
                    guard = await self.call(self.lock.try_acquire())
                else:
                    timeout: Optional[float] = float(words[1]) if command == "acquire-timeout" else None
                    guard = await self.call(self.lock.acquire(timeout=timeout))
                if guard is None:
                    say("busy")
                    return True
                if not self.guards or self.guards[0].claim != guard.claim:
                    self.watch(guard)
                self.guards.append(guard)
                say("acquired", token=guard.fencing_token, claim=guard.claim, depth=len(self.guards))
            elif command == "release":
                if not self.guards:
                    say("error", message="nothing to release")
                    return True
                await self.call(self.guards.pop().release(tries=3))
                say("released", depth=len(self.guards))
            elif command == "report":
                g = self.guards[-1] if self.guards else None
                say(
                    "report",
                    holding=bool(g and not g.is_lost()),
                    token=g.fencing_token if g else None,
                    lost=g.lost_reason if g else None,
                    depth=len(self.guards),
                )
            elif command == "exit":
                return False
            else:
                say("error", message=f"unknown command {command!r}")
        except LeaseholdError as e:
            failed(e)
        except (IndexError, ValueError):
            say("error", message=f"bad command {' '.join(words)!r}")
        return True


async def _done(value: Any) -> Any:
    return value


async def serve(name: str, namespace: Optional[str], use_asyncio: bool) -> int:
    """Serve the contract until stdin ends or ``exit``."""
    loop = asyncio.get_running_loop()
    watchers: List["asyncio.Task[None]"] = []

    def tell_lost(reason: Any, token: int) -> None:
        say("lost", reason=reason, token=token)

    if use_asyncio:
        lock: Union[Lock, AsyncLock] = AsyncLock(name, namespace)

        async def call(value: Any) -> Any:
            return await value

        def watch(guard: Any) -> None:
            async def wait() -> None:
                await guard.lost.wait()
                tell_lost(guard.lost_reason, guard.fencing_token)

            watchers.append(loop.create_task(wait()))
    else:
        lock = Lock(name, namespace)

        async def call(value: Any) -> Any:
            return value  # the sync call has run

        def watch(guard: Any) -> None:
            token = guard.fencing_token
            guard.on_lost(lambda reason: tell_lost(reason, token))

    driver = Driver(lock, call, watch)
    say("ready")
    try:
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                return 0
            words = line.split()
            if words and not await _sync_or_async(driver, words, use_asyncio):
                return 0
    finally:
        for task in watchers:
            task.cancel()


async def _sync_or_async(driver: Driver, words: List[str], use_asyncio: bool) -> bool:
    if use_asyncio:
        return await driver.command(words)
    # The sync lock's calls block: run the whole command on a worker thread, so the
    # event loop (and nothing else) waits.
    return await asyncio.get_running_loop().run_in_executor(None, lambda: asyncio.run(driver.command(words)))


def main(argv: List[str] = sys.argv[1:]) -> int:
    parser = argparse.ArgumentParser(prog="python -m leasehold_client.contract")
    parser.add_argument("--lock", required=True)
    parser.add_argument("--namespace")
    parser.add_argument("--asyncio", action="store_true", help="drive AsyncLock instead of Lock")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    return asyncio.run(serve(args.lock, args.namespace, args.asyncio))


if __name__ == "__main__":
    sys.exit(main())
