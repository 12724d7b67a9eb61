"""The session's timing, with a renewer that the test controls (real time, short leases)."""

import threading
import time

from leasehold_client import protocol as p
from leasehold_client.session import CLAIM_GONE, ENDED, RENEWALS_FAILED, Session


class Renewer:
    """Answers renewals as told: ``hang`` (never answers), ``gone`` or ``renewed``."""

    def __init__(self, answer="renewed"):
        self.answer = answer
        self.calls = 0
        self.never = threading.Event()

    def __call__(self):
        self.calls += 1
        if self.answer == "hang":
            self.never.wait()
        return (self.answer, None)


def test_lost_fires_by_the_deadline_while_a_renewal_hangs():
    """A black-holed connection must not delay the holder's stop: the deadline of the
    last acknowledged write holds whatever request is in flight. The thread's wake-up
    jitter is covered by the safety margin, which the lease keeps beyond the deadline."""
    for lease in [1.0, 1.5]:
        renewer = Renewer("hang")
        sent = time.monotonic()
        session = Session("c", lease, sent, renewer)
        session.hold()
        assert session.lost_event.wait(lease + 1)
        at = time.monotonic() - sent
        assert session.reason == RENEWALS_FAILED
        assert renewer.calls >= 1, "it tried to renew"
        assert at >= p.client_stop_by(0, lease) - 0.01, f"lost early at {at:.3f} s"
        assert at < p.client_stop_by(0, lease) + p.safety_margin(lease) / 2, f"lost at {at:.3f} s"


def test_a_waiter_renews_at_the_wait_pace_and_a_holder_every_third_of_its_lease():
    renewer = Renewer()
    session = Session("c", 0.6, time.monotonic(), renewer)
    time.sleep(0.5)
    assert renewer.calls == 0, "a waiter renews once a minute"
    assert session.is_live(), "a waiter is not held to its lease"
    session.hold()  # its last write is fresh enough: at once
    time.sleep(1.0)
    assert 3 <= renewer.calls <= 6, renewer.calls
    assert session.is_live()
    session.finish()
    assert session.state == ENDED


def test_a_granted_waiter_whose_last_write_is_old_renews_before_it_acts():
    renewer = Renewer()
    sent = time.monotonic()
    session = Session("c", 1.0, sent, renewer)
    time.sleep(0.6)  # its deadline (0.75 s) is less than a margin (0.25 s) ahead
    assert not p.may_hold(time.monotonic(), session.valid_until, 1.0)
    session.hold()
    assert renewer.calls >= 1, "a renewal came first"
    assert session.valid_until > sent + 0.75
    session.finish()


def test_a_claim_found_gone_is_lost_at_once_and_listeners_hear_it():
    heard = []
    renewer = Renewer("gone")
    session = Session("c", 1.0, time.monotonic(), renewer)
    session.on_lost(heard.append)
    session.hold()  # fresh: at once; the first renewal finds the claim gone
    assert session.lost_event.wait(2)
    assert session.reason == CLAIM_GONE and heard == [CLAIM_GONE]
    late = []
    session.on_lost(late.append)
    assert late == [CLAIM_GONE], "a listener added after the loss hears it at once"


def test_a_renewal_that_cannot_start_a_thread_is_a_failed_attempt_and_the_deadline_holds(monkeypatch):
    """No thread to be had (a pod at its process limit) must not leave a holder live."""
    import leasehold_client.session as s

    real = threading.Thread

    class NoRenewalThreads(real):
        def start(self):
            if self.name.startswith("leasehold-renewal-"):
                raise RuntimeError("can't start new thread")
            return super().start()

    monkeypatch.setattr(s.threading, "Thread", NoRenewalThreads)
    sent = time.monotonic()
    session = Session("c", 1.0, sent, Renewer())
    session.hold()
    assert session.lost_event.wait(2)
    assert session.reason == RENEWALS_FAILED
    assert time.monotonic() - sent < p.client_stop_by(0, 1.0) + p.safety_margin(1.0) / 2
