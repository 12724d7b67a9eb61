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
    let (mut created, mut skipped, mut total) = (0, 0, 0);
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for doc in serde_norway::Deserializer::from_str(&text) {
            let value = serde_norway::Value::deserialize(doc).unwrap();
            if value.is_null() {
                continue;
            }
            total += 1;
            let mut obj: DynamicObject = serde_norway::from_value(value).unwrap();
            let types = obj.types.clone().expect("every example names apiVersion and kind");
            let gvk = GroupVersionKind::try_from(&types).unwrap();
            let (resource, _) = match discovery::pinned_kind(&ns.client, &gvk).await {
                Ok(found) => found,
                Err(_) => {
                    eprintln!(
                        "SKIPPED {} {} in {}: not served by this v1.20 API server (checked offline by kubernetes-validate)",
                        types.api_version,
                        types.kind,
                        file.display()
                    );
                    skipped += 1;
                    continue;
                }
            };
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
    assert_eq!(created + skipped, total);
    assert!(
        skipped <= 1,
        "only the batch/v1 CronJob may be skipped on v1.20, not {skipped} objects"
    );
    assert!(created >= 11, "only {created} objects created from {files:?}");
}

use serde::Deserialize;
