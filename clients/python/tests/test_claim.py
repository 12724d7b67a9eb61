"""What a claim looks like on the wire, and how a client reads a status."""

from leasehold_client import protocol as p

POD = p.PodIdentity("web-0", "ns", "uid-1")


def test_a_claim_names_its_lock_pod_lease_and_hashes():
    secret = p.Secret()
    lease = p.claim_lease("l-0123456789ab", "l", POD, 15, secret)
    meta, spec = lease["metadata"], lease["spec"]
    assert meta["labels"] == {p.LOCK_LABEL: "l"}
    assert meta["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "web-0", "uid": "uid-1"}]
    ann = meta["annotations"]
    assert ann[p.POD_UID_ANNOTATION] == "uid-1"
    assert ann[p.RELEASE_HASH_ANNOTATION] == secret.hash()
    assert ann[p.WAIT_HASH_ANNOTATION] == secret.wait_hash()
    assert ann[p.WAIT_LEASE_ANNOTATION] == "240"
    assert secret.reveal() not in str(lease), "only hashes of the secret are written"
    assert spec["holderIdentity"] == "web-0" and spec["leaseDurationSeconds"] == 15
    wrote = p.Written("web-0", "uid-1", secret.hash(), secret.wait_hash(), 15)
    assert p.claim_differs(lease, wrote, "l") is None
    for field, change in [
        ("Lock", lambda l: l["metadata"]["labels"].pop(p.LOCK_LABEL)),
        ("Pod", lambda l: l["spec"].update(holderIdentity="other")),
        ("ReleaseHash", lambda l: l["metadata"]["annotations"].pop(p.RELEASE_HASH_ANNOTATION)),
        ("Owner", lambda l: l["metadata"].update(ownerReferences=[])),
        ("WaitHash", lambda l: l["metadata"]["annotations"].update({p.WAIT_HASH_ANNOTATION: "0" * 64})),
        ("Lease", lambda l: l["spec"].update(leaseDurationSeconds=5)),
        ("Lease", lambda l: l["spec"].update(leaseDurationSeconds=3600)),
    ]:
        tampered = p.claim_lease("l-0123456789ab", "l", POD, 15, secret)
        change(tampered)
        assert p.claim_differs(tampered, wrote, "l") == field


def test_the_patches():
    secret = p.Secret()
    assert p.renew_patch("u")["metadata"] == {"uid": "u"}
    assert "metadata" not in p.renew_patch(None)
    release = p.release_patch("l", secret)["metadata"]
    assert release["annotations"] == {p.RELEASED_ANNOTATION: secret.reveal()}
    assert release["labels"] == {p.RELEASED_LABEL: "true", p.LOCK_LABEL: "l"}


def test_grants_hold_backs_and_designations():
    status = {
        "holders": [
            {"claim": "a", "fencingToken": 3, "revoked": {"reason": "ForceReleased", "at": "x"}},
            {"claim": "b", "fencingToken": 4},
        ],
        "queue": [{"claim": "c"}],
        "successor": {"claim": "c", "fencingToken": 5},
        "refused": [{"claim": "d", "reason": "QueueFull"}],
    }
    assert p.granted_token(status, "a") is None and p.held_back(status, "a")
    assert p.granted_token(status, "b") == 4 and not p.held_back(status, "b")
    assert p.still_grants(status, "c", 5) and not p.still_grants(status, "c", 6)
    assert p.names_claim(status, "c") and not p.names_claim(status, "d")
    assert p.refusal(status, "d") == "QueueFull"


def test_only_a_plain_http_url_with_a_port_is_an_endpoint():
    assert p.endpoint("http://10.1.2.3:8080", "/v1/release") == "http://10.1.2.3:8080/v1/release"
    assert p.endpoint("http://10.1.2.3:8080/", "/v1/release") == "http://10.1.2.3:8080/v1/release"
    for bad in ["https://10.1.2.3:8080", "http://10.1.2.3", "not a url", ""]:
        assert p.endpoint(bad, "/v1/release") is None
