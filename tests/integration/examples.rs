//! Every manifest in examples/ is accepted by a real API server.

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery;

use crate::support::TestNs;

#[tokio::test]
async fn example_manifests_are_accepted_by_the_api_server() {
    let ns = TestNs::new("examples").await;
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    files.retain(|p| p.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    // What this v1.20 API server does not serve; each is checked offline by
    // kubernetes-validate (scripts/chart-check.sh) instead.
    const NOT_ON_V1_20: &[(&str, &str)] = &[("batch/v1", "CronJob")];
    let (mut created, mut skipped) = (0, Vec::new());
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for doc in serde_norway::Deserializer::from_str(&text) {
            let value = serde_norway::Value::deserialize(doc).unwrap();
            if value.is_null() {
                continue;
            }
            let mut obj: DynamicObject = serde_norway::from_value(value).unwrap();
            let types = obj.types.clone().expect("every example names apiVersion and kind");
            let gvk = GroupVersionKind::try_from(&types).unwrap();
            if NOT_ON_V1_20.contains(&(types.api_version.as_str(), types.kind.as_str())) {
                eprintln!(
                    "SKIPPED {} {} in {}: not served by v1.20",
                    types.api_version,
                    types.kind,
                    file.display()
                );
                skipped.push(types.kind.clone());
                continue;
            }
            let (resource, _) = discovery::pinned_kind(&ns.client, &gvk)
                .await
                .unwrap_or_else(|e| panic!("{}: {} {}: {e}", file.display(), types.api_version, types.kind));
            obj.metadata.namespace = Some(ns.name.clone());
            let api: Api<DynamicObject> = Api::namespaced_with(ns.client.clone(), &ns.name, &resource);
            if let Err(e) = api.create(&PostParams::default(), &obj).await {
                panic!(
                    "{}: {} {:?} rejected: {e}",
                    file.display(),
                    types.kind,
                    obj.metadata.name
                );
            }
            created += 1;
        }
    }
    assert!(
        skipped.len() <= 1,
        "only the one CronJob may be skipped, not {skipped:?}"
    );
    assert!(created >= 11, "only {created} objects created from {files:?}");
}

use serde::Deserialize;
