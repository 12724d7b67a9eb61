"""A claim's session: one thread keeps the claim renewed and publishes whether it stands.

The timing is the protocol's (``docs/protocol.md``, "Timing"): while the claim waits it
is renewed every :func:`~leasehold_client.protocol.wait_renew_interval`; from
:meth:`Session.hold` on, every :func:`~leasehold_client.protocol.renew_interval`.
``hold`` returns only while the deadline of the last acknowledged write is a safety
margin ahead, and from then on the loss is published no later than that deadline: every
renewal request runs on a thread of its own and is raced against the deadline, so a
request that hangs (a black-holed connection) cannot delay it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, List, Optional, Tuple

from . import protocol as p

log = logging.getLogger("leasehold_client")

LIVE, LOST, ENDED = "live", "lost", "ended"

#: Why a session was lost.
REVOKED, CLAIM_GONE, RENEWALS_FAILED, LOCK_DELETED = "Revoked", "ClaimGone", "RenewalsFailed", "LockDeleted"

#: One renewal's outcome: ("renewed", None), ("gone", None) or ("failed", message).
Renewal = Tuple[str, Optional[str]]


class Session:
    """One claim, renewed by a background thread until it ends or is lost.

    ``clock`` is a monotonic clock in seconds (``time.monotonic``; tests give their own).
    """

    def __init__(
        self,
        claim: str,
        lease: float,
        sent: float,
        renew: Callable[[], Renewal],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.claim = claim
        self.lease = lease
        self._renew = renew
        self._clock = clock
        self._cond = threading.Condition()
        self._state = LIVE
        self.reason: Optional[str] = None
        self._holding_since: Optional[float] = None
        self._last_sent = sent
        #: ``client_stop_by`` of the last acknowledged write: how long a holder may act.
        self.valid_until = p.client_stop_by(sent, lease)
        self._on_lost: List[Callable[[str], None]] = []
        self.lost_event = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"leasehold-renew-{claim}", daemon=True)
        self._thread.start()

    # --- what others see ---------------------------------------------------------------

    @property
    def state(self) -> str:
        """``live``, ``lost`` or ``ended``."""
        with self._cond:
            return self._state

    def past_deadline(self) -> bool:
        """Whether ``valid_until`` has passed: a holder must have stopped acting, whether or
        not the renewal thread has run since to publish the loss (a process paused or
        starved past it reads this first)."""
        return self._clock() >= self.valid_until

    def is_live(self) -> bool:
        """Whether the claim still stands."""
        return self.state == LIVE

    def is_holding(self) -> bool:
        """Whether the claim holds (renewed at the holder's pace, its deadline enforced)."""
        with self._cond:
            return self._holding_since is not None

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` once the session is lost (at once if it is)."""
        with self._cond:
            if self._state != LOST:
                self._on_lost.append(callback)
                return
            reason = self.reason or REVOKED
        callback(reason)

    def hold(self, until: Optional[float] = None) -> None:
        """The claim was granted: renew at the holder's pace, enforce the deadline, and
        return once the last write's deadline is a margin ahead (renewing first if not).
        Raises :class:`LookupError` with the reason if the session is lost first, and
        :class:`TimeoutError` at ``until`` (monotonic)."""
        with self._cond:
            if self._holding_since is None:
                self._holding_since = self._clock()
                self._cond.notify_all()
            while True:
                if self._state == LOST:
                    raise LookupError(self.reason)
                if self._state == ENDED:
                    raise LookupError(REVOKED)
                now = self._clock()
                if p.may_hold(now, self.valid_until, self.lease):
                    return
                if until is not None and now >= until:
                    raise TimeoutError()
                self._cond.wait(None if until is None else until - now)

    def lose(self, reason: str) -> None:
        """Publish that the claim is lost (no effect once the session is over)."""
        with self._cond:
            if self._state != LIVE:
                return
            self._state, self.reason = LOST, reason
            callbacks, self._on_lost = self._on_lost, []
            self._cond.notify_all()
        self.lost_event.set()
        for cb in callbacks:
            try:
                cb(reason)
            except Exception:  # a listener's failure must not stop the others
                log.exception("a loss listener failed")

    def finish(self) -> None:
        """Stop renewing at once (no write): the session is over."""
        with self._cond:
            if self._state == LIVE:
                self._state = ENDED
                self._cond.notify_all()

    # --- the renewal thread -----------------------------------------------------------

    def _give_up_at(self) -> float:
        """When the claim must give up (called under the lock)."""
        deadline = p.client_stop_by(self._last_sent, self.lease)
        since = self._holding_since
        if since is None:
            return p.client_stop_by(self._last_sent, p.wait_lease(self.lease))
        return deadline if p.may_hold(since, deadline, self.lease) else since + self.lease

    def _run(self) -> None:
        try:
            self._renew_until_over()
        except BaseException:  # noqa: BLE001 - a dead renewal thread must not leave the claim "live"
            log.exception("claim %s: the renewal thread failed: giving up the grant", self.claim)
            self.lose(RENEWALS_FAILED)

    def _renew_until_over(self) -> None:
        retry_at: Optional[float] = None
        backoff = 0.1
        while True:
            with self._cond:
                while True:
                    if self._state != LIVE:
                        return
                    held = self._holding_since is not None
                    interval = p.renew_interval(self.lease) if held else p.wait_renew_interval(self.lease)
                    due = retry_at if retry_at is not None else self._last_sent + interval
                    now = self._clock()
                    if now >= self._give_up_at():
                        break
                    if now >= due:
                        break
                    self._cond.wait(min(due, self._give_up_at()) - now)
                give_up = self._clock() >= self._give_up_at()
            if give_up:
                log.warning("claim %s: renewals failed for too long: giving up the grant", self.claim)
                self.lose(RENEWALS_FAILED)
                return
            sent = self._clock()
            outcome = self._renew_bounded(sent)
            if outcome is None:
                return  # ended, lost, or past the deadline (published)
            kind, message = outcome
            if kind == "renewed":
                with self._cond:
                    self._last_sent = sent
                    self.valid_until = p.client_stop_by(sent, self.lease)
                    self._cond.notify_all()
                retry_at, backoff = None, 0.1
            elif kind == "gone":
                log.warning("claim %s is gone (forced release): giving up the grant", self.claim)
                self.lose(CLAIM_GONE)
                return
            else:
                log.warning("claim %s: renewal failed (%s); retrying", self.claim, message)
                retry_at = self._clock() + backoff
                backoff = min(backoff * 2, p.renew_retry_max(self.lease))

    def _renew_bounded(self, sent: float) -> Optional[Renewal]:
        """One renewal on a thread of its own, raced against the renewal timeout and the
        give-up deadline; ``None`` when the session ended or was lost meanwhile."""
        box: List[Tuple[Renewal, float]] = []

        def attempt() -> None:
            try:
                result = self._renew()
            except Exception as e:  # noqa: BLE001 - any failure is a failed attempt
                result = ("failed", str(e))
            with self._cond:
                box.append((result, self._clock()))
                self._cond.notify_all()

        try:
            threading.Thread(target=attempt, name=f"leasehold-renewal-{self.claim}", daemon=True).start()
        except RuntimeError as e:  # no thread to be had: a failed attempt
            return ("failed", f"starting the renewal: {e}")
        timeout_at = sent + p.renew_timeout(self.lease)
        with self._cond:
            while True:
                if self._state != LIVE:
                    return None
                give_up_at = self._give_up_at()
                if box:
                    result, answered = box[0]
                    if answered < give_up_at:
                        return result
                    break  # answered past the deadline: the loss stands
                now = self._clock()
                if now >= give_up_at:
                    break
                if now >= timeout_at:
                    return ("failed", "timed out")
                self._cond.wait(min(timeout_at, give_up_at) - now)
        log.warning("claim %s: renewals failed for too long: giving up the grant", self.claim)
        self.lose(RENEWALS_FAILED)
        return None
