"""The Kubernetes side of the client, on the official ``kubernetes`` package: the claim
Lease (create, renew, read back, release) and the watch on the DistributedLock.

Requests go out with ``_preload_content=False`` and their JSON is read as plain dicts,
the shape ``docs/protocol.md`` describes. Claims are written through their own API
client (connection pool): a long watch holds a connection, and the release should not
wait for a new one. Every connection of a client this module builds has TCP keepalive
(:func:`keepalive_options`), so a watch whose path to the API server drops packets is
found dead within seconds, as the Rust client's HTTP/2 PINGs find it.
"""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import urllib3

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.rest import ApiException

from . import protocol as p
from ._http import REACH, close_response, notice_written
from .errors import ApiError
from .session import Renewal

log = logging.getLogger("leasehold_client")

MERGE_PATCH = "application/merge-patch+json"
#: How long one watch of a designated claim lasts before it is made anew (a stopped
#: wait's watch ends at its next event, or then).
CLAIM_WATCH_SECONDS = 60
#: The namespaces where this process was refused a watch of its claim (a client Role
#: there without ``watch`` on Leases): its claims there ask for no grant written on them
#: from then on. Per namespace, as Roles are: a refusal in one says nothing of another.
_claim_watch_refused: Set[str] = set()


#: Seconds a connection is idle before the first keepalive probe.
KEEPALIVE_IDLE = 3
#: Seconds between unanswered keepalive probes.
KEEPALIVE_INTERVAL = 3
#: Unanswered probes after which the kernel drops the connection: a watch on a path
#: that drops packets (a partition, a dead node behind the API server's address) ends
#: within ``KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT`` (9 s) and is made
#: anew, instead of hiding a grant until the next fresh read (``WAIT_CHECK``) or the
#: watch's read timeout. A probe is answered by the API server's kernel: it costs no
#: request, and a busy API server is not taken for a dead one.
KEEPALIVE_COUNT = 2


def keepalive_options() -> List[Tuple[int, int, int]]:
    """urllib3 socket options: its defaults (no Nagle) and TCP keepalive as above."""
    options = list(urllib3.connection.HTTPConnection.default_socket_options)
    options.append((socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1))
    for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL), ("TCP_KEEPCNT", KEEPALIVE_COUNT)):
        if hasattr(socket, name):  # Linux; other platforms keep their own timings
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    return options


def api_client(configuration: Optional[k8s.Configuration] = None) -> k8s.ApiClient:
    """An API client with TCP keepalive (:func:`keepalive_options`, beside any socket
    options ``configuration`` sets itself) for ``configuration``; without one, for this
    pod (in-cluster), else for ``$KUBECONFIG`` / ``~/.kube/config``."""
    if configuration is None:
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    own = list(configuration.socket_options or [])
    configuration.socket_options = own + [o for o in keepalive_options() if o[:2] not in {x[:2] for x in own}]
    client = k8s.ApiClient(configuration)
    # Releases of the kubernetes package before it read ``socket_options``: its pool
    # manager takes them all the same.
    client.rest_client.pool_manager.connection_pool_kw["socket_options"] = configuration.socket_options
    return client


def _json(response: Any) -> Dict[str, Any]:
    return json.loads(response.data or b"{}")


#: How long a read of the lock or a claim's create may take.
REQUEST_TIMEOUT = 30.0


