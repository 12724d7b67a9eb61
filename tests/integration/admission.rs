//! The admission webhook (`controller::admission`) on the real API server: a URL
//! webhook on loopback (the harness's API server reaches it there), failing closed
//! (`failurePolicy: Fail`, so every claim write of the test went through it; `Ignore`,
//! the chart's default, where a test shows what a failed call would let through), scoped to
//! the test's namespace by a label. A neighbour with the client Role tries what
//! `neighbour.rs` shows it could do without the webhook; each is refused with its
//! reason, while the lock keeps working for clients acting as that same Role.

use std::path::Path;
use std::process::Command;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use leasehold::client::Lock;
use leasehold::controller::admission::Admission;
use leasehold::protocol::admission::{ADMISSION_PATH, Policy};
use leasehold::protocol::{LOCK_LABEL, RELEASE_HASH_ANNOTATION, RELEASED_LABEL};

use crate::support::*;

/// A CA and a server certificate for 127.0.0.1 signed by it, made with openssl in
/// `dir`: `ca.crt`, `tls.crt`, `tls.key`.
fn certificates(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    openssl(
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "1",
                "-subj",
                "/CN=leasehold-test-ca",
            ],
        ]
        .concat(),
    );
    openssl(
        &[
            &["req"][..],
            &ec,
            &["-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=127.0.0.1"],
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "tls.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "tls.crt",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    ]);
}

/// The webhook served by an in-process controller for `ns`, registered with the API
/// server for `ns` alone; returns the controller and the configuration's name.
async fn controller_with_webhook(ns: &TestNs, dir: &Path, failure_policy: &str) -> (Running, String) {
    certificates(dir);
    let port = free_port();
    let opts = leasehold::controller::Options {
        admission: Some(Admission {
            addr: ([127, 0, 0, 1], port).into(),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            policy: Policy::default(),
        }),
        ..leasehold::controller::Options::single(&ns.name, Some(&ns.name))
    };
    let controller = spawn_controller_with(ns.client.clone(), opts);
    let label = serde_json::json!({"metadata": {"labels": {"leasehold.dev/webhook-test": &ns.name}}});
    Api::<Namespace>::all(ns.client.clone())
        .patch(&ns.name, &PatchParams::default(), &Patch::Merge(label))
        .await
        .unwrap();
    let ca = std::fs::read(dir.join("ca.crt")).unwrap();
    let name = format!("leasehold-{}", ns.name);
    let config: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": "leases.leasehold.dev",
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}{ADMISSION_PATH}"),
                "caBundle": k8s_openapi::ByteString(ca),
            },
            "rules": [{"apiGroups": ["coordination.k8s.io"], "apiVersions": ["v1"],
                       "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["leases"]}],
            "namespaceSelector": {"matchLabels": {"leasehold.dev/webhook-test": &ns.name}},
            "failurePolicy": failure_policy,
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }]
    }))
    .unwrap();
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(ns.client.clone());
    configs.create(&PostParams::default(), &config).await.unwrap();
    // The API server takes the configuration up from a watch: wait until it refuses a
    // request only the webhook refuses (a malformed claim, created as a dry run).
    let malformed: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "probe", "labels": {LOCK_LABEL: "no-such-lock"}}
    }))
    .unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for("the API server to call the webhook", DEADLINE, || async {
        let created = leases(ns).create(&dry_run, &malformed).await;
        created.is_err().then_some(())
    })
    .await;
    (controller, name)
}

/// The neighbour's raw merge PATCH of Lease `name`, which must be refused with a
/// message containing `reason`.
async fn refused(neighbour: &kube::Client, ns: &TestNs, name: &str, patch: serde_json::Value, reason: &str) {
    let api: Api<Lease> = Api::namespaced(neighbour.clone(), &ns.name);
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Err(kube::Error::Api(e)) => assert!(
            e.message.contains(reason) && e.message.contains("leases.leasehold.dev"),
            "{patch} on {name}: refused, but not for {reason:?}: {}",
            e.message
        ),
        other => panic!("{patch} on {name}: let through ({other:?})"),
    }
}

