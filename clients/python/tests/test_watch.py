"""The lock watch's requests, on a request-shape stand-in for the API (no server):
what a waiting claimant costs, and the switch to a holder's fresh reads at a grant."""

import json
import threading

from leasehold_client import _kube
from leasehold_client import protocol as p


class _Response:
    """A response as the generated client returns it with ``_preload_content=False``."""

    def __init__(self, obj):
        self.data = json.dumps(obj).encode()


class _Watching:
    """A watch response that yields nothing until closed."""

    def __init__(self):
        self._closed = threading.Event()

    def stream(self, *_args, **_kwargs):
        self._closed.wait()
        return iter(())

    def close(self):
        self._closed.set()


class _Api:
    """Counts the requests a LockWatch makes and records the watch's parameters."""

    def __init__(self):
        self.gets = 0
        self.got = threading.Event()
        self.watch_params = []
        self._lock = {"metadata": {"name": "l", "resourceVersion": "7"}}

    def list_namespaced_custom_object(self, *_args, watch=False, **kwargs):
        if watch:
            self.watch_params.append(kwargs)
            return _Watching()
        return _Response({"metadata": {"resourceVersion": "7"}, "items": [self._lock]})

    def get_namespaced_custom_object(self, *_args, **_kwargs):
        self.gets += 1
        self.got.set()
        return _Response(self._lock)


def test_a_waiter_costs_at_most_one_request_a_minute_at_any_lease():
    """Renewals every third of the wait lease, a fresh read every WAIT_CHECK, and a new
    list and watch every WATCH_TIMEOUT: under one request a minute, whatever the lease."""
    for lease in range(1, p.MAX_LEASE_SECONDS + 1):
        per_minute = 60 / p.wait_renew_interval(lease) + 60 / p.WAIT_CHECK + 2 * 60 / p.WATCH_TIMEOUT
        assert per_minute <= 1.0, (lease, per_minute)


def test_a_waiting_watch_lasts_watch_timeout_and_reads_afresh_only_when_told_to():
    """The watch asks for WATCH_TIMEOUT; at WAIT_CHECK nothing is read at once, and a
    shorter interval set later (a grant) takes effect without waiting out the first."""
    api = _Api()
    seen = []
    watch = _kube.LockWatch(api, "ns", "l", p.WAIT_CHECK, seen.append)
    try:
        watch.set_check_every(0.05)
        assert api.got.wait(10), "no fresh read after the interval was shortened"
        assert api.watch_params and api.watch_params[0]["timeout_seconds"] == int(p.WATCH_TIMEOUT)
    finally:
        watch.stop()
    assert ("lock", api._lock) in seen


class _Streamed:
    """A watch response streaming ``events`` (JSON lines), then its end."""

    def __init__(self, events):
        self._body = b"".join(json.dumps(e).encode() + b"\n" for e in events)

    def stream(self, *_args, **_kwargs):
        return iter([self._body])

    def close(self):
        pass


class _FailingLeases:
    """Leases whose first ``failures`` watches fail with ``status``, then show the claim."""

    def __init__(self, failures, status):
        self.failures, self.status, self.watches = failures, status, 0

    def list_namespaced_lease(self, *_args, **kwargs):
        assert kwargs.get("watch") is True
        self.watches += 1
        if self.watches <= self.failures:
            raise _kube.ApiException(status=self.status, reason="failed")
        return _Streamed([{"type": "ADDED", "object": {"metadata": {"name": "c-1"}}}])


def _claim(leases):
    return _kube.KubeClaim(leases, "c-1", "ns", "l", p.Secret(), "u-1", 15.0)  # type: ignore[arg-type]


