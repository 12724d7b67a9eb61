"""The pause before claiming anew within one acquisition: none for the first two claims,
then as ``claim_anew_pause`` says, ended early by the caller's deadline or a cancel."""

import threading
import time

import pytest

from leasehold_client import Timeout
from leasehold_client import protocol as p
from leasehold_client.lock import Cancelled, _Mode, _pause_before_claim


def test_the_first_two_claims_are_made_at_once():
    assert p.claim_anew_pause(0) == p.claim_anew_pause(1) == 0
    _pause_before_claim(0, _Mode("wait"), threading.Event())
    _pause_before_claim(1, _Mode("wait"), threading.Event())


def test_a_cancel_before_a_claim_ends_the_acquire_without_it():
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(Cancelled):
        _pause_before_claim(0, _Mode("wait"), cancelled)


def test_the_third_claim_waits_its_pause():
    started = time.monotonic()
    _pause_before_claim(2, _Mode("wait"), threading.Event())
    assert time.monotonic() - started >= p.claim_anew_pause(2)


def test_a_pause_past_the_callers_deadline_times_out_at_the_deadline():
    started = time.monotonic()
    mode = _Mode("until", 0.2)
    with pytest.raises(Timeout):
        _pause_before_claim(8, mode, threading.Event())  # a 5 s pause
    assert mode.until is not None and time.monotonic() >= mode.until
    assert time.monotonic() - started < 2.0


def test_a_cancel_ends_the_pause():
    cancelled = threading.Event()
    threading.Timer(0.1, cancelled.set).start()
    started = time.monotonic()
    with pytest.raises(Cancelled):
        _pause_before_claim(8, _Mode("wait"), cancelled)
    assert time.monotonic() - started < 2.0


def test_an_unplaced_claim_is_read_back_again_less_and_less_often_to_a_minute():
    from leasehold_client.lock import read_back_wait

    assert [read_back_wait(n) for n in range(7)] == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]
