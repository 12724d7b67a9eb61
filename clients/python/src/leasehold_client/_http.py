"""The client's two HTTP exchanges with the controller (``docs/protocol.md``, "HTTP"):
the release notice a holder sends when it is done, and the wait of a designated
successor for its direct grant. Both go to the plain ``http://host:port`` URL a lock's
status publishes; an answer counts only when it verifies against the Ed25519 key that
same status publishes. Whatever goes wrong here, the caller falls back to the claim
(the release mark) or to the status (a grant seen by the watch).
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit

from . import protocol as p

log = logging.getLogger("leasehold_client")

NOTICE_PATH = "/v1/release"
GRANT_PATH = "/v1/grant"
WRITTEN_HEADER, WRITTEN_VALUE = "leasehold-release", "written"
WRITTEN_SIGNATURE_HEADER = "leasehold-release-signature"
TOKEN_HEADER = "leasehold-fencing-token"
SIGNATURE_HEADER = "leasehold-grant-signature"
#: How long a URL found unreachable is skipped before it is tried again.
UNREACHABLE_FOR = 60.0
#: How long after its start a probe of a notice URL may keep a release waiting.
PROBE_GRACE = 0.05
#: A probe is bounded by the notice timeout (1 s at most): one not answered after this
#: never will be, and the URL counts as not probed.
PROBE_STALE = 2.0
#: The least time between two waits for one designation.
REASK_AFTER = 1.0


@dataclass(frozen=True)
class NoticeTarget:
    """Where a holder sends its notice and how it checks the answer, from one status."""

    url: str
    key: str
    lock_uid: str

    @staticmethod
    def of(lock: Mapping[str, Any]) -> Optional["NoticeTarget"]:
        """The target ``lock``'s status publishes, if it publishes one."""
        status = lock.get("status") or {}
        url, key = status.get("releaseUrl"), status.get("grantKey")
        uid = (lock.get("metadata") or {}).get("uid")
        if not (url and key and uid):
            return None
        return NoticeTarget(url, key, uid)


class _Reach:
    """What this process knows of the notice URLs it met: probed once, skipped a while
    when found unreachable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._known: Dict[str, Tuple[str, float]] = {}

    def unreachable(self, url: str, now: float) -> bool:
        with self._lock:
            state, until = self._known.get(url, ("", 0.0))
            return state == "unreachable" and until > now

    def skipped(self, url: str) -> bool:
        """Whether a notice to ``url`` is not sent: found unreachable a while ago, or its
        probe, still under way, does not answer within ``PROBE_GRACE`` of its start (a
        reachable URL answers a connect within a round trip; a probe still under way
        after that most likely met a URL that drops packets, where the notice would
        wait out its whole timeout)."""
        with self._answered:
            state, began = self._known.get(url, ("", 0.0))
            if state == "probing":
                left = began + PROBE_GRACE - time.monotonic()
                self._answered.wait_for(lambda: self._known.get(url, ("", 0.0))[0] != "probing", max(left, 0.0))
            state, until = self._known.get(url, ("", 0.0))
            now = time.monotonic()
            return (state == "probing" and now < until + PROBE_STALE) or (state == "unreachable" and until > now)

    def learn(self, url: str, reached: bool, now: float) -> None:
        with self._answered:
            self._known[url] = ("reached", 0.0) if reached else ("unreachable", now + UNREACHABLE_FOR)
            self._answered.notify_all()

    def probe(self, url: str, lease: float) -> None:
        """Find out, off the release's path, whether ``url`` can be reached (once)."""
        target = p.endpoint(url, NOTICE_PATH)
        if target is None:
            return
        with self._lock:
            state, until = self._known.get(url, ("", 0.0))
            now = time.monotonic()
            if state == "reached" or (state == "probing" and now < until + PROBE_STALE) or (state == "unreachable" and until > now):
                return
            self._known[url] = ("probing", time.monotonic())
        parts = urlsplit(target)

        def run() -> None:
            try:
                socket.create_connection((parts.hostname, parts.port), timeout=p.notice_timeout(lease)).close()
                reached = True
            except Exception:  # noqa: BLE001 - OSError, or a host name the resolver refuses
                reached = False
                log.info("the controller's release URL %s cannot be reached: releases write the mark at once", url)
            self.learn(url, reached, time.monotonic())

        threading.Thread(target=run, name="leasehold-probe", daemon=True).start()