def get_lock(api: k8s.CustomObjectsApi, namespace: str, name: str, timeout: float = REQUEST_TIMEOUT) -> Optional[dict]:
    """The DistributedLock, or ``None`` when it does not exist."""
    try:
        r = api.get_namespaced_custom_object(
            p.GROUP, p.VERSION, namespace, p.PLURAL, name, _preload_content=False, _request_timeout=timeout
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise ApiError(f"reading DistributedLock {name}", e, e.status) from e
    except Exception as e:  # noqa: BLE001 - no answer in time, or no connection
        raise ApiError(f"reading DistributedLock {name}", e) from e
    return _json(r)


def _rv(obj: dict) -> Optional[int]:
    try:
        return int(str((obj.get("metadata") or {}).get("resourceVersion")))
    except ValueError:
        return None


def _events(response: Any) -> Iterator[Tuple[Any, dict]]:
    """The events of a watch's streamed answer: ``(type, object)``."""
    buffer = b""
    for chunk in response.stream(65536, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if not line.strip():
                continue
            event = json.loads(line)
            yield event.get("type"), event.get("object") or {}


class LockWatch:
    """A watch on one DistributedLock, with a fresh read every ``check_every`` seconds
    behind it (a watch stalled on a dead connection delays nothing longer than that;
    ``set_check_every`` changes it, as at a grant). Each watch lasts ``WATCH_TIMEOUT``.
    Each observation goes to ``sink``: ``("lock", obj)`` or ``("gone", None)``; an older
    resourceVersion is never passed on after a newer one."""

    def __init__(self, api: k8s.CustomObjectsApi, namespace: str, name: str, check_every: float, sink: Callable[[Tuple[str, Any]], None]) -> None:
        self._api, self._ns, self._name = api, namespace, name
        self._check_every = max(check_every, 0.1)
        self._sink = sink
        self._lock = threading.Lock()
        self._newest = 0
        self._stopped = threading.Event()
        self._check_changed = threading.Condition()
        self._response: Any = None
        for target, what in ((self._watch, "watch"), (self._check, "check")):
            threading.Thread(target=target, name=f"leasehold-{what}-{name}", daemon=True).start()

    def stop(self) -> None:
        """Stop watching (the threads end at their next step)."""
        self._stopped.set()
        with self._check_changed:
            self._check_changed.notify_all()
        with self._lock:
            response, self._response = self._response, None
        if response is not None:
            close_response(response)

    def _emit(self, kind: str, obj: Optional[dict]) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            if obj is not None:
                rv = _rv(obj)
                if rv is not None:
                    if rv < self._newest:
                        return
                    self._newest = rv
            self._sink((kind, obj))

    def _watch(self) -> None:
        selector = f"metadata.name={self._name}"
        backoff = 0.1
        while not self._stopped.is_set():
            try:
                listed = _json(
                    self._api.list_namespaced_custom_object(
                        p.GROUP, p.VERSION, self._ns, p.PLURAL, field_selector=selector, _preload_content=False, _request_timeout=30
                    )
                )
                items = listed.get("items") or []
                self._emit("lock", items[0]) if items else self._emit("gone", None)
                rv = (listed.get("metadata") or {}).get("resourceVersion")
                response: Any = self._api.list_namespaced_custom_object(
                    p.GROUP, p.VERSION, self._ns, p.PLURAL, field_selector=selector, watch=True,
                    resource_version=rv, timeout_seconds=int(p.WATCH_TIMEOUT), _preload_content=False,
                    _request_timeout=(10, p.WATCH_TIMEOUT + 40),
                )
                with self._lock:
                    if self._stopped.is_set():
                        response.close()
                        return
                    self._response = response
                backoff = 0.1
                self._read(response)
            except Exception as e:  # noqa: BLE001 - every failure of a watch is retried
                if self._stopped.is_set():
                    return
                log.debug("lock watch failed (%s); retrying", e)
                self._stopped.wait(backoff)
                backoff = min(backoff * 2, 5.0)

    def _read(self, response: Any) -> None:
        for kind, obj in _events(response):
            if kind in ("ADDED", "MODIFIED"):
                self._emit("lock", obj)
            elif kind == "DELETED":
                self._emit("gone", None)
            elif kind == "ERROR":
                return  # e.g. 410 Gone: list afresh

    def set_check_every(self, seconds: float) -> None:
        """Read afresh every ``seconds`` from now on (counted from the last read)."""
        with self._check_changed:
            self._check_every = max(seconds, 0.1)
            self._check_changed.notify_all()

    def _check_due(self) -> bool:
        """Wait until the next fresh read is due: False once stopped."""
        since = time.monotonic()
        with self._check_changed:
            while not self._stopped.is_set():
                left = since + self._check_every - time.monotonic()
                if left <= 0:
                    return True
                self._check_changed.wait(left)
        return False

    def _check(self) -> None:
        while self._check_due():
            try:
                lock = get_lock(self._api, self._ns, self._name, timeout=min(self._check_every, 30.0))
            except ApiError as e:
                log.debug("reading the lock failed (%s); retrying", e)
                continue
            except Exception as e:  # noqa: BLE001 - a timeout or a dropped connection
                log.debug("reading the lock failed (%s); retrying", e)
                continue
            self._emit("lock", lock) if lock is not None else self._emit("gone", None)


#: The longest wait before a claim's watch is made again (seconds).
WATCH_RETRY_LONGEST = 5.0
#: After how many failures in a row to make a claim's watch the client warns (once a run).
WATCH_WARN_AFTER = 5


def watch_retry_wait(failures: int) -> float:
    """Seconds to wait before making a watch again after ``failures`` failures in a
    row: 0.2 s doubling to ``WATCH_RETRY_LONGEST``, each drawn from half to all of that
    (clients whose watches failed together, in an outage, do not come back together)."""
    step = min(0.2 * 2 ** min(failures, 8), WATCH_RETRY_LONGEST)
    return random.uniform(step / 2, step)


class KubeClaim:
    """A claim Lease this process created, renewed and given up through ``leases``, and
    watched while designated through ``watches`` (the lock handle's read client; else
    ``leases``). A watch holds its connection for as long as it runs, and one closed
    unfinished at the grant is not reused: on the write client's pool the release after
    the grant would wait for a new connection and its TLS handshake."""

    def __init__(
        self, leases: k8s.CoordinationV1Api, name: str, namespace: str, lock: str, secret: p.Secret, uid: Optional[str], lease: float,
        watches: Optional[k8s.CoordinationV1Api] = None,
    ) -> None:
        self.leases, self.name, self.namespace, self.lock = leases, name, namespace, lock
        self.watches = watches or leases
        self.secret, self.uid, self.lease = secret, uid, lease
        self._target_lock = threading.Lock()
        self._notice_target: Any = None

    @staticmethod
    def create(
        leases: k8s.CoordinationV1Api, lock: str, pod: p.PodIdentity, lease_seconds: int, watches: Optional[k8s.CoordinationV1Api] = None
    ) -> Tuple["KubeClaim", float]:
        """Create a claim for ``lock`` through ``leases``, watched through ``watches``; the
        claim and the moment its create was sent."""
        name = p.claim_name(lock)
        secret = p.Secret()
        body = p.claim_lease(name, lock, pod, lease_seconds, secret)
        if pod.namespace in _claim_watch_refused:
            del body["metadata"]["annotations"][p.GRANT_WATCH_ANNOTATION]
        sent = time.monotonic()
        try:
            # A plain dict is sent as it is (the generated signature names the model class).
            created = _json(leases.create_namespaced_lease(pod.namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT))  # type: ignore[arg-type]
        except ApiException as e:
            raise ApiError("creating the claim Lease", e, e.status) from e
        except Exception as e:  # noqa: BLE001 - no answer from the API server
            raise ApiError("creating the claim Lease", e) from e
        uid = (created.get("metadata") or {}).get("uid")
        return KubeClaim(leases, name, pod.namespace, lock, secret, uid, float(max(lease_seconds, 1)), watches), sent

    def _patch(self, body: dict, timeout: Optional[float]) -> dict:
        return _json(
            self.leases.patch_namespaced_lease(
                self.name, self.namespace, body, _preload_content=False, _content_type=MERGE_PATCH, _request_timeout=timeout
            )
        )

    def renew(self) -> Renewal:
        """Renew once (the claim's UID a precondition)."""
        try:
            lease = self._patch(p.renew_patch(self.uid), p.renew_timeout(self.lease))
        except ApiException as e:
            if e.status in (404, 409, 422):
                return ("gone", None)
            return ("failed", f"{e.status} {e.reason}")
        except Exception as e:  # noqa: BLE001 - a timeout or a dropped connection: retry
            return ("failed", str(e))
        meta = lease.get("metadata") or {}
        if meta.get("deletionTimestamp") or (meta.get("labels") or {}).get(p.LOCK_LABEL) != self.lock:
            return ("gone", None)
        return ("renewed", None)

    def stored(self) -> Tuple[bool, Optional[dict]]:
        """The claim as the API server has it now, read with a PATCH that changes nothing
        (the client Role may not GET): ``(True, lease)``, ``(True, None)`` when it is gone
        or being deleted, ``(False, None)`` when it cannot be read."""
        try:
            lease = self._patch({"metadata": {"uid": self.uid}}, p.renew_timeout(self.lease))
        except ApiException as e:
            return (e.status in (404, 409, 422), None)
        except Exception:  # noqa: BLE001 - a timeout: unreadable
            return (False, None)
        return (True, None if (lease.get("metadata") or {}).get("deletionTimestamp") else lease)

    def watch_self(self, seen: Callable[[dict], bool], alive: Callable[[], bool], opened: Callable[[Any], None]) -> None:
        """Watch this claim, from what it is now, handing each version to ``seen`` until it
        returns True or ``alive()`` is false (checked at each event; a watch lasts
        ``CLAIM_WATCH_SECONDS``). Each watch's response goes to ``opened`` first (which
        may close it, and raise, for a wait already stopped). Returns at once when the
        watch is refused (a client Role without ``watch`` on Leases); one that fails
        otherwise is made again after a wait (``watch_retry_wait``: 0.2 s doubling to
        5 s, jittered, as the Rust client's)."""
        selector = f"metadata.name={self.name}"
        failures = 0
        while alive():
            started = time.monotonic()
            try:
                response: Any = self.watches.list_namespaced_lease(
                    self.namespace, field_selector=selector, watch=True, resource_version="0",
                    timeout_seconds=CLAIM_WATCH_SECONDS, _preload_content=False,
                    _request_timeout=(10, CLAIM_WATCH_SECONDS + 40),
                )
            except Exception as e:  # noqa: BLE001 - made again; the status tells meanwhile
                if isinstance(e, ApiException) and e.status == 403:
                    self._ask_for_no_grant()
                    return
                wait = watch_retry_wait(failures)
                failures += 1
                if failures == WATCH_WARN_AFTER:
                    log.warning("watching claim %s keeps failing (%d times); trying on (the lock's status grants meanwhile): %s", self.name, failures, e)
                else:
                    log.debug("watching claim %s for its grant failed (again in %.1f s): %s", self.name, wait, e)
                time.sleep(wait)
                continue
            try:
                opened(response)
                for kind, lease in _events(response):
                    if not alive():
                        return
                    if kind in ("ADDED", "MODIFIED") and seen(lease):
                        return
            except Exception as e:  # noqa: BLE001 - a dropped watch is made anew
                log.debug("the watch of claim %s ended: %s", self.name, e)
            finally:
                response.close()
            if time.monotonic() - started >= WATCH_RETRY_LONGEST:
                failures = 0  # a watch that lasted the longest wait starts the waits over
            time.sleep(max(0.0, started + 1.0 - time.monotonic()))

    def _ask_for_no_grant(self) -> None:
        """Refused a watch of the claim: take its ask for a grant written on it back (the
        controller would write it, and put its status write off, for nothing), and ask on
        no later claim of this process."""
        _claim_watch_refused.add(self.namespace)
        log.info(
            "the client Role may not watch Leases: grants come by the lock's status "
            "(grant it watch on leases for faster handoffs without release notices)"
        )
        try:
            self._patch({"metadata": {"annotations": {p.GRANT_WATCH_ANNOTATION: None}}}, p.renew_timeout(self.lease))
        except Exception as e:  # noqa: BLE001 - the controller then writes a grant no one reads
            log.debug("taking claim %s's ask for a grant on it back failed: %s", self.name, e)

    @property
    def notice_target(self) -> Any:
        with self._target_lock:
            return self._notice_target

    def set_notice_target(self, target: Any) -> None:
        """Where release notices go, as the latest status said (probed when it changes)."""
        with self._target_lock:
            changed = target != self._notice_target
            self._notice_target = target
        if changed and target is not None:
            REACH.probe(target.url, self.lease)

    def mark_released(self, timeout: Optional[float]) -> None:
        """Write the release mark (a claim already gone counts as released)."""
        try:
            self._patch(p.release_patch(self.lock, self.secret), timeout)
        except ApiException as e:
            if e.status != 404:
                raise ApiError("releasing the claim Lease", e, e.status) from e
        except Exception as e:  # noqa: BLE001 - a timeout or a dropped connection
            raise ApiError("releasing the claim Lease (the claim will expire)", e) from e

    def give_up(self, as_holder: bool) -> None:
        """A holder tells the controller first and is done if it answers that the release
        is written; otherwise (and for a waiter) the claim is marked released."""
        target = self.notice_target
        if as_holder and target is not None:
            notice = {"namespace": self.namespace, "lock": self.lock, "claim": self.name, "secret": self.secret.reveal()}
            if notice_written(target, notice, self.lease):
                return
        self.mark_released(p.renew_timeout(self.lease))
