"""The held grant: reentrant guards share it, the last release gives it back once, and a
guard dropped unreleased is released as a last resort."""

import gc
import queue
import threading
import time

import pytest

from leasehold_client.errors import LockLost
from leasehold_client.lock import Guard, _Held
from leasehold_client.session import Session


class Claim:
    name = "c"

    def __init__(self):
        self.given_up = []
        self.done = threading.Event()

    def renew(self):
        return ("renewed", None)

    def give_up(self, as_holder):
        self.given_up.append(as_holder)
        self.done.set()

    def mark_released(self, timeout):
        self.give_up(False)


class Watch:
    def stop(self):
        pass


def held():
    claim = Claim()
    session = Session("c", 15.0, time.monotonic(), claim.renew)
    session.hold()
    return _Held(session, claim, 7, Watch(), queue.Queue()), claim


def test_reentrant_guards_share_one_grant_given_back_once_by_the_last():
    h, claim = held()
    first = Guard(h)
    assert h.join()
    second = Guard(h)
    first.release()
    first.release()  # twice: counted once
    assert claim.given_up == [] and second.fencing_token == 7
    second.check()
    second.release()
    assert claim.given_up == [True], "the holder tells the controller (notice or mark) once"
    assert not h.join(), "a released grant takes no new guard"
    with pytest.raises(LockLost):
        second.check()


def test_a_guard_past_its_deadline_is_lost_before_the_renewal_thread_says_so():
    # A process paused past its deadline: the renewal thread sleeps on (its wait is on
    # the real clock), while the guard's clock has passed the deadline.
    now = [time.monotonic()]
    claim = Claim()
    session = Session("c", 15.0, now[0], claim.renew, clock=lambda: now[0])
    session.hold()
    guard = Guard(_Held(session, claim, 7, Watch(), queue.Queue()))
    assert not guard.is_lost()
    guard.check()
    assert guard.valid_until == session.valid_until
    now[0] = session.valid_until
    assert session.state == "live", "nothing published the loss"
    assert guard.is_lost()
    with pytest.raises(LockLost) as lost:
        guard.check()
    assert "RenewalsFailed" in str(lost.value)
    session.finish()


def test_a_guard_dropped_unreleased_is_released():
    h, claim = held()
    guard = Guard(h)
    del guard
    gc.collect()
    assert claim.done.wait(2), "released in the background"
    assert claim.given_up == [True]
