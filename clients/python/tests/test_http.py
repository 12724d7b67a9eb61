"""The two HTTP exchanges against a stand-in controller on loopback: only answers
signed by the lock's key count."""

import contextlib
import http.server
import queue
import socket
import threading
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from leasehold_client import _http
from leasehold_client import protocol as p

KEY, FORGER = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()


def public(key):
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def serve(code, headers):
    """A one-answer-per-request server: the URL and the request paths it saw."""
    seen = queue.Queue()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            seen.put((self.path, self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", seen


NOTICE = {"namespace": "ns", "lock": "l", "claim": "l-1", "secret": "s"}


def written_by(key, claim="l-1"):
    signature = key.sign(p.written_message("ns", "l", "u-1", claim)).hex()
    return {"leasehold-release": "written", "leasehold-release-signature": signature}


def test_only_a_written_answer_signed_by_the_lock_s_key_spares_the_mark():
    url, seen = serve(200, written_by(KEY))
    assert _http.notice_written(_http.NoticeTarget(url, public(KEY), "u-1"), NOTICE, 15)
    path, body = seen.get(timeout=1)
    assert path == "/v1/release" and b'"secret": "s"' in body
    for what, headers in [
        ("a bare 200", {}),
        ("written, unsigned", {"leasehold-release": "written"}),
        ("signed by another key", written_by(FORGER)),
        ("signed for another claim", written_by(KEY, "l-2")),
    ]:
        url, _ = serve(200, headers)
        assert not _http.notice_written(_http.NoticeTarget(url, public(KEY), "u-1"), NOTICE, 15), what
    for code in [202, 403, 409, 503]:
        url, _ = serve(code, {})
        assert not _http.notice_written(_http.NoticeTarget(url, public(KEY), "u-1"), NOTICE, 15), code


def test_an_unreachable_url_falls_back_to_the_mark_and_is_skipped_a_while():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()
    target = _http.NoticeTarget(url, public(KEY), "u-1")
    assert not _http.notice_written(target, NOTICE, 15)
    assert _http.REACH.unreachable(url, time.monotonic())


@contextlib.contextmanager
def hanging_url():
    """A URL whose connections never complete (its listener's accept queue is full), as
    where packets are dropped: a probe's connect hangs, and so would a notice's, for the
    whole notice timeout."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(0)
    filler = socket.create_connection(s.getsockname())
    try:
        yield f"http://127.0.0.1:{s.getsockname()[1]}"
    finally:
        filler.close()
        s.close()


def test_a_release_waits_a_little_for_a_probe_under_way_then_marks():
    with hanging_url() as url:
        _http.REACH.probe(url, 15)
        started = time.monotonic()
        assert not _http.notice_written(_http.NoticeTarget(url, public(KEY), "u-1"), NOTICE, 15)
        took = time.monotonic() - started
        assert took < p.notice_timeout(15) / 2, f"{took:.3f} s: the grace at most, not the notice timeout"


def test_a_release_long_after_a_probe_that_still_hangs_began_marks_at_once():
    # A notice there would hang its timeout (1 s): the release does not send one.
    with hanging_url() as url:
        with _http.REACH._answered:
            _http.REACH._known[url] = ("probing", time.monotonic() - 2 * _http.PROBE_GRACE)
        started = time.monotonic()
        assert not _http.notice_written(_http.NoticeTarget(url, public(KEY), "u-1"), NOTICE, 15)
        assert time.monotonic() - started < _http.PROBE_GRACE


def test_a_probe_that_never_answered_does_not_keep_notices_off():
    url = "http://10.0.0.3:8080"
    with _http.REACH._answered:
        _http.REACH._known[url] = ("probing", time.monotonic() - _http.PROBE_STALE)
    assert not _http.REACH.skipped(url)


def test_a_release_while_a_reachable_url_is_probed_waits_for_the_probe_and_sends_its_notice(monkeypatch):
    monkeypatch.setattr(_http, "PROBE_GRACE", 5.0)  # a loaded machine's probe thread may start late
    url, served = serve(200, {})  # answers, but not "written": the notice shows it was sent
    _http.REACH.probe(url, 15)
    assert not _http.notice_written(_http.NoticeTarget(url, public(KEY), "u-1"), NOTICE, 15)
    assert not served.empty(), "the notice was sent once the probe reached the URL"


def designating(url, token=7):
    return {
        "metadata": {"namespace": "ns", "name": "l", "uid": "u-1"},
        "status": {"successor": {"claim": "c-1", "fencingToken": token}, "releaseUrl": url, "grantKey": public(KEY)},
    }


def grant_headers(key, token, signed_token=None):
    message = p.grant_message("ns", "l", "u-1", "c-1", signed_token if signed_token is not None else token)
    return {"leasehold-fencing-token": str(token), "leasehold-grant-signature": key.sign(message).hex()}


def granted(lock, proof="proof"):
    got = queue.Queue()
    wait = _http.DirectWait(lambda generation, token: got.put((generation, token)))
    wait.follow(lock, "c-1", proof)
    try:
        return got.get(timeout=1)
    except queue.Empty:
        return None
    finally:
        wait.stop()


def test_a_direct_grant_signed_by_the_published_key_for_the_reserved_token_is_taken():
    url, seen = serve(200, grant_headers(KEY, 7))
    assert granted(designating(url))[1] == 7
    path, body = seen.get(timeout=1)
    assert path == "/v1/grant" and b'"proof": "proof"' in body and b'"claim": "c-1"' in body


def test_a_forged_or_mismatched_direct_grant_is_ignored():
    for what, code, headers in [
        ("another key", 200, grant_headers(FORGER, 7)),
        ("another token", 200, grant_headers(KEY, 8)),
        ("a token unlike the signed one", 200, grant_headers(KEY, 7, signed_token=8)),
        ("no signature", 200, {}),
        ("a refusal", 503, {}),
    ]:
        url, _ = serve(code, headers)
        assert granted(designating(url)) is None, what


def test_no_wait_without_a_designation_of_this_claim_with_a_key_and_url():
    url, seen = serve(200, grant_headers(KEY, 7))
    other = designating(url)
    other["status"]["successor"]["claim"] = "c-2"
    keyless = designating(url)
    del keyless["status"]["grantKey"]
    for lock in [other, keyless]:
        assert granted(lock) is None
    assert seen.empty(), "no request was made"