def test_a_claim_watch_that_cannot_be_made_is_made_again_until_it_can(monkeypatch):
    waits = []
    monkeypatch.setattr(_kube, "watch_retry_wait", lambda failures: waits.append(failures) or 0.0)
    leases = _FailingLeases(2, 503)
    seen = []
    _claim(leases).watch_self(lambda lease: seen.append(lease) or True, lambda: True, lambda _r: None)
    assert leases.watches == 3, "made again after each failure"
    assert waits == [0, 1], "a longer wait after each failure in a row"
    assert [lease["metadata"]["name"] for lease in seen] == ["c-1"]


def test_a_refused_claim_watch_is_not_made_again(monkeypatch):
    monkeypatch.setattr(_kube.KubeClaim, "_ask_for_no_grant", lambda self: None)
    leases = _FailingLeases(100, 403)
    _claim(leases).watch_self(lambda _lease: True, lambda: True, lambda _r: None)
    assert leases.watches == 1


class _CreatingLeases:
    """Leases that take every create, keeping what was sent."""

    def __init__(self):
        self.bodies = []

    def create_namespaced_lease(self, namespace, body, **_kwargs):
        self.bodies.append((namespace, body))
        return _Response({"metadata": {"uid": "u"}})


class _Response:
    def __init__(self, obj):
        self.data = json.dumps(obj).encode()


def test_a_watch_refused_in_one_namespace_leaves_claims_in_another_asking_for_grants_on_them(monkeypatch):
    monkeypatch.setattr(_kube, "_claim_watch_refused", set())
    monkeypatch.setattr(_kube.KubeClaim, "_patch", lambda self, body, timeout: {})
    _claim(_FailingLeases(100, 403)).watch_self(lambda _lease: True, lambda: True, lambda _r: None)
    creating = _CreatingLeases()
    for namespace in ("ns", "other"):
        _kube.KubeClaim.create(creating, "l", p.PodIdentity("p", namespace, "u"), 15)  # type: ignore[arg-type]
    asks = {ns: p.GRANT_WATCH_ANNOTATION in body["metadata"]["annotations"] for ns, body in creating.bodies}
    assert asks == {"ns": False, "other": True}, "refused in ns only: its Role says nothing of other's"


def test_the_wait_before_a_watch_is_made_again_grows_to_five_seconds_jittered():
    for failures, step in [(0, 0.2), (1, 0.4), (2, 0.8), (3, 1.6), (4, 3.2), (5, 5.0), (50, 5.0)]:
        for _ in range(20):
            assert step / 2 <= _kube.watch_retry_wait(failures) <= step


def test_a_claim_watch_failing_on_ends_when_its_wait_stops(monkeypatch):
    monkeypatch.setattr(_kube, "watch_retry_wait", lambda _failures: 0.0)
    leases = _FailingLeases(10**9, 503)
    checks = []

    def alive():
        checks.append(1)
        return len(checks) <= 3

    _claim(leases).watch_self(lambda _lease: True, alive, lambda _r: None)
    assert leases.watches == 3, "no watch made once the wait stopped"


def test_a_claims_watch_goes_on_the_watch_client_and_not_the_write_client():
    writes, watches = _FailingLeases(0, 0), _FailingLeases(0, 0)
    claim = _kube.KubeClaim(writes, "c-1", "ns", "l", p.Secret(), "u-1", 15.0, watches)  # type: ignore[arg-type]
    claim.watch_self(lambda _lease: True, lambda: True, lambda _r: None)
    assert (watches.watches, writes.watches) == (1, 0)


def test_a_lock_watches_its_claims_through_its_read_client():
    from kubernetes import client as k8s

    from leasehold_client import Lock

    reads, writes = k8s.ApiClient(), k8s.ApiClient()
    pod = p.PodIdentity("p", "ns", "u")
    lock = Lock("l", "ns", identity=pod, api_client=reads, write_client=writes)
    # A watch ended unfinished at the grant closes its connection: on the write pool,
    # the release after the grant would wait for a new one and its TLS handshake.
    assert lock._lease_watches.api_client is reads
    assert lock._leases.api_client is writes