#[tokio::test]
async fn the_webhook_refuses_each_neighbour_tampering_by_its_reason_and_the_lock_still_works() {
    let ns = TestNs::new("webhook").await;
    let neighbour = ns.as_lock_user().await;
    let dir = std::env::temp_dir().join(&ns.name);
    std::fs::create_dir_all(&dir).unwrap();
    let (_c, config) = controller_with_webhook(&ns, &dir, "Fail").await;
    ns.lock("l", spec(15)).await;
    let leader: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "app-leader"}, "spec": {"holderIdentity": "app-0", "leaseDurationSeconds": 15}
    }))
    .unwrap();
    leases(&ns).create(&PostParams::default(), &leader).await.unwrap();
    // a holds and b waits, both clients acting as the client Role, through the webhook.
    let lock = |pod| {
        Lock::builder(neighbour.clone(), &ns.name, "l")
            .identity(pod)
            .build()
            .unwrap()
    };
    let held = lock(ns.pod("a").await).acquire().await.unwrap();
    let lock_b = lock(ns.pod("b").await);
    let waiting = tokio::spawn(async move { lock_b.acquire().await });
    let l = ns.wait_lock("l", "b waits", |l| queue(l) == ["b"]).await;
    let cb = l.status.unwrap().queue[0].claim.clone();
    let ca = held.claim().to_string();

    let lower = serde_json::json!({"spec": {"leaseDurationSeconds": 1}});
    refused(&neighbour, &ns, &cb, lower, "is fixed at creation (15 to 1)").await;
    let raise = serde_json::json!({"spec": {"leaseDurationSeconds": 3600}});
    refused(&neighbour, &ns, &cb, raise, "is fixed at creation (15 to 3600)").await;
    let strip = serde_json::json!({"metadata": {"annotations": {RELEASE_HASH_ANNOTATION: null}}});
    refused(&neighbour, &ns, &cb, strip, RELEASE_HASH_ANNOTATION).await;
    let repoint = serde_json::json!({"spec": {"holderIdentity": "n"}, "metadata": {"annotations": {"leasehold.dev/pod-uid": "n"}}});
    refused(&neighbour, &ns, &cb, repoint, "fixed at creation").await;
    let forge = serde_json::json!({"metadata": {"annotations": {"leasehold.dev/released": "true"}, "labels": {RELEASED_LABEL: "true"}}});
    refused(&neighbour, &ns, &ca, forge, "must open the claim's").await;
    let orphan = serde_json::json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "n", "uid": "u-n"}]}});
    refused(&neighbour, &ns, &cb, orphan, "ownerReference to its Pod").await;
    let unlabel = serde_json::json!({"metadata": {"labels": {LOCK_LABEL: null}}});
    refused(&neighbour, &ns, &ca, unlabel, "fixed at creation").await;
    let depose = serde_json::json!({"spec": {"holderIdentity": "neighbour"}});
    refused(&neighbour, &ns, "app-leader", depose, "only claim Leases").await;
    let sweep_me = serde_json::json!({"metadata": {"labels": {LOCK_LABEL: "l", RELEASED_LABEL: "true"}}});
    refused(&neighbour, &ns, "app-leader", sweep_me, "only when created as one").await;
    // Nor can it squat another application's future Lease with a claim of that name.
    let mut squat = leasehold::protocol::claim::claim_lease("app-next-leader", "l", &ns.pod("n").await, 15);
    squat.metadata.namespace = Some(ns.name.clone());
    let squatted = Api::<Lease>::namespaced(neighbour.clone(), &ns.name)
        .create(&PostParams::default(), &squat)
        .await;
    assert!(
        matches!(&squatted, Err(kube::Error::Api(e)) if e.message.contains("is not <lock>-<12 hex digits>")),
        "{squatted:?}"
    );
    let own: Lease = serde_json::from_value(serde_json::json!({"metadata": {"name": "n-leader"}})).unwrap();
    let create = Api::<Lease>::namespaced(neighbour.clone(), &ns.name)
        .create(&PostParams::default(), &own)
        .await;
    assert!(create.is_err(), "the client Role created a Lease that is no claim");

    // Nothing of it reached the objects, and the lock hands over as usual.
    let app = leases(&ns).get("app-leader").await.unwrap();
    assert_eq!(app.spec.unwrap().holder_identity.as_deref(), Some("app-0"));
    held.release().await.unwrap();
    let g = tokio::time::timeout(DEADLINE, waiting).await.unwrap().unwrap().unwrap();
    assert_eq!(g.claim(), cb, "b is granted on the claim it made");
    g.release().await.unwrap();
    ns.wait_lock("l", "b released", |l| holders(l).is_empty()).await;
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(ns.client.clone());
    configs.delete(&config, &DeleteParams::default()).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A neighbour pads a claim with a foreign ownerReference whose name the API server
