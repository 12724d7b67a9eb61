//! The protocol's test vectors (`docs/protocol-vectors.json`), checked against the
//! functions every Rust client and the controller use. The Python client's tests read
//! the same file, so both languages are held to one set of values.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use serde_json::Value;

use super::grant::{Grant, GrantKey, WrittenRelease};
use super::record::{Written, check};
use super::release::{Secret, hash_of, is_hash, judge};
use super::{claim, timing};
use crate::api::DistributedLockStatus;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/protocol-vectors.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("docs/protocol-vectors.json")).unwrap()
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("a string, not {v}"))
}

fn unhex(text: &str) -> Vec<u8> {
    super::release::unhex(text).expect("hex")
}

#[test]
fn release_secrets_hash_and_prove_as_the_vectors_say() {
    let v = vectors();
    assert_eq!(
        v["protocol_version"],
        env!("CARGO_PKG_VERSION"),
        "the vectors' protocol version"
    );
    for case in v["release"].as_array().unwrap() {
        let secret = Secret::from_revealed(s(&case["secret"]));
        assert_eq!(secret.hash(), s(&case["hash"]));
        assert_eq!(secret.wait_proof(), s(&case["wait_proof"]));
        assert_eq!(secret.wait_hash(), s(&case["wait_hash"]));
        assert_eq!(hash_of(s(&case["wait_proof"])), s(&case["wait_hash"]));
    }
    for case in v["is_hash"].as_array().unwrap() {
        assert_eq!(is_hash(s(&case["text"])), case["expected"], "is_hash({})", case["text"]);
    }
    for case in v["release_judge"].as_array().unwrap() {
        let mut lease = Lease::default();
        lease.metadata.annotations =
            Some([(super::RELEASED_ANNOTATION.to_string(), s(&case["mark"]).to_string())].into());
        let mark = judge(&lease, case["recorded_hash"].as_str());
        assert_eq!(format!("{mark:?}"), s(&case["expected"]), "{case}");
    }
}

#[test]
fn a_grant_on_a_claim_is_told_as_the_vectors_say() {
    let v = vectors();
    let (set, f) = (&v["claim_grant"], &v["claim_grant"]["fields"]);
    let grant = Grant {
        namespace: s(&f["namespace"]),
        lock: s(&f["lock"]),
        lock_uid: s(&f["lock_uid"]),
        claim: s(&f["claim"]),
        fencing_token: f["fencing_token"].as_i64().unwrap(),
    };
    let key = s(&v["grant_signature"]["public_key"]);
    for case in set["cases"].as_array().unwrap() {
        let told = grant.told_by_annotation(key, s(&case["value"]));
        assert_eq!(told, case["told"], "{case}");
    }
}

#[test]
fn grant_and_written_signatures_are_the_vectors_bytes_and_signatures() {
    let v = vectors();
    for (kind, grant) in [("grant_signature", true), ("written_signature", false)] {
        let set = &v[kind];
        let key = GrantKey::from_seed(&unhex(s(&set["seed_hex"])));
        assert_eq!(key.public(), s(&set["public_key"]), "{kind}: the published key");
        let signed = |f: &Value, signature: &str| {
            let (namespace, lock, lock_uid, claim) =
                (s(&f["namespace"]), s(&f["lock"]), s(&f["lock_uid"]), s(&f["claim"]));
            if grant {
                let g = Grant {
                    namespace,
                    lock,
                    lock_uid,
                    claim,
                    fencing_token: f["fencing_token"].as_i64().unwrap(),
                };
                (g.message(), key.sign(&g), g.verify(&key.public(), signature))
            } else {
                let w = WrittenRelease {
                    namespace,
                    lock,
                    lock_uid,
                    claim,
                };
                (w.message(), key.sign_written(&w), w.verify(&key.public(), signature))
            }
        };
        for case in set["cases"].as_array().unwrap() {
            let (message, signature, verifies) = signed(&case["fields"], s(&case["signature"]));
            assert_eq!(
                String::from_utf8(message.clone()).unwrap(),
                s(&case["message"]),
                "{kind}"
            );
            assert_eq!(message, unhex(s(&case["message_hex"])), "{kind}");
            assert_eq!(signature, s(&case["signature"]), "{kind}: Ed25519 is deterministic");
            assert!(verifies, "{kind}");
        }
        for case in set["must_not_verify"].as_array().unwrap() {
            let (_, _, verifies) = signed(&case["fields"], s(&case["signature"]));
            assert!(!verifies, "{kind}: {}", case["why"]);
        }
    }
}

