"""The lock handle and the held grant.

``Lock.acquire`` reads the lock, creates a claim Lease, and waits (FIFO, woken by a
watch, never by polling) until the lock's status grants it, or a direct grant signed by
the lock's key comes first. Every status is checked against the claim as this process
wrote it before anything in it is acted on (the record check); a claim changed by
someone else is withdrawn and made anew. Once granted, the guard's ``lost`` event is set
as soon as the grant may be gone: revoked in the status, the record changed, the lock
deleted, the claim gone, or renewals failed until the holder's deadline.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from typing import Any, Callable, List, Optional, Tuple

from kubernetes import client as k8s

from . import _kube
from . import protocol as p
from ._http import REACH, DirectWait, NoticeTarget
from .errors import (
    ApiError,
    ClaimCollected,
    ClaimLost,
    CrossNamespace,
    EtcdUnsupported,
    LeaseholdError,
    LockLost,
    NameTooLong,
    NoSuchLock,
    Refused,
    Timeout,
)
from .identity import from_pod
from .session import CLAIM_GONE, LIVE, LOCK_DELETED, LOST, RENEWALS_FAILED, REVOKED, Session

log = logging.getLogger("leasehold_client")

#: The first pause between release attempts (doubling).
RELEASE_RETRY_DELAY = 0.2


class Cancel:
    """Cancels an acquire from another thread (the asyncio variant's cancellation)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cancelled = False
        self._wake: List[Callable[[], None]] = []

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            wake, self._wake = self._wake, []
        for w in wake:
            w()

    def on_cancel(self, wake: Callable[[], None]) -> None:
        with self._lock:
            if not self.cancelled:
                self._wake.append(wake)
                return
        wake()


class Cancelled(LeaseholdError):
    """The acquire was cancelled (the claim was withdrawn)."""


class _Mode:
    def __init__(self, kind: str, timeout: Optional[float] = None) -> None:
        self.kind = kind  # "wait", "try" or "until"
        self.limit = p.TRY_ACQUIRE_TIMEOUT if kind == "try" else timeout
        self.until = None if self.limit is None else time.monotonic() + self.limit

    def timed_out(self) -> Timeout:
        return Timeout(self.limit or 0.0)


class _Held:
    """One grant, shared by the reentrant acquisitions of one handle."""

    def __init__(self, session: Session, claim: _kube.KubeClaim, token: int, watch: _kube.LockWatch, events: "queue.Queue") -> None:
        self.session, self.claim, self.token = session, claim, token
        self._watch, self._events = watch, events
        #: Guards handed out and not yet released, under ``count_lock``.
        self.count = 1
        self.count_lock = threading.Lock()

    def join(self) -> bool:
        """One more guard on this grant, if it still stands and has one (reentrancy)."""
        with self.count_lock:
            if self.count == 0 or not self.session.is_live():
                return False
            self.count += 1
            return True

    def leave(self, ticket: List[bool]) -> bool:
        """A guard (its ``ticket``) is done with the grant: whether it was the last."""
        with self.count_lock:
            if ticket[0]:
                return False
            ticket[0] = True
            self.count -= 1
            return self.count == 0

    def release(self, tries: int) -> None:
        """Give the grant back: a notice, else the release mark, retried within half a lease."""
        as_holder = self.session.is_holding()
        self.session.finish()
        self._watch.stop()
        self._events.put(("stop", None))
        until = time.monotonic() + p.release_budget(self.session.lease)
        delay = RELEASE_RETRY_DELAY
        attempt = 0
        while True:
            attempt += 1
            try:
                if attempt == 1:
                    self.claim.give_up(as_holder)
                else:
                    self.claim.mark_released(min(p.renew_timeout(self.session.lease), max(until - time.monotonic(), 0.01)))
                return
            except ApiError as e:
                if attempt >= tries or time.monotonic() + delay >= until:
                    raise
                log.warning("claim %s: releasing failed (%s); retrying in %.1f s", self.claim.name, e, delay)
                time.sleep(delay)
                delay *= 2


class Guard:
    """A held grant. Act on the lock's behalf only while :attr:`lost` is not set, and hand
    :attr:`fencing_token` to whatever you write to. Release with :meth:`release` (or
    leave the ``with`` block)."""

    def __init__(self, held: _Held) -> None:
        self._held = held
        # Released (by release(), or when the guard is collected unreleased).
        self._ticket = [False]
        self._abandoned = weakref.finalize(self, _abandon, held, self._ticket)

    @property
    def fencing_token(self) -> int:
        """The grant's fencing token: strictly greater than every earlier grant's."""
        return self._held.token

    @property
    def claim(self) -> str:
        """The claim Lease's name."""
        return self._held.claim.name

    @property
    def lease_duration(self) -> float:
        """The lease, in seconds, the grant lives by."""
        return self._held.session.lease

    @property
    def valid_until(self) -> float:
        """By when, on ``time.monotonic()``, the holder must have stopped acting on the
        strength of its last successful renewal (its send time plus the lease less the
        safety margin). ``lost`` is set then at the latest, unless the process was paused
        or starved past it; ``is_lost()`` and ``check()`` read it too."""
        return self._held.session.valid_until

    @property
    def lost(self) -> threading.Event:
        """Set once the grant is lost: stop acting on the lock's behalf at once."""
        return self._held.session.lost_event

    @property
    def lost_reason(self) -> Optional[str]:
        """Why the grant was lost (``Revoked``, ``ClaimGone``, ``RenewalsFailed``,
        ``LockDeleted``), or ``None``."""
        return self._held.session.reason if self._held.session.state == LOST else None

    def is_lost(self) -> bool:
        """Whether the grant is lost, or its deadline (``valid_until``) has passed."""
        return self.lost.is_set() or self._held.session.past_deadline()

    def check(self) -> None:
        """Raise :class:`LockLost` if the grant is lost, its deadline has passed (before
        the renewal thread may have said so), or this process gave it back (call it
        before each fenced write)."""
        session = self._held.session
        if session.state != LIVE or self._ticket[0]:
            raise LockLost(self.claim, self.lost_reason or "Released")
        if session.past_deadline():
            raise LockLost(self.claim, RENEWALS_FAILED)

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` (on another thread) once the grant is lost."""
        self._held.session.on_lost(callback)

    def release(self, tries: int = 1) -> None:
        """Release (the last of reentrant acquisitions gives the grant back). A guard
        collected unreleased is released then (in the background), as a last resort."""
        self._abandoned.detach()
        if self._held.leave(self._ticket):
            self._held.release(tries)

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        try:
            self.release()
        except LeaseholdError:
            if kind is None:
                raise
            log.warning("claim %s: release failed; the claim will expire", self.claim, exc_info=True)


class Lock:
    """A handle on one DistributedLock for this process. Acquisitions through the same
    handle are reentrant: they share one grant, given back when the last is released.

    ``namespace`` defaults to the pod's; the identity comes from ``POD_NAME``,
    ``POD_NAMESPACE``, ``POD_UID`` or the pod's service-account token. ``on_wait`` is
    called with ``(position, holders)`` whenever the claim's place in the queue changes.
    """

    def __init__(
        self,
        name: str,
        namespace: Optional[str] = None,
        *,
        identity: Optional[p.PodIdentity] = None,
        api_client: Optional[k8s.ApiClient] = None,
        write_client: Optional[k8s.ApiClient] = None,
        on_wait: Optional[Callable[[int, List[str]], None]] = None,
    ) -> None:
        if len(name) > p.MAX_LOCK_NAME:
            raise NameTooLong(name)
        self.identity = identity or from_pod(namespace or "default")
        self.namespace = namespace or self.identity.namespace
        if self.identity.namespace != self.namespace:
            raise CrossNamespace(self.namespace, self.identity.namespace)
        self.name = name
        reads = api_client or _kube.api_client()
        writes = write_client or (_kube.api_client() if api_client is None else api_client)
        self._locks = k8s.CustomObjectsApi(reads)
        self._leases = k8s.CoordinationV1Api(writes)
        # A claim's watches go on the read client: they keep the write pool's connection
        # open for the release (``_kube.KubeClaim``).
        self._lease_watches = k8s.CoordinationV1Api(reads)
        self._on_wait = on_wait
        self._mutex = threading.Lock()
        self._held: Optional[_Held] = None
        self._entered: List[Guard] = []

    def acquire(self, timeout: Optional[float] = None) -> Guard:
        """Wait (FIFO) until the lock is granted; with ``timeout`` (seconds) withdraw the
        claim and raise :class:`Timeout` once it has passed."""
        guard = self._acquire(_Mode("wait") if timeout is None else _Mode("until", timeout), None)
        assert guard is not None
        return guard

    def try_acquire(self) -> Optional[Guard]:
        """Take the lock only if it is granted without waiting behind anyone; otherwise
        withdraw the claim and return ``None``. Raises :class:`NoSuchLock` when the lock
        does not exist."""
        return self._acquire(_Mode("try"), None)

    def __enter__(self) -> Guard:
        guard = self.acquire()
        self._entered.append(guard)
        return guard

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        self._entered.pop().__exit__(kind, value, tb)

    # --- acquiring -------------------------------------------------------------------

    def _acquire(self, mode: _Mode, cancel: Optional[Cancel]) -> Optional[Guard]:
        with self._mutex:
            held = self._held
            if held is not None and held.join():
                return Guard(held)
            lock = _kube.get_lock(self._locks, self.namespace, self.name)
            if lock is not None and ((lock.get("spec") or {}).get("backend") or {}).get("etcd"):
                raise EtcdUnsupported(self.name)
            granted = self._acquire_claim(lock, mode, cancel)
            if granted is None:
                return None
            self._held = granted
            return Guard(granted)

    def _acquire_claim(self, lock: Optional[dict], mode: _Mode, cancel: Optional[Cancel]) -> Optional[_Held]:
        exists = lock is not None
        if not exists and mode.kind == "try":
            raise NoSuchLock(self.name)
        secs = int(((lock or {}).get("spec") or {}).get("leaseDurationSeconds") or p.DEFAULT_LEASE_SECONDS)
        lease = float(max(secs, 1))
        events: "queue.Queue[Tuple[str, Any]]" = queue.Queue()
        cancelled = threading.Event()
        if cancel is not None:
            cancel.on_cancel(lambda: events.put(("cancel", None)))
            cancel.on_cancel(cancelled.set)
        # Watch first, so no status change between create and watch is missed. A waiter
        # reads afresh only rarely (a request a minute in all, see WAIT_CHECK); a holder
        # every renewal interval.
        watch: Optional[_kube.LockWatch] = _kube.LockWatch(self._locks, self.namespace, self.name, p.WAIT_CHECK, events.put)
        made, vanished = 0, False
        try:
            while True:
                _pause_before_claim(made, mode, cancelled)
                made += 1
                claim, sent = _kube.KubeClaim.create(self._leases, self.name, self.identity, secs, self._lease_watches)
                # From here on, whatever fails withdraws the claim (or gives the grant back).
                session: Optional[Session] = None
                wait: Optional[_Wait] = None
                try:
                    session = Session(claim.name, lease, sent, claim.renew)
                    session.on_lost(_tell(events, claim.name))
                    wait = _Wait(self, claim, session, mode, exists, events, cancel)
                    outcome, token = wait.run()
                    wait.direct.stop()
                    if outcome == "granted" and not self._hold(session, mode):
                        outcome = "lapsed"
                    if outcome == "granted":
                        assert watch is not None
                        watch.set_check_every(p.renew_interval(lease))
                        held = _Held(session, claim, token, watch, events)
                        threading.Thread(
                            target=_watch_revocation, args=(held, wait.wrote), name="leasehold-revocation", daemon=True
                        ).start()
                        watch = None
                        return held
                except BaseException:
                    if wait is not None:
                        wait.direct.stop()
                    _withdraw(session, claim)
                    raise
                _withdraw(session, claim)
                # A second claim in a row gone unplaced (or a try's, which does not claim
                # anew) was garbage-collected: its pod is named wrongly.
                if outcome == "vanished" and (vanished or mode.kind == "try"):
                    raise ClaimCollected(claim.name, self.identity.name, self.identity.uid)
                vanished = outcome == "vanished"
                if outcome in ("held-back", "dropped", "tampered", "lapsed", "vanished") and mode.kind != "try":
                    continue
                return None
        finally:
            if watch is not None:
                watch.stop()

    def _hold(self, session: Session, mode: _Mode) -> bool:
        """Hold a granted claim (renewing first if its last write is old): ``True`` once
        it may act, ``False`` when its claim was found gone meanwhile (the grant lapsed
        unseen, never acted on: the caller claims anew); any other loss raises."""
        try:
            session.hold(mode.until if mode.kind == "until" else None)
        except TimeoutError:
            raise mode.timed_out() from None
        except LookupError as e:
            if e.args and e.args[0] == CLAIM_GONE:
                log.warning(
                    "claim %s: the grant lapsed before this process could act on it (its claim is gone): "
                    "claiming anew",
                    session.claim,
                )
                return False
            log.warning("claim %s was lost as it was granted (%s)", session.claim, e)
            raise ClaimLost(session.claim) from None
        return True


def _pause_before_claim(n: int, mode: _Mode, cancelled: threading.Event) -> None:
    """Before the ``n``-th claim of one acquisition: pause as ``claim_anew_pause`` says,
    raising if the caller's time runs out (or the acquire is cancelled) first."""
    if cancelled.is_set():
        raise Cancelled("the acquire was cancelled")
    pause = p.claim_anew_pause(n)
    if pause <= 0:
        return
    until = time.monotonic() + pause
    if mode.kind == "until" and mode.until is not None and mode.until <= until:
        if cancelled.wait(max(0.0, mode.until - time.monotonic())):
            raise Cancelled("the acquire was cancelled")
        raise mode.timed_out()
    if cancelled.wait(pause):
        raise Cancelled("the acquire was cancelled")


def _tell(events: "queue.Queue[Tuple[str, Any]]", claim: str) -> Callable[[str], None]:
    """A loss listener that puts ``("lost", (claim, reason))`` on ``events``."""

    def lost(reason: str) -> None:
        events.put(("lost", (claim, reason)))

    return lost


def _abandon(held: _Held, ticket: List[bool]) -> None:
    """A guard was collected unreleased: if it was the last, give the grant back."""
    if not held.leave(ticket):
        return
    log.warning("claim %s: a guard was dropped without release(): releasing", held.claim.name)

    def release() -> None:
        try:
            held.release(1)
        except LeaseholdError as e:
            log.warning("claim %s: release of a dropped guard failed (%s); the claim will expire", held.claim.name, e)

    try:
        threading.Thread(target=release, name="leasehold-release", daemon=True).start()
    except RuntimeError:  # the interpreter is shutting down: release here
        release()


def _withdraw(session: Optional[Session], claim: _kube.KubeClaim) -> None:
    as_holder = session is not None and session.is_holding()
    if session is not None:
        session.finish()
    try:
        claim.give_up(as_holder)
    except LeaseholdError as e:
        log.warning("claim %s: withdrawing failed (%s); it will expire", claim.name, e)


def read_back_wait(n: int) -> float:
    """Seconds after its ``n``-th read-back past the notice time an unplaced claim is read
    back again: ``UNQUEUED_NOTICE``, doubling to a minute (as the Rust client)."""
    return min(p.UNQUEUED_NOTICE * 2 ** min(n, 4), 60.0)


class _Wait:
    """What one waiting claim has learnt so far."""

    def __init__(self, lock: Lock, claim: _kube.KubeClaim, session: Session, mode: _Mode, exists: bool, events: "queue.Queue", cancel: Optional[Cancel]) -> None:
        self.lock, self.claim, self.session, self.mode = lock, claim, session, mode
        self.events, self.cancel = events, cancel
        self.wrote = p.Written(
            pod=lock.identity.name,
            pod_uid=lock.identity.uid,
            release_hash=claim.secret.hash(),
            wait_hash=claim.secret.wait_hash(),
            lease_seconds=int(session.lease),
        )
        self.proof = claim.secret.wait_proof()
        self.started = time.monotonic()
        self.direct = DirectWait(lambda generation, token: events.put(("direct", (claim.name, generation, token))), claim.watch_self)
        self.refused: Optional[str] = None
        self.was_placed = False
        self.notices_to: Optional[NoticeTarget] = None
        self.unplaced_since: Optional[float] = self.started if exists else None
        self.settled = False
        #: When to read the claim back again while it stays unplaced after the notice
        #: time, and how many times it was read back since.
        self.read_back_at: Optional[float] = None
        self.read_backs = 0
        self.queued: Optional[Tuple[int, List[str]]] = None

    def run(self) -> Tuple[str, int]:
        """Wait until the claim is granted (``("granted", token)``) or the wait ends
        otherwise (``would-block``, ``held-back``, ``tampered``, ``dropped``, ``vanished``)."""
        while True:
            # The deadlines first: a steady stream of events must not postpone them.
            now = time.monotonic()
            if self.mode.until is not None and now >= self.mode.until:
                raise self.mode.timed_out()
            notice_at = self._notice_at()
            if notice_at is not None and now >= notice_at:
                ended = self._notice_due()
                if ended:
                    return ended
            if self.read_back_at is not None and now >= self.read_back_at:
                ended = self._read_back_again()
                if ended:
                    return ended
            deadlines = [t for t in (self.mode.until, self._notice_at(), self.read_back_at) if t is not None]
            timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
            try:
                kind, value = self.events.get(timeout=timeout)
            except queue.Empty:
                continue
            if kind == "cancel":
                raise Cancelled("the acquire was cancelled")
            if kind == "gone":
                if self.mode.kind == "try":
                    raise NoSuchLock(self.lock.name)
                self.direct.stop()
                self.unplaced_since = None  # no controller places claims on a missing lock
                continue
            if kind == "direct":
                name, generation, token = value
                if name == self.claim.name and generation == self.direct.generation:
                    self.claim.set_notice_target(self.notices_to)
                    return ("granted", token)
                continue
            if kind == "lost":
                name, reason = value
                if name != self.claim.name:
                    continue
                if reason == CLAIM_GONE:
                    log.warning("claim %s left the queue without a grant: claiming anew", name)
                    return ("dropped", 0)
                raise ClaimLost(name)
            if kind == "lock":
                ended = self._seen(value)
                if ended:
                    return ended

    def _notice_at(self) -> Optional[float]:
        return None if self.unplaced_since is None else self.unplaced_since + p.UNQUEUED_NOTICE

    def _seen(self, lock: dict) -> Optional[Tuple[str, int]]:
        name = self.claim.name
        status = lock.get("status") or {}
        tampered = p.check_record(status, name, self.wrote)
        if tampered:
            self.direct.stop()
            log.warning(
                "claim %s: the lock's status records its %s otherwise than this process wrote it: "
                "withdrawing the claim without acting on it, and claiming anew",
                name,
                p.TAMPERED_FIELDS[tampered],
            )
            return ("tampered", 0)
        self.notices_to = NoticeTarget.of(lock)
        if self.notices_to is not None:
            REACH.probe(self.notices_to.url, self.session.lease)
        token = p.granted_token(status, name)
        if token is not None:
            self.claim.set_notice_target(self.notices_to)
            return ("granted", token)
        if p.held_back(status, name):
            log.info("claim %s is held back though never granted: claiming anew", name)
            return ("held-back", 0)
        if self.mode.kind == "try" and any(w.get("claim") == name for w in status.get("queue") or []):
            return ("would-block", 0)
        ended = self._placed_or_refused(status)
        if ended:
            return ended
        self.direct.follow(lock, name, self.proof)
        self._progress(status)
        return None

    def _placed_or_refused(self, status: p.Status) -> Optional[Tuple[str, int]]:
        name = self.claim.name
        listed = p.refusal(status, name)
        placed = p.names_claim(status, name)
        if self.was_placed and not placed:
            self.direct.stop()
            log.warning("claim %s left the queue without a grant: claiming anew", name)
            return ("dropped", 0)
        self.was_placed |= placed
        if placed:
            self.read_back_at = None
        self.refused = None if placed else (listed or self.refused)
        reason = self.refused
        if reason is None:
            return None
        if reason not in p.FINAL_REFUSALS and time.monotonic() < self.started + p.UNQUEUED_NOTICE:
            return None
        if reason not in p.FINAL_REFUSALS:
            readable, stored = self.claim.stored()
            field = p.claim_differs(stored, self.wrote, self.lock.name) if readable and stored else None
            if field:
                self.direct.stop()
                return ("tampered", 0)
        raise Refused(self.lock.name, name, reason)

    def _notice_due(self) -> Optional[Tuple[str, int]]:
        ended = self._read_back()
        if ended:
            return ended
        if self.refused is not None:
            raise Refused(self.lock.name, self.claim.name, self.refused)
        log.warning(
            "claim %s: no controller has placed it after %.0f s: is the leasehold controller running?",
            self.claim.name,
            p.UNQUEUED_NOTICE,
        )
        self.settled, self.unplaced_since = True, None
        self.read_back_at, self.read_backs = time.monotonic() + read_back_wait(0), 0
        return None

    def _read_back_again(self) -> Optional[Tuple[str, int]]:
        """Still unplaced, unrefused, some time after the notice time: read the claim back
        again (a refusal the status could not list, 16 others before it, would otherwise
        leave a claim changed after the first read-back waiting for ever), then again
        later, less and less often."""
        ended = self._read_back()
        if ended:
            return ended
        self.read_backs += 1
        self.read_back_at = time.monotonic() + read_back_wait(self.read_backs)
        return None

    def _read_back(self) -> Optional[Tuple[str, int]]:
        """The claim as stored now: changed by someone else (``tampered``: claim anew), or
        gone with no refusal seen (``vanished``) end the wait."""
        readable, stored = self.claim.stored()
        if readable and stored is not None:
            if p.claim_differs(stored, self.wrote, self.lock.name):
                self.direct.stop()
                return ("tampered", 0)
        elif readable and self.refused is None:
            # Gone, and no status read placed it: garbage-collected (its pod named
            # wrongly), or granted and expired while this process read nothing (paused;
            # the notice time may come first when it resumes). Claimed anew once.
            self.direct.stop()
            log.warning(
                "claim %s is gone though no status read placed it (garbage-collected, or granted and "
                "expired while this process read nothing): claiming anew (a second such claim in a row, or a try's, is an error)",
                self.claim.name,
            )
            return ("vanished", 0)
        return None

    def _progress(self, status: p.Status) -> None:
        name = self.claim.name
        placed = any(h.get("claim") == name for h in status.get("holders") or [])
        queue_ = [w.get("claim") for w in status.get("queue") or []]
        position = queue_.index(name) + 1 if name in queue_ else None
        if placed or position:
            self.settled, self.unplaced_since = True, None
        elif not self.settled and self.unplaced_since is None:
            self.unplaced_since = time.monotonic()
        if position and self.lock._on_wait is not None:
            queued = (position, [h.get("pod") for h in status.get("holders") or []])
            if queued != self.queued:
                self.queued = queued
                self.lock._on_wait(*queued)


def _watch_revocation(held: _Held, wrote: p.Written) -> None:
    """After the grant: report the session lost as soon as a status no longer grants it,
    records the claim otherwise than it was written, or the lock is deleted."""
    try:
        _follow_grant(held, wrote)
    except Exception:  # noqa: BLE001 - a status it cannot read: stop rather than act blind
        log.exception("claim %s: following the grant failed: giving it up", held.claim.name)
        held.session.lose(REVOKED)
        held._watch.stop()


def _follow_grant(held: _Held, wrote: p.Written) -> None:
    session, name = held.session, held.claim.name
    while True:
        if not session.is_live():
            held._watch.stop()
            return
        kind, value = held._events.get()
        if kind == "stop":
            return
        if kind == "gone":
            reason = LOCK_DELETED
        elif kind == "lock":
            status = value.get("status") or {}
            if not p.still_grants(status, name, held.token):
                revoked = [h.get("revoked") for h in status.get("holders") or [] if h.get("claim") == name]
                deleted = any(r and r.get("reason") == "LockDeleted" for r in revoked)
                reason = LOCK_DELETED if deleted else REVOKED
            elif p.check_record(status, name, wrote):
                log.warning("claim %s: the status records it otherwise than written: stopping", name)
                reason = REVOKED
            else:
                held.claim.set_notice_target(NoticeTarget.of(value))
                continue
        else:
            continue
        log.warning("claim %s: the grant is gone (%s)", name, reason)
        session.lose(reason)
        held._watch.stop()
        return
