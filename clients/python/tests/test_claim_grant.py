"""The direct grant written on the claim: a designated claim's wait takes it from the
claim's watch only when it verifies for the reserved token, URL or not."""

import threading

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from leasehold_client import protocol as p
from leasehold_client._http import DirectWait

KEY = Ed25519PrivateKey.generate()
PUBLIC = KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def designating(claim: str = "c-1", token: int = 7) -> dict:
    """A lock whose status designates ``claim`` with ``token``, a key and no URL."""
    return {
        "metadata": {"namespace": "ns", "name": "l", "uid": "u-1"},
        "status": {"successor": {"claim": claim, "fencingToken": token}, "grantKey": PUBLIC},
    }


def on_claim(value):
    return {"metadata": {"name": "c-1", "annotations": {} if value is None else {p.DIRECT_GRANT_ANNOTATION: value}}}


def signed(token: int, key=KEY) -> str:
    return f"{token} {key.sign(p.grant_message('ns', 'l', 'u-1', 'c-1', token)).hex()}"


def follow(versions, lock=None):
    """Follow ``lock`` as claim c-1 with a claim watch showing ``versions``: the tokens
    granted once the watch has ended."""
    told, ended = [], threading.Event()

    def watch(seen, alive, opened):
        try:
            for version in versions:
                if not alive() or seen(version):
                    return
        finally:
            ended.set()

    wait = DirectWait(lambda _generation, token: told.append(token), watch)
    wait.follow(lock or designating(), "c-1", None)
    assert ended.wait(5), "the claim watch ends"
    return told


def test_the_grant_written_on_the_claim_is_taken_after_what_does_not_verify():
    forger = Ed25519PrivateKey.generate()
    versions = [on_claim(None), on_claim(signed(7, forger)), on_claim(signed(8)), on_claim("7"), on_claim(signed(7))]
    assert follow(versions) == [7]


def test_nothing_is_taken_without_a_verifying_grant_or_a_designation():
    assert follow([on_claim(None), on_claim(signed(8)), on_claim(signed(7, Ed25519PrivateKey.generate()))]) == []
    started = []
    wait = DirectWait(lambda _g, _token: None, lambda seen, alive, opened: None)
    wait._start = lambda target, d, name: started.append(name)  # type: ignore[method-assign]
    wait.follow(designating(claim="c-2"), "c-1", None)
    keyless = designating()
    del keyless["status"]["grantKey"]
    wait.follow(keyless, "c-1", None)
    assert started == [], "no watch without a designation of this claim with a key"
    wait.follow(designating(), "c-1", None)
    assert started == ["leasehold-claim-grant"], "one watch for a designation without a URL"
    wait.follow(designating(), "c-1", None)
    assert started == ["leasehold-claim-grant"], "not made again on a later status"


def test_a_stopped_wait_closes_its_claim_watch():
    opened_response, ended = threading.Event(), threading.Event()

    class Response:
        def __init__(self):
            self.closed = threading.Event()

        def shutdown(self):
            self.closed.set()

    response = Response()

    def watch(seen, alive, opened):
        opened(response)
        opened_response.set()
        response.closed.wait(5)
        ended.set()

    wait = DirectWait(lambda _g, _t: None, watch)
    wait.follow(designating(), "c-1", None)
    assert opened_response.wait(5)
    wait.stop()
    assert ended.wait(5) and response.closed.is_set(), "stop closes the watch, which ends"
