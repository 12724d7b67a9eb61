//! Whether the API server enforces the admission webhook this replica serves. With
//! `failurePolicy: Ignore` (the chart's default) a webhook the API server cannot reach
//! changes nothing a user sees: every write goes through unchecked. So each replica that
//! serves the webhook asks, once it is up ([`FIRST_CHECK_AFTER`]) and every [`CHECK_EVERY`]: a dry-run create of a
//! claim the webhook must refuse (its release hash is no hash) in the replica's own
//! namespace. Refused by the webhook: enforced. Created: not enforced, said in its log, a
//! Warning event `AdmissionNotEnforced` on its pod, and `leasehold_admission_enforced` 0.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::controller::metrics::{CategoryLabels, Metrics};
use crate::protocol::claim::{PodIdentity, claim_lease, claim_name};

/// How often the check runs.
pub const CHECK_EVERY: Duration = Duration::from_secs(300);
/// When the first check runs: once this replica is Ready and its address is among the
/// webhook Service's endpoints (before that the API server cannot reach it, rightly).
pub const FIRST_CHECK_AFTER: Duration = Duration::from_secs(60);

/// The claim the webhook must refuse: well-formed but for its release hash.
fn probe(ns: &str) -> Lease {
    let pod = PodIdentity {
        name: "leasehold-admission-check".into(),
        namespace: ns.into(),
        uid: "00000000-0000-0000-0000-000000000000".into(),
    };
    let mut lease = claim_lease(
        &claim_name("leasehold-admission-check"),
        "leasehold-admission-check",
        &pod,
        15,
    );
    let annotations = lease.metadata.annotations.get_or_insert_default();
    annotations.insert(crate::protocol::RELEASE_HASH_ANNOTATION.into(), "not-a-hash".into());
    lease
}

/// Whether the API server enforces the webhook now, by a dry-run create in `ns`:
/// `Some(true)` refused by the webhook, `Some(false)` created, `None` another answer
/// (this replica may not create Leases there, or the API server is down).
pub async fn enforced(client: &kube::Client, ns: &str) -> Option<bool> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match leases.create(&dry_run, &probe(ns)).await {
        Ok(_) => Some(false),
        Err(kube::Error::Api(s)) if s.message.contains("leasehold:") => Some(true),
        Err(e) => {
            tracing::debug!(error = %e, "checking that the admission webhook is enforced: no answer");
            None
        }
    }
}

/// Check every [`CHECK_EVERY`] and say what was found (see the module docs); `pod` is
/// this replica's pod (name, namespace), where the event goes.
pub async fn keep_checking(client: kube::Client, metrics: Arc<Metrics>, (pod, ns): (String, String)) {
    let reporter = Reporter {
        controller: "leasehold-controller".into(),
        instance: Some(pod.clone()),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(pod),
        namespace: Some(ns.clone()),
        ..Default::default()
    };
    let labels = CategoryLabels {
        category: "webhook".into(),
    };
    let set = |v: i64| {
        metrics.admission_enforced.get_or_create(&labels).set(v);
    };
    let mut said = false;
    tokio::time::sleep(FIRST_CHECK_AFTER).await;
    loop {
        match enforced(&client, &ns).await {
            Some(true) => {
                set(1);
                said = false;
            }
            Some(false) => {
                set(0);
                let note = "the API server lets through a claim the admission webhook refuses: it does not \
                            reach the webhook (failurePolicy Ignore), so claims and Leases go unchecked. \
                            Let it reach the controller pods' admission port";
                tracing::warn!("{note}");
                if !said {
                    let event = Event {
                        type_: EventType::Warning,
                        reason: "AdmissionNotEnforced".into(),
                        note: Some(note.into()),
                        action: "CheckAdmission".into(),
                        secondary: None,
                    };
                    said = recorder.publish(&event, &reference).await.is_ok();
                }
            }
            None => {}
        }
        tokio::time::sleep(CHECK_EVERY).await;
    }
}