/// JSON-escapes to six bytes a character (`<` is `\u003c`), so that every later review
/// of it (the old object and the new) is larger than the webhook reads: under the
/// chart's default `failurePolicy: Ignore` the next change then went through unjudged.
/// The padding is refused now, and the claim's identity stays fixed.
#[tokio::test]
async fn a_claim_cannot_be_padded_past_what_its_reviews_can_carry() {
    let ns = TestNs::new("webhook-pad").await;
    let neighbour = ns.as_lock_user().await;
    let dir = std::env::temp_dir().join(&ns.name);
    std::fs::create_dir_all(&dir).unwrap();
    let (_c, config) = controller_with_webhook(&ns, &dir, "Ignore").await;
    ns.lock("l", spec(15)).await;
    let lock = Lock::builder(neighbour.clone(), &ns.name, "l")
        .identity(ns.pod("a").await)
        .build()
        .unwrap();
    let held = lock.acquire().await.unwrap();
    let claim = held.claim().to_string();
    // What the neighbour's watch of Leases shows it: the claim's Pod reference.
    let owner = leases(&ns)
        .get(&claim)
        .await
        .unwrap()
        .metadata
        .owner_references
        .unwrap()[0]
        .clone();
    let foreign =
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "<".repeat(1_450_000), "uid": "x"});
    let api: Api<Lease> = Api::namespaced(neighbour.clone(), &ns.name);
    let patch = |body: serde_json::Value| {
        let api = api.clone();
        let claim = claim.clone();
        async move {
            let patched = api.patch(&claim, &PatchParams::default(), &Patch::Merge(&body)).await;
            patched.map(|_| ()).map_err(|e| e.to_string())
        }
    };
    let padded = patch(serde_json::json!({"metadata": {"ownerReferences": [owner, foreign]}})).await;
    let repointed = patch(serde_json::json!({"metadata": {"annotations": {"leasehold.dev/pod-uid": "n"}}})).await;
    assert!(
        padded.as_ref().is_err_and(|e| e.contains("at most")),
        "the padding: {padded:?}; then the pod UID changed: {repointed:?}"
    );
    assert!(
        repointed.as_ref().is_err_and(|e| e.contains("fixed at creation")),
        "{repointed:?}"
    );
    // Nor by padding a Lease before it is a claim (no webhook needs to see that write
    // where the client accounts are not confined; here the admin makes it) and then
    // adding the lock label: that review carries two padded objects, 17.4 MB.
    let mut other: Lease = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "app-padded"}, "spec": {"holderIdentity": "app-0"}
    }))
    .unwrap();
    let padding =
        serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "name": "<".repeat(1_450_000), "uid": "y"});
    other.metadata.owner_references = Some(vec![serde_json::from_value(padding).unwrap()]);
    leases(&ns).create(&PostParams::default(), &other).await.unwrap();
    let label = serde_json::json!({"metadata": {"labels": {LOCK_LABEL: "l"}}});
    let labelled = api
        .patch("app-padded", &PatchParams::default(), &Patch::Merge(&label))
        .await;
    assert!(
        matches!(&labelled, Err(kube::Error::Api(e)) if e.message.contains("leases.leasehold.dev")),
        "a padded Lease became a claim: {:?}",
        labelled.map(|_| "labelled").map_err(|e| e.to_string())
    );
    // The holder renewed through it all, and releases.
    assert!(!held.is_lost());
    held.release().await.unwrap();
    ns.wait_lock("l", "a released", |l| holders(l).is_empty()).await;
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(ns.client.clone());
    configs.delete(&config, &DeleteParams::default()).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// One ValidatingAdmissionPolicy's CEL from the chart (`files/admission-policy.yaml`):
