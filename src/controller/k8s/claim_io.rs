//! What looking claims up by name takes ([`ClaimIo`]): a clock, the controller's memory
//! on it, and the API server's reads and deletes of claims. Both a turn
//! ([`super::turn::TurnIo`] extends it) and the look-up of strays ([`super::strays`])
//! work through it.

use std::future::Future;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::DeleteParams;

use crate::controller::cache::tracker::Tracker;
use crate::protocol::timing::Moment;

/// Claims read and deleted by name, and the memory they feed, on the clock
/// [`ClaimIo::Moment`].
pub trait ClaimIo: Sync {
    /// The clock of the controller's memory.
    type Moment: Moment;
    /// Now.
    fn now(&self) -> Self::Moment;
    /// Work on the controller's memory.
    fn tracker<R>(&self, f: impl FnOnce(&mut Tracker<Self::Moment>) -> R) -> R;
    /// Read claim `name` afresh (a quorum read).
    fn read_claim(&self, ns: &str, name: &str) -> impl Future<Output = Result<Option<Lease>, kube::Error>> + Send;
    /// Delete claim `name` (with `params`' preconditions).
    fn delete_claim(
        &self,
        ns: &str,
        name: &str,
        params: DeleteParams,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;
}
