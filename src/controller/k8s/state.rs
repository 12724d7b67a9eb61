//! What the Kubernetes backend keeps between reconciles: the claim cache and index,
//! the claims deleted but not yet let go, the sweeper of released claims, the release
//! notices, and the URL published for them.

use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::Store;

use crate::controller::k8s::claims::ClaimIndex;
use crate::controller::k8s::notices::Notices;
use crate::controller::k8s::sweep::{Sweeper, Tombstones};

/// The Kubernetes backend's state (see the module docs).
pub struct State {
    /// Claim Leases (those labelled `leasehold.dev/lock`).
    pub leases: Store<Lease>,
    /// The claims by lock and by pod.
    pub claims: Arc<ClaimIndex>,
    /// Claims deleted after they were seen released, until their lock's status lets
    /// them go.
    pub tombstones: Arc<Tombstones>,
    /// Deletes released claims in batches.
    pub sweeper: Arc<Sweeper>,
    /// The release notices taken over HTTP.
    pub notices: Arc<Notices>,
    /// Where this replica takes release notices, published in the statuses it writes.
    pub release_url: Option<String>,
}