REACH = _Reach()


def _connection(url: str, timeout: Optional[float]) -> Tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn, parts.path or "/"


def post_json(
    url: str, body: Mapping[str, Any], timeout: Optional[float], opened: Optional[Callable[[Any], None]] = None
) -> Tuple[int, Mapping[str, str]]:
    """POST ``body`` as JSON to ``url`` on a connection of its own; the answer's status
    and headers (lower-case names). ``opened`` is given the connection, to close it."""
    conn, path = _connection(url, timeout)
    if opened:
        opened(conn)
    try:
        data = json.dumps(body).encode()
        conn.request("POST", path, body=data, headers={"content-type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def notice_written(target: NoticeTarget, notice: Mapping[str, str], lease: float) -> bool:
    """Send the release ``notice`` to ``target``; true only when the controller answers
    that the release is written, signed by the key the status published."""
    url = p.endpoint(target.url, NOTICE_PATH)
    if url is None or REACH.skipped(target.url):
        return False
    # The notice timeout bounds the whole exchange (a socket timeout bounds each step):
    # the exchange runs on a thread of its own, and an answer later than that is ignored.
    limit = p.notice_timeout(lease)
    answer: List[Any] = []
    done = threading.Event()

    def exchange() -> None:
        try:
            answer.append(post_json(url, notice, limit))
        except (OSError, http.client.HTTPException) as e:
            answer.append(e)
        done.set()

    threading.Thread(target=exchange, name="leasehold-notice", daemon=True).start()
    if not done.wait(limit) or isinstance(answer[0], Exception):
        log.debug("release notice failed (%s); marking the claim", answer[0] if answer else "timed out")
        REACH.learn(target.url, False, time.monotonic())
        return False
    code, headers = answer[0]
    if code != 200 or headers.get(WRITTEN_HEADER) != WRITTEN_VALUE:
        log.debug("release notice answered %s; marking the claim", code)
        return False
    message = p.written_message(notice["namespace"], notice["lock"], target.lock_uid, notice["claim"])
    if p.verify(target.key, message, headers.get(WRITTEN_SIGNATURE_HEADER, "")):
        return True
    log.warning("a release notice to %s was answered as written without the lock's signature: ignored", target.url)
    return False


@dataclass(frozen=True)
class Designation:
    """What a designation says: where to wait, whom to trust, for which grant."""

    release_url: Optional[str]
    key: str
    namespace: str
    lock: str
    lock_uid: str
    claim: str
    token: int
    proof: Optional[str]

    @staticmethod
    def of(lock: Mapping[str, Any], claim: str, proof: Optional[str]) -> Optional["Designation"]:
        status = lock.get("status") or {}
        successor = status.get("successor") or {}
        meta = lock.get("metadata") or {}
        if successor.get("claim") != claim:
            return None
        url, key = status.get("releaseUrl") or None, status.get("grantKey")
        if not (key and meta.get("namespace") and meta.get("name") and meta.get("uid")):
            return None
        return Designation(url, key, meta["namespace"], meta["name"], meta["uid"], claim, int(successor["fencingToken"]), proof)


def close_response(response: Any) -> None:
    """Close a streamed response another thread may be reading (``close()`` may block
    behind the read in progress; urllib3's ``shutdown()`` does not)."""
    try:
        response.shutdown() if hasattr(response, "shutdown") else response.close()
    except Exception:  # noqa: BLE001 - closing a dead connection may fail
        pass


class DirectWait:
    """A claim's wait for a direct grant, following the lock's status: one request held
    open at the controller while the status designates the claim, and, with
    ``watch_claim`` (``KubeClaim.watch_self``), a watch on the claim, where the
    controller writes the grant when it cannot tell it over HTTP. A verified grant is
    handed to ``granted(generation, token)``; :meth:`stop` starts a new generation, so a
    grant of an abandoned wait is told apart."""

    def __init__(self, granted: Callable[[int, int], None], watch_claim: Optional[Callable[..., None]] = None) -> None:
        self._granted = granted
        self._watch_claim = watch_claim
        self._lock = threading.Lock()
        self.generation = 0
        self._current: Optional[Designation] = None
        self._conn: Optional[http.client.HTTPConnection] = None
        self._watch_response: Any = None
        self._http_running = False
        self._arrived = False

    def follow(self, lock: Mapping[str, Any], claim: str, proof: Optional[str]) -> None:
        """Wait for a direct grant while ``lock``'s status designates ``claim`` (once per
        designation; at the URL again after a failure only when the status changes; on
        the claim once: a watch refused stays refused)."""
        nxt = Designation.of(lock, claim, proof)
        with self._lock:
            # A grant already here stays: it was verified for this claim's reserved token,
            # and the lock counts a successor told of its grant as a holder.
            if self._arrived:
                return
            if nxt is not None and nxt == self._current:
                if nxt.release_url and not self._http_running:
                    self._start(self._wait, nxt, "leasehold-direct-grant")
                return
        self.stop()
        if nxt is None:
            return
        with self._lock:
            self._current = nxt
            if self._watch_claim is not None:
                self._start(self._watch, nxt, "leasehold-claim-grant")
            if nxt.release_url:
                self._start(self._wait, nxt, "leasehold-direct-grant")

    def _start(self, target: Callable[[Designation, int], None], d: Designation, name: str) -> None:
        """Start one wait of the current generation (called with ``_lock`` held)."""
        if target == self._wait:
            self._http_running = True
        threading.Thread(target=target, args=(d, self.generation), name=name, daemon=True).start()

    def stop(self) -> None:
        """Stop waiting: no grant of the current wait is taken from here on."""
        with self._lock:
            self.generation += 1
            self._current, self._http_running, self._arrived = None, False, False
            conn, self._conn = self._conn, None
            response, self._watch_response = self._watch_response, None
        if response is not None:
            close_response(response)
        if conn is not None:
            try:
                if conn.sock is not None:
                    conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _keeping(self, generation: int, attribute: str) -> Callable[[Any], None]:
        """Keep a wait's connection (``_conn``) or response (``_watch_response``) for
        :meth:`stop` to close, if the wait is still current; else close it and raise."""

        def keep(conn: Any) -> None:
            with self._lock:
                if generation == self.generation:
                    setattr(self, attribute, conn)
                    return
            conn.close()
            raise ConnectionAbortedError("the wait was stopped")

        return keep

    def _take(self, d: Designation, generation: int) -> None:
        with self._lock:
            if generation != self.generation or self._arrived:
                return
            self._arrived = True
        self._granted(generation, d.token)

    def _http_done(self, generation: int) -> None:
        with self._lock:
            if generation == self.generation:
                self._http_running = False

    def _watch(self, d: Designation, generation: int) -> None:
        message = p.grant_message(d.namespace, d.lock, d.lock_uid, d.claim, d.token)

        def seen(lease: dict) -> bool:
            value = ((lease.get("metadata") or {}).get("annotations") or {}).get(p.DIRECT_GRANT_ANNOTATION)
            if value is None or not p.told_by_annotation(d.key, message, d.token, value):
                return False  # none yet, a neighbour's, or an earlier designation's
            self._take(d, generation)
            return True

        assert self._watch_claim is not None
        self._watch_claim(seen, lambda: generation == self.generation, self._keeping(generation, "_watch_response"))

    def _wait(self, d: Designation, generation: int) -> None:
        url = p.endpoint(d.release_url, GRANT_PATH) if d.release_url else None
        body: Dict[str, str] = {"namespace": d.namespace, "lock": d.lock, "claim": d.claim}
        if d.proof:
            body["proof"] = d.proof
        try:
            while url is not None:
                sent = time.monotonic()
                try:
                    code, headers = post_json(url, body, None, self._keeping(generation, "_conn"))
                except (OSError, http.client.HTTPException) as e:
                    log.debug("waiting for a direct grant failed: %s", e)
                    return
                if generation != self.generation:
                    return
                if code == 204:
                    time.sleep(max(0.0, sent + REASK_AFTER - time.monotonic()))
                    continue
                if code != 200:
                    log.debug("the controller takes no wait for a direct grant (%s)", code)
                    return
                token = headers.get(TOKEN_HEADER)
                message = p.grant_message(d.namespace, d.lock, d.lock_uid, d.claim, d.token)
                if token == str(d.token) and p.verify(d.key, message, headers.get(SIGNATURE_HEADER, "")):
                    self._take(d, generation)
                else:
                    log.warning(
                        "a direct grant for claim %s (token %s) did not verify against the lock's grant key: ignored",
                        d.claim,
                        token,
                    )
                return
        finally:
            self._http_done(generation)
