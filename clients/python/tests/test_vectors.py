"""The protocol's test vectors (docs/protocol-vectors.json): the same file the Rust
crate's tests read, so both clients compute the same hashes, signatures and times."""

import json
import pathlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from leasehold_client import protocol as p

VECTORS = json.loads((pathlib.Path(__file__).parents[3] / "docs" / "protocol-vectors.json").read_text())


def test_the_vectors_describe_this_client_s_protocol_version():
    import leasehold_client

    assert VECTORS["protocol_version"] == leasehold_client.PROTOCOL_VERSION
    assert VECTORS["api_version"] == f"{p.GROUP}/{p.VERSION}"


@pytest.mark.parametrize("case", VECTORS["release"])
def test_secrets_hash_and_prove(case):
    secret = p.Secret(case["secret"])
    assert secret.hash() == case["hash"]
    assert secret.wait_proof() == case["wait_proof"]
    assert secret.wait_hash() == case["wait_hash"]
    assert repr(secret) == "Secret(..)"


def test_a_fresh_secret_has_the_secret_format():
    secret = p.Secret()
    assert p.is_hash(secret.reveal()) and secret.reveal() != p.Secret().reveal()


@pytest.mark.parametrize("case", VECTORS["is_hash"])
def test_is_hash(case):
    assert p.is_hash(case["text"]) == case["expected"]


@pytest.mark.parametrize("kind", ["grant_signature", "written_signature"])
def test_signatures_are_the_vectors(kind):
    vectors = VECTORS[kind]
    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(vectors["seed_hex"]))
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()
    assert public == vectors["public_key"]

    def message(f):
        if kind == "grant_signature":
            return p.grant_message(f["namespace"], f["lock"], f["lock_uid"], f["claim"], f["fencing_token"])
        return p.written_message(f["namespace"], f["lock"], f["lock_uid"], f["claim"])

    for case in vectors["cases"]:
        m = message(case["fields"])
        assert m.decode() == case["message"] and m.hex() == case["message_hex"]
        assert key.sign(m).hex() == case["signature"]
        assert p.verify(public, m, case["signature"])
    for case in vectors["must_not_verify"]:
        assert not p.verify(public, message(case["fields"]), case["signature"]), case["why"]
    assert not p.verify("not hex", b"m", "00"), "a malformed key verifies nothing"


@pytest.mark.parametrize("case", VECTORS["claim_grant"]["cases"], ids=lambda c: c.get("why", "told"))
def test_a_grant_on_a_claim_is_told_as_the_vectors_say(case):
    f = VECTORS["claim_grant"]["fields"]
    message = p.grant_message(f["namespace"], f["lock"], f["lock_uid"], f["claim"], f["fencing_token"])
    public = VECTORS["grant_signature"]["public_key"]
    assert p.told_by_annotation(public, message, f["fencing_token"], case["value"]) == case["told"]


@pytest.mark.parametrize("case", VECTORS["timing"]["cases"], ids=lambda c: f"{c['lease_seconds']}s")
def test_timing_rules(case):
    lease = float(case["lease_seconds"])
    got = {
        "safety_margin": p.safety_margin(lease),
        "renew_interval": p.renew_interval(lease),
        "wait_lease": p.wait_lease(lease),
        "wait_renew_interval": p.wait_renew_interval(lease),
        "renew_retry_max": p.renew_retry_max(lease),
        "renew_timeout": p.renew_timeout(lease),
        "release_budget": p.release_budget(lease),
        "notice_timeout": p.notice_timeout(lease),
        "client_stop_by": p.client_stop_by(0.0, lease),
        "controller_expiry": p.controller_expiry(0.0, lease, lease),
    }
    for name, seconds in got.items():
        # Rust divides whole nanoseconds: a float is within a nanosecond of it.
        assert abs(seconds * 1e9 - case["ns"][name]) <= 1, name


def test_timing_constants():
    c = VECTORS["timing"]["constants_ms"]
    assert p.EXPIRY_GRACE * 1000 == c["EXPIRY_GRACE"]
    assert p.WAIT_LEASE * 1000 == c["WAIT_LEASE"]
    assert p.MIN_RENEW_TIMEOUT * 1000 == c["MIN_RENEW_TIMEOUT"]
    assert p.UNQUEUED_NOTICE * 1000 == c["UNQUEUED_NOTICE"]
    assert p.TRY_ACQUIRE_TIMEOUT * 1000 == c["TRY_ACQUIRE_TIMEOUT"]
    assert p.WAIT_CHECK * 1000 == c["WAIT_CHECK"]
    assert p.WATCH_TIMEOUT * 1000 == c["WATCH_TIMEOUT"]
    assert VECTORS["timing"]["MAX_LEASE_SECONDS"] == p.MAX_LEASE_SECONDS
    assert p.CLAIM_ANEW_MAX * 1000 == c["CLAIM_ANEW_MAX"]
    for n, pause in enumerate(VECTORS["timing"]["claim_anew_pause_ms"]):
        assert round(p.claim_anew_pause(n) * 1000) == pause, n


def test_the_timing_inequality_holds_at_every_lease():
    """A holder is dead (stopped, then a margin of SIGTERM grace) before the controller
    may free its slot, counting both from the same write (seen >= sent)."""
    for lease in [1, 2, 3, 5, 15, 60, 600, 3600]:
        sent = 0.0
        stop = p.client_stop_by(sent, lease)
        assert stop + p.safety_margin(lease) <= sent + lease < p.controller_expiry(sent, lease, lease)


@pytest.mark.parametrize("case", VECTORS["claim_name"]["prefixes"], ids=lambda c: c["lock"][:12])
def test_claim_names(case):
    made = p.claim_name(case["lock"])
    assert made[:-12] == case["prefix"]
    assert all(c in "0123456789abcdef" for c in made[-12:])
    assert len(made) <= VECTORS["claim_name"]["max_len"]
    assert p.is_claim_name(made, case["lock"]) or case["prefix"][:-1] != case["lock"][: len(case["prefix"]) - 1]


@pytest.mark.parametrize("case", VECTORS["claim_name"]["is_claim_name"], ids=lambda c: c["name"][:20])
def test_is_claim_name(case):
    assert p.is_claim_name(case["name"], case["lock"]) == case["expected"]


def test_micro_time_is_rfc3339_with_microseconds():
    import datetime as dt

    at = dt.datetime(2026, 11, 23, 9, 0, 1, 999000, tzinfo=dt.timezone.utc)
    assert p.micro_time(at) == VECTORS["claim_name"]["requested_at"]["example"]


@pytest.mark.parametrize("case", VECTORS["record"]["cases"], ids=lambda c: c["name"])
def test_the_record_check(case):
    w = VECTORS["record"]["written"]
    wrote = p.Written(w["pod"], w["pod_uid"], w["release_hash"], w["wait_hash"], w["lease_seconds"])
    got = p.check_record(case["status"], VECTORS["record"]["claim"], wrote)
    assert got == case["expected"]
    assert (p.TAMPERED_FIELDS[got] if got else None) == case["expected_field"]