/// its variables in order, and its validations with their messages.
struct CelPolicy {
    variables: Vec<(String, cel_interpreter::Program)>,
    validations: Vec<(cel_interpreter::Program, String)>,
}

impl CelPolicy {
    /// Policy `which` (`claims` or `clients`); `accounts` stands for the variable the
    /// template adds from admission.clientAccounts.
    fn load(which: &str, accounts: &[&str]) -> Self {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/charts/leasehold/files/admission-policy.yaml"
        );
        let rules: serde_json::Value = serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let compile = |e: &serde_json::Value| {
            let source = e.as_str().unwrap();
            cel_interpreter::Program::compile(source).unwrap_or_else(|err| panic!("{source}: {err}"))
        };
        let mut variables = vec![(
            "accounts".to_string(),
            compile(&serde_json::json!(serde_json::json!(accounts).to_string())),
        )];
        for v in rules[which]["variables"].as_array().unwrap() {
            variables.push((v["name"].as_str().unwrap().to_string(), compile(&v["expression"])));
        }
        let validations = rules[which]["validations"].as_array().unwrap();
        let validations = validations
            .iter()
            .map(|v| (compile(&v["expression"]), v["message"].as_str().unwrap().to_string()));
        CelPolicy {
            variables,
            validations: validations.collect(),
        }
    }

    /// The first failed validation's message, as the API server would refuse with it.
    fn judge(&self, op: &str, user: &str, old: Option<&Lease>, new: Option<&Lease>) -> Result<(), String> {
        let mut context = cel_interpreter::Context::default();
        let json = |l: Option<&Lease>| l.map_or(serde_json::Value::Null, |l| serde_json::to_value(l).unwrap());
        context.add_variable_from_value("object", cel(&json(new)));
        context.add_variable_from_value("oldObject", cel(&json(old)));
        let request = serde_json::json!({"operation": op, "userInfo": {"username": user}});
        context.add_variable_from_value("request", cel(&request));
        let mut values = std::collections::HashMap::<String, cel_interpreter::Value>::new();
        for (name, program) in &self.variables {
            context.add_variable_from_value("variables", values.clone());
            let value = program
                .execute(&context)
                .unwrap_or_else(|e| panic!("variable {name}: {e}"));
            values.insert(name.clone(), value);
        }
        context.add_variable_from_value("variables", values);
        for (program, message) in &self.validations {
            match program.execute(&context) {
                Ok(cel_interpreter::Value::Bool(true)) => {}
                Ok(cel_interpreter::Value::Bool(false)) => return Err(message.clone()),
                other => panic!("{message}: evaluated to {other:?}"),
            }
        }
        Ok(())
    }
}

