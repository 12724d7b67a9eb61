//! Which pod this process runs in: its name, namespace and UID, as a claim names them.
//!
//! Explicit settings win: `POD_NAME`, `POD_NAMESPACE` and `POD_UID` (the downward API
//! gives them). Whatever they leave unset comes from the pod's service-account token,
//! which on Kubernetes ≥ 1.21 (and wherever bound tokens are on) the API server signs
//! with the pod it was issued to: `kubernetes.io.pod.{name,uid}` and
//! `kubernetes.io.namespace`. The token is read, not verified: it is this process's own
//! credential, and the API server checks it on every request anyway. The rule
//! ([`resolve`]) is pure; [`from_pod`] reads the environment and the token file.

use base64::Engine;
use serde::Deserialize;

use super::Error;
use crate::protocol::PodIdentity;

/// Where Kubernetes mounts a pod's service-account token.
pub const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// The claims of a bound service-account token that name its pod.
#[derive(Debug, Default, Deserialize)]
struct TokenClaims {
    #[serde(rename = "kubernetes.io", default)]
    kubernetes: Option<KubernetesClaims>,
}

#[derive(Debug, Default, Deserialize)]
struct KubernetesClaims {
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    pod: Option<PodClaims>,
}

#[derive(Debug, Default, Deserialize)]
struct PodClaims {
    name: Option<String>,
    uid: Option<String>,
}

/// The pod a service-account token names: (namespace, name, uid), each if present.
/// `None` for anything that is no JWT with a JSON payload (a legacy token is a JWT
/// without pod claims).
fn token_pod(token: &str) -> Option<(Option<String>, Option<String>, Option<String>)> {
    let payload = token.trim().split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: TokenClaims = serde_json::from_slice(&bytes).ok()?;
    let k = claims.kubernetes?;
    let (name, uid) = k.pod.map(|p| (p.name, p.uid)).unwrap_or_default();
    Some((k.namespace, name, uid))
}

/// The identity from `env` (a variable's value, if set and not empty) and the pod's
/// `token` (if readable), the namespace defaulting to `default_namespace`. Each field:
/// its variable, else the token's claim; a name or UID found in neither is an error
/// naming the variable to set.
pub fn resolve(
    env: impl Fn(&str) -> Option<String>,
    token: Option<&str>,
    default_namespace: &str,
) -> Result<PodIdentity, Error> {
    let nonempty = |v: Option<String>| v.filter(|v| !v.is_empty());
    let var = |k: &str| nonempty(env(k));
    let (t_ns, t_name, t_uid) = token.and_then(token_pod).unwrap_or_default();
    Ok(PodIdentity {
        name: var("POD_NAME")
            .or(nonempty(t_name))
            .ok_or(Error::MissingIdentity("POD_NAME"))?,
        namespace: var("POD_NAMESPACE")
            .or(nonempty(t_ns))
            .unwrap_or_else(|| default_namespace.to_string()),
        uid: var("POD_UID")
            .or(nonempty(t_uid))
            .ok_or(Error::MissingIdentity("POD_UID"))?,
    })
}

/// This process's pod identity: [`resolve`] over the process environment and the
/// token at [`TOKEN_PATH`] (namespace defaulting to `default_namespace`).
pub fn from_pod(default_namespace: &str) -> Result<PodIdentity, Error> {
    let token = std::fs::read_to_string(TOKEN_PATH).ok();
    resolve(|k| std::env::var(k).ok(), token.as_deref(), default_namespace)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// A JWT with `payload` (its header and signature are not read).
    fn jwt(payload: &serde_json::Value) -> String {
        let enc = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        format!(
            "{}.{}.{}",
            enc(br#"{"alg":"RS256"}"#),
            enc(payload.to_string().as_bytes()),
            enc(b"sig")
        )
    }

    /// A bound token as the API server issues it for pod `name` (`uid`) in `ns`.
    fn bound(ns: &str, name: &str, uid: &str) -> String {
        jwt(&serde_json::json!({
            "aud": ["https://kubernetes.default.svc"],
            "kubernetes.io": {
                "namespace": ns,
                "pod": {"name": name, "uid": uid},
                "serviceaccount": {"name": "app", "uid": "sa-uid"}
            },
            "sub": format!("system:serviceaccount:{ns}:app")
        }))
    }

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    fn id(ns: &str, name: &str, uid: &str) -> PodIdentity {
        PodIdentity {
            name: name.into(),
            namespace: ns.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn a_bound_token_alone_names_the_pod() {
        let token = bound("team-a", "worker-7", "u-7");
        assert_eq!(
            resolve(env(&[]), Some(&token), "default").unwrap(),
            id("team-a", "worker-7", "u-7")
        );
    }

    #[test]
    fn explicit_variables_win_field_by_field() {
        let token = bound("team-a", "worker-7", "u-7");
        let e = env(&[("POD_NAME", "explicit"), ("POD_UID", ""), ("POD_NAMESPACE", "ns")]);
        // An empty variable counts as unset: the token's UID stands.
        assert_eq!(
            resolve(e, Some(&token), "default").unwrap(),
            id("ns", "explicit", "u-7")
        );
        let all = env(&[("POD_NAME", "n"), ("POD_UID", "u")]);
        assert_eq!(resolve(all, None, "default").unwrap(), id("default", "n", "u"));
    }

    #[test]
    fn a_token_without_pod_claims_leaves_the_variables_to_set() {
        // A legacy secret token: a JWT naming only its service account.
        let legacy = jwt(&serde_json::json!({
            "iss": "kubernetes/serviceaccount",
            "kubernetes.io/serviceaccount/namespace": "team-a",
            "sub": "system:serviceaccount:team-a:app"
        }));
        for token in [
            Some(legacy.as_str()),
            Some("not a jwt"),
            Some("a.%%%.c"),
            Some(""),
            None,
        ] {
            let err = resolve(env(&[]), token, "default").unwrap_err();
            assert!(matches!(err, Error::MissingIdentity("POD_NAME")), "{token:?}: {err}");
        }
        let err = resolve(env(&[("POD_NAME", "n")]), Some(&legacy), "default").unwrap_err();
        assert!(matches!(err, Error::MissingIdentity("POD_UID")), "{err}");
    }

    #[test]
    fn padding_and_whitespace_around_the_token_are_read_past() {
        let token = format!("{}==\n", bound("ns", "p", "u"));
        assert_eq!(resolve(env(&[]), Some(&token), "default").unwrap(), id("ns", "p", "u"));
    }

    proptest! {
        /// Whatever bytes the token file holds, reading it never panics, and an
        /// identity comes out only with a name and a UID that are not empty.
        #[test]
        fn any_token_file_is_read_without_panic(token in ".{0,200}", dots in prop::collection::vec(".{0,40}", 0..4)) {
            let joined = format!("{token}.{}", dots.join("."));
            for t in [token.as_str(), joined.as_str()] {
                if let Ok(i) = resolve(env(&[]), Some(t), "default") {
                    prop_assert!(!i.name.is_empty() && !i.uid.is_empty());
                }
            }
        }
    }
}