#[test]
fn timing_rules_give_the_vectors_durations() {
    let v = vectors();
    let constants = &v["timing"]["constants_ms"];
    let ms = |d: Duration| d.as_millis() as u64;
    assert_eq!(constants["EXPIRY_GRACE"], ms(timing::EXPIRY_GRACE));
    assert_eq!(constants["WAIT_LEASE"], ms(timing::WAIT_LEASE));
    assert_eq!(constants["NOTICE_WAIT"], ms(timing::NOTICE_WAIT));
    assert_eq!(constants["MIN_RENEW_TIMEOUT"], ms(timing::MIN_RENEW_TIMEOUT));
    assert_eq!(constants["POD_CACHE_GRACE"], ms(timing::POD_CACHE_GRACE));
    assert_eq!(constants["WAIT_CHECK"], ms(timing::WAIT_CHECK));
    assert_eq!(constants["WATCH_TIMEOUT"], ms(timing::WATCH_TIMEOUT));
    assert_eq!(v["timing"]["MAX_LEASE_SECONDS"], timing::MAX_LEASE_SECONDS);
    assert_eq!(constants["CLAIM_ANEW_MAX"], ms(timing::CLAIM_ANEW_MAX));
    for (n, pause) in v["timing"]["claim_anew_pause_ms"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        assert_eq!(
            pause.as_u64(),
            Some(ms(timing::claim_anew_pause(n as u32))),
            "claim {n}"
        );
    }
    for case in v["timing"]["cases"].as_array().unwrap() {
        let secs = case["lease_seconds"].as_u64().unwrap();
        let lease = Duration::from_secs(secs);
        let ns = &case["ns"];
        let zero = Duration::ZERO;
        for (name, got) in [
            ("safety_margin", timing::safety_margin(lease)),
            ("renew_interval", timing::renew_interval(lease)),
            ("wait_lease", timing::wait_lease(lease)),
            ("wait_renew_interval", timing::wait_renew_interval(lease)),
            ("renew_retry_max", timing::renew_retry_max(lease)),
            ("renew_timeout", timing::renew_timeout(lease)),
            ("release_budget", timing::release_budget(lease)),
            ("notice_timeout", timing::notice_timeout(lease)),
            ("client_stop_by", timing::client_stop_by(zero, lease)),
            ("command_dead_by", timing::command_dead_by(zero, lease)),
            ("controller_expiry", timing::controller_expiry(zero, lease, lease)),
        ] {
            assert_eq!(
                ns[name].as_u64(),
                Some(got.as_nanos() as u64),
                "{name} at a {secs} s lease"
            );
        }
        assert_eq!(
            case["etcd_claim_ttl_seconds"],
            timing::etcd_claim_ttl(lease),
            "{secs} s"
        );
    }
}

#[test]
fn claim_names_and_request_times_read_as_the_vectors_say() {
    let v = vectors();
    let names = &v["claim_name"];
    for case in names["prefixes"].as_array().unwrap() {
        let made = claim::claim_name(s(&case["lock"]));
        let suffix = &made[made.len() - 12..];
        assert_eq!(
            &made[..made.len() - 12],
            s(&case["prefix"]),
            "claim_name({})",
            case["lock"]
        );
        assert!(suffix.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert!(made.len() <= names["max_len"].as_u64().unwrap() as usize);
    }
    for case in names["is_claim_name"].as_array().unwrap() {
        let got = claim::is_claim_name(s(&case["name"]), s(&case["lock"]));
        assert_eq!(
            got, case["expected"],
            "is_claim_name({}, {})",
            case["name"], case["lock"]
        );
    }
    for case in names["requested_at"]["parsed"].as_array().unwrap() {
        let mut lease = Lease::default();
        lease.metadata.annotations = Some(
            [(
                super::REQUESTED_AT_ANNOTATION.to_string(),
                s(&case["value"]).to_string(),
            )]
            .into(),
        );
        assert_eq!(
            claim::requested_micros(&lease),
            case["micros"].as_i64().unwrap(),
            "{}",
            case["value"]
        );
    }
}

#[test]
fn the_record_check_finds_the_vectors_fields() {
    let v = vectors();
    let record = &v["record"];
    let w = &record["written"];
    let wrote = Written {
        pod: s(&w["pod"]),
        pod_uid: s(&w["pod_uid"]),
        release_hash: w["release_hash"].as_str(),
        wait_hash: w["wait_hash"].as_str(),
        lease_seconds: w["lease_seconds"].as_i64().unwrap() as i32,
    };
    for case in record["cases"].as_array().unwrap() {
        let status: DistributedLockStatus =
            serde_json::from_value(case["status"].clone()).unwrap_or_else(|e| panic!("{}: {e}", case["name"]));
        let got = check(&status, s(&record["claim"]), &wrote).err();
        assert_eq!(
            got.map(|t| format!("{t:?}")).as_deref(),
            case["expected"].as_str(),
            "{}",
            case["name"]
        );
        assert_eq!(
            got.map(|t| t.field()),
            case["expected_field"].as_str(),
            "{}",
            case["name"]
        );
    }
}