/// JSON as CEL sees a Kubernetes object: integers are `int`.
fn cel(v: &serde_json::Value) -> cel_interpreter::Value {
    use cel_interpreter::Value;
    match v {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Bool(*b),
        serde_json::Value::Number(n) => n.as_i64().map_or_else(|| Value::Float(n.as_f64().unwrap()), Value::Int),
        serde_json::Value::String(s) => Value::String(s.clone().into()),
        serde_json::Value::Array(a) => Value::List(a.iter().map(cel).collect::<Vec<_>>().into()),
        serde_json::Value::Object(o) => o
            .iter()
            .map(|(k, v)| (k.clone(), cel(v)))
            .collect::<std::collections::HashMap<_, _>>()
            .into(),
    }
}

/// What a neighbour may change, on what (0: a claim, 1: a released claim, 2: another
/// application's Lease), and as whom (an index into the users the test tries).
fn tampering() -> impl proptest::strategy::Strategy<Value = (u8, serde_json::Value, usize)> {
    use proptest::prelude::*;
    let key = prop_oneof![
        Just(LOCK_LABEL),
        Just(RELEASED_LABEL),
        Just("leasehold.dev/released"),
        Just(RELEASE_HASH_ANNOTATION),
        Just("leasehold.dev/pod-uid"),
        Just("leasehold.dev/wait-hash"),
        Just("leasehold.dev/wait-lease-seconds"),
        Just("leasehold.dev/requested-at"),
        Just("leasehold.dev/fencing-token"),
        Just("app"),
    ];
    let value = proptest::option::of(prop_oneof![
        Just("l".to_string()),
        Just("true".to_string()),
        Just("0123456789abcdef".repeat(4)),
        "[a-z]{1,3}"
    ]);
    let field = (key, value, any::<bool>()).prop_map(|(k, v, label)| {
        let place = if label { "labels" } else { "annotations" };
        serde_json::json!({"metadata": {place: {k: v}}})
    });
    let spec = (
        proptest::option::of(proptest::option::of(1..40i32)),
        proptest::option::of(proptest::option::of("[a-z]{1,2}")),
    )
        .prop_map(|(lease, holder)| {
            let mut spec = serde_json::json!({"renewTime": "2026-01-01T00:00:00.000000Z"});
            if let Some(l) = lease {
                spec["leaseDurationSeconds"] = serde_json::json!(l);
            }
            if let Some(h) = holder {
                spec["holderIdentity"] = serde_json::json!(h);
            }
            serde_json::json!({"spec": spec})
        });
    let owners = prop_oneof![
        Just(serde_json::json!({"metadata": {"ownerReferences": []}})),
        Just(serde_json::json!({"metadata": {"ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "n", "uid": "u-n"}]}})),
    ];
    let patch = proptest::collection::vec(prop_oneof![field, spec, owners], 1..4).prop_map(|parts| {
        let mut patch = serde_json::json!({});
        for p in parts {
            json_patch::merge(&mut patch, &p);
        }
        patch
    });
    (0..3u8, patch, 0..5usize)
}

proptest::proptest! {
    /// The chart's ValidatingAdmissionPolicies (CEL, for clusters >= 1.30, where this
    /// v1.20 API server cannot run them) refuse exactly what the webhook refuses, on
    /// any merge patch a neighbour can send to a claim, a released claim or another
    /// application's Lease, and on creating or deleting one, by a client or anyone.
    #[test]
    fn the_chart_s_cel_policies_judge_every_lease_write_as_the_webhook_does((base, patch, user) in tampering()) {
        use leasehold::protocol::admission::{Operation, Refusal, judge};
        let claims = CelPolicy::load("claims", &["leasehold-client"]);
        let clients = CelPolicy::load("clients", &["leasehold-client"]);
        let pod = leasehold::protocol::PodIdentity { name: "p".into(), namespace: "apps".into(), uid: "u-1".into() };
        let secret = leasehold::protocol::release::Secret::generate();
        let name = leasehold::protocol::claim::claim_name("l");
        let claim = leasehold::protocol::claim::claim_lease_with(&name, "l", &pod, 15, Some(&secret));
        let mut old = match base {
            0 => claim,
            1 => {
                let mut doc = serde_json::to_value(&claim).unwrap();
                json_patch::merge(&mut doc, &leasehold::protocol::claim::release_patch_with("l", &secret));
                serde_json::from_value(doc).unwrap()
            }
            _ => serde_json::from_value(serde_json::json!({"metadata": {"name": "app-leader"}, "spec": {"holderIdentity": "app-0", "leaseDurationSeconds": 15}})).unwrap(),
        };
        old.metadata.namespace = Some("apps".into());
        let mut doc = serde_json::to_value(&old).unwrap();
        json_patch::merge(&mut doc, &patch);
        let new: Lease = serde_json::from_value(doc).unwrap();
        let user = [
            "system:serviceaccount:apps:leasehold-client",
            "system:serviceaccount:apps:app",
            "system:serviceaccount:apps:not-leasehold-client",
            "leasehold-client",
            leasehold::protocol::admission::GARBAGE_COLLECTORS[0],
        ][user];
        let is_claim = |l: &Lease| l.metadata.labels.as_ref().is_some_and(|m| m.contains_key(LOCK_LABEL));
        let policy = Policy::default();
        // Both policies as the API server applies them: the clients policy to every
        // Lease write, the claims policy to creates and updates of claims (its
        // objectSelector: a claim before or after the write).
        let cel = |op: &str, old: Option<&Lease>, new: Option<&Lease>| {
            let claims_apply = op != "DELETE" && (old.is_some_and(is_claim) || new.is_some_and(is_claim));
            clients.judge(op, user, old, new).and_then(|()| match claims_apply {
                true => claims.judge(op, user, old, new),
                false => Ok(()),
            })
        };
        // What only the webhook can judge: a mark's hash (CEL has no SHA-256), a new
        // claim's owner and name (a hash's format CEL judges too).
        let cel_cannot = |r: &Result<(), Refusal>| match r {
            Err(Refusal::Malformed(bad)) => *bad != leasehold::protocol::BadClaim::MalformedHash,
            r => matches!(r, Err(Refusal::ForgedMark | Refusal::BadName(_))),
        };
        let cases = [
            ("UPDATE", Operation::Update, Some(&old), Some(&new)),
            ("CREATE", Operation::Create, None, Some(&new)),
            ("DELETE", Operation::Delete, Some(&old), None),
        ];
        for (name, op, before, after) in cases {
            let webhook = judge(&policy, op, user, before, after);
            if cel_cannot(&webhook) {
                continue;
            }
            let by_cel = cel(name, before, after);
            proptest::prop_assert_eq!(
                webhook.is_ok(),
                by_cel.is_ok(),
                "{} by {} of {} on {:?}: webhook {:?}, CEL {:?}", name, user, patch, old.metadata, webhook, by_cel
            );
        }
    }
}

/// Issue #41: the chart turns the webhook on by default, failing open (`Ignore`), so a
/// webhook the API server cannot reach changes nothing a user sees. The controller
/// asks, with a dry-run claim the webhook must refuse: created where no webhook is
/// registered (or reached), refused where it is.
#[tokio::test]
async fn the_controller_tells_whether_the_api_server_enforces_its_webhook() {
    let ns = TestNs::new("enforced").await;
    let enforced = || leasehold::controller::enforced::enforced(&ns.client, &ns.name);
    assert_eq!(
        enforced().await,
        Some(false),
        "no webhook is registered for this namespace"
    );
    let dir = std::env::temp_dir().join(&ns.name);
    std::fs::create_dir_all(&dir).unwrap();
    let (_c, config) = controller_with_webhook(&ns, &dir, "Fail").await;
    assert_eq!(enforced().await, Some(true), "the webhook refused the dry-run claim");
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(ns.client.clone());
    configs.delete(&config, &DeleteParams::default()).await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        leases(&ns).list(&Default::default()).await.unwrap().items.is_empty(),
        "a dry run creates nothing"
    );
}
