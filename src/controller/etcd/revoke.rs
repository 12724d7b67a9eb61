//! How the controller takes claim keys away, written once against the I/O it names
//! ([`KeyIo`]), so that the controller that ships (`LiveKeys` in [`super`]) and the etcd
//! model (`testing::explore::etcd`) run the same steps in the same order.
//!
//! For each [`KeyAction`] the rules planned on the mirror's keys and the pod cache:
//! * a hold-back because the claim's pod is gone or replaced is confirmed first by a
//!   fresh read of the pod: the pod cache may lag behind a pod that made its claim just
//!   now, and revoking a live pod's claim would stop a healthy process;
//! * a deletion is one etcd Txn under the key's `mod_revision` as the mirror saw it;
//! * a hold-back grants a controller lease, moves the key onto it in one Txn under the
//!   key's `mod_revision` (a key gone or changed meanwhile is left alone, the lease
//!   given back), keeps that lease alive once (etcd counts its TTL from the grant, and
//!   the process may have renewed until the move landed: a move slower than the 2 s
//!   grace would end the hold-back before the process is certainly dead), and only
//!   then revokes the client's lease: revoking it first would delete the key, and the
//!   waiter behind would grant itself while the process of a force-deleted pod may
//!   still run.

use std::future::Future;

use crate::api::RevokeReason;
use crate::decide::{Action, ActionKind};
use crate::etcd::Error;
use crate::etcd::keys::ClaimValue;
use crate::etcd::rules::KeyAction;
use crate::mutant::{Mutant, on as mutant};

/// What taking keys away reads and writes: the pod API and the lock's etcd.
pub trait KeyIo {
    /// Read pod `pod` afresh (not from a cache): its UID, `None` when there is none.
    fn pod_uid(&self, pod: &str) -> impl Future<Output = Result<Option<String>, String>> + Send;
    /// Grant a controller lease of `ttl_seconds`: its ID.
    fn grant_lease(&self, key: &str, ttl_seconds: i64) -> impl Future<Output = Result<i64, Error>> + Send;
    /// Keep lease `id` alive once: its TTL counts afresh from now.
    fn keep_alive(&self, key: &str, id: i64) -> impl Future<Output = Result<(), Error>> + Send;
    /// Revoke lease `id` (its keys go with it).
    fn revoke_lease(&self, key: &str, id: i64) -> impl Future<Output = Result<(), Error>> + Send;
    /// Delete `key` if its mod revision is `if_revision` (any, when `None`): whether it did.
    fn delete(&self, key: &str, if_revision: Option<i64>) -> impl Future<Output = Result<bool, Error>> + Send;
    /// Put `value` at `key` on lease `lease` if its mod revision is `if_revision` (any,
    /// when `None`, creating it if it is gone): whether it did.
    fn put(
        &self,
        key: &str,
        if_revision: Option<i64>,
        value: &ClaimValue,
        lease: i64,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
}

/// What taking keys away did.
#[derive(Debug, Default)]
pub struct Taken {
    /// The revocations to publish (as the decide core's actions).
    pub events: Vec<Action>,
    /// A pod could not be read: look at the lock again soon.
    pub retry: bool,
    /// The etcd request that failed, if one did: the actions after it were not tried
    /// (the ones before it were done, and their events are above).
    pub failed: Option<Error>,
}

/// Carry out `actions` in order (see the module docs), up to the first etcd request
/// that fails.
pub async fn take_away(io: &impl KeyIo, actions: Vec<KeyAction>) -> Taken {
    let mut taken = Taken::default();
    for a in actions {
        match confirmed(io, &a).await {
            Some(true) => {}
            Some(false) => continue,
            None => {
                taken.retry = true;
                continue;
            }
        }
        match take_one(io, &a).await {
            Ok(Some(event)) => taken.events.push(event),
            Ok(None) => {}
            Err(e) => {
                taken.failed = Some(e);
                break;
            }
        }
    }
    taken
}

/// Whether `a` may go ahead: a pod judged gone or replaced on the pod cache's word is
/// read afresh first. `None`: the read failed; look again soon.
async fn confirmed(io: &impl KeyIo, a: &KeyAction) -> Option<bool> {
    let KeyAction::HoldBack { value, reason, .. } = a else {
        return Some(true);
    };
    let on_cache_word = matches!(reason, RevokeReason::PodGone | RevokeReason::PodReplaced);
    if !on_cache_word || value.pod.is_empty() || mutant(Mutant::EtcdHoldBackWithoutFreshRead) {
        return Some(true);
    }
    match io.pod_uid(&value.pod).await {
        Ok(Some(uid)) if uid == value.pod_uid => {
            tracing::info!(
                pod = value.pod,
                "the pod cache lags: the claim's pod is there; not revoking"
            );
            Some(false)
        }
        Ok(_) => Some(true),
        Err(e) => {
            tracing::warn!(
                pod = value.pod,
                error = e,
                "confirming a pod gone failed; not revoking yet"
            );
            None
        }
    }
}

/// Take one key away: delete it, or move it onto a fresh controller lease and revoke
/// the client's (each only if the key is unchanged). Returns the event to publish.
async fn take_one(io: &impl KeyIo, a: &KeyAction) -> Result<Option<Action>, Error> {
    let guard = |rev: i64| (!mutant(Mutant::EtcdWriteWithoutRevision)).then_some(rev);
    match a {
        KeyAction::Delete {
            key,
            claim,
            mod_revision,
            reason,
        } => {
            let deleted = io.delete(key, guard(*mod_revision)).await?;
            tracing::info!(claim, ?reason, deleted, "deleting the claim key of a stopped pod");
            Ok(None)
        }
        KeyAction::HoldBack {
            key,
            claim,
            mod_revision,
            client_lease,
            create_revision,
            ttl_seconds,
            value,
            reason,
        } => {
            let first = *client_lease != 0 && mutant(Mutant::EtcdClientLeaseRevokedFirst);
            if first {
                io.revoke_lease(key, *client_lease).await?;
            }
            let lease = io.grant_lease(key, *ttl_seconds).await?;
            if !io.put(key, guard(*mod_revision), value, lease).await? {
                let _ = io.revoke_lease(key, lease).await; // the key changed meanwhile: look again
                return Ok(None);
            }
            if !mutant(Mutant::EtcdNoKeepAliveAfterMove) {
                io.keep_alive(key, lease).await?;
            }
            tracing::warn!(
                claim,
                ?reason,
                ttl_seconds,
                "held back the claim key of a pod that may still run"
            );
            if *client_lease != 0
                && !first
                && let Err(e) = io.revoke_lease(key, *client_lease).await
            {
                tracing::debug!(claim, error = %e, "revoking the client's lease failed (it learns at its next renewal)");
            }
            Ok(Some(Action::new(
                claim,
                &value.pod,
                ActionKind::Revoked(*create_revision, *reason),
            )))
        }
    }
}
