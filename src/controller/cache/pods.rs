//! What the controller keeps of every pod it watches: name, UID and whether it finished
//! with its containers stopped — a few hundred bytes a pod, where a cached (even slimmed)
//! `Pod` object costs kilobytes. A claim's pod's liveness is what the fenced handoff is
//! decided on; nothing else of a pod is read.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::watcher::Event;

use crate::controller::cache::relisted::Relisted;
use crate::controller::cache::tracker::pod_stopped;
use crate::decide::PodView;

/// Pods by (namespace, name); feed it every pod-watch event with [`PodIndex::apply`].
#[derive(Default)]
pub struct PodIndex(Relisted<HashMap<(String, String), PodView>>);

fn key(pod: &Pod) -> (String, String) {
    (pod.namespace().unwrap_or_default(), pod.name_any())
}

/// The decide core's view of a pod: finished only when the kubelet reported its
/// containers stopped too (the pod garbage collector marks a lost node's pods Failed
/// without anyone having stopped them).
pub fn pod_view(pod: &Pod) -> PodView {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    PodView {
        uid: pod.uid().unwrap_or_default(),
        finished: matches!(phase, Some("Succeeded" | "Failed")) && pod_stopped(pod),
    }
}

impl PodIndex {
    /// Take in one watch event.
    pub fn apply(&self, event: &Event<Pod>) {
        let insert = |m: &mut HashMap<_, _>, p: &Pod| {
            m.insert(key(p), pod_view(p));
        };
        let remove = |m: &mut HashMap<_, _>, p: &Pod| {
            m.remove(&key(p));
        };
        self.0.apply(event, insert, remove);
    }

    /// What is known of the named pods in `ns`.
    pub fn views<'a>(&self, ns: &str, names: impl Iterator<Item = &'a str>) -> BTreeMap<String, PodView> {
        self.0.read(|m| {
            names
                .filter_map(|n| Some((n.to_string(), m.get(&(ns.to_string(), n.to_string()))?.clone())))
                .collect()
        })
    }

    /// Whether the first list of pods has been taken in.
    pub fn synced(&self) -> bool {
        self.0.synced()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str, phase: &str, terminated: bool) -> Pod {
        let state = if terminated {
            serde_json::json!({"terminated": {"exitCode": 0}})
        } else {
            serde_json::json!({"running": {}})
        };
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "status": {"phase": phase, "containerStatuses": [{"name": "app", "image": "i", "imageID": "",
                "ready": false, "restartCount": 0, "state": state}]}
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_is_finished_only_with_its_containers_stopped_and_gone_once_deleted() {
        let index = PodIndex::default();
        index.apply(&Event::Apply(pod("a", "u1", "Running", false)));
        index.apply(&Event::Apply(pod("b", "u2", "Failed", false))); // a lost node's pod, marked by GC
        index.apply(&Event::Apply(pod("c", "u3", "Succeeded", true)));
        let views = index.views("ns", ["a", "b", "c", "x"].into_iter());
        let finished: Vec<_> = views
            .iter()
            .map(|(n, v)| (n.as_str(), v.uid.as_str(), v.finished))
            .collect();
        assert_eq!(finished, [("a", "u1", false), ("b", "u2", false), ("c", "u3", true)]);
        index.apply(&Event::Delete(pod("a", "u1", "Running", false)));
        assert!(index.views("ns", ["a"].into_iter()).is_empty());
        assert!(
            index.views("other", ["b"].into_iter()).is_empty(),
            "namespaces are apart"
        );
    }

    #[test]
    fn a_relist_replaces_what_it_no_longer_shows_and_marks_the_index_synced() {
        let index = PodIndex::default();
        assert!(!index.synced());
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(pod("a", "u1", "Running", false)));
        index.apply(&Event::InitDone);
        assert!(index.synced());
        index.apply(&Event::Init);
        index.apply(&Event::InitApply(pod("a", "u9", "Running", false))); // replaced meanwhile
        assert_eq!(
            index.views("ns", ["a"].into_iter())["a"].uid,
            "u1",
            "the old view until done"
        );
        index.apply(&Event::InitDone);
        assert_eq!(index.views("ns", ["a"].into_iter())["a"].uid, "u9");
    }
}
