//! The `DistributedLock` custom resource (`leasehold.dev/v1alpha1`). The claim Leases
//! that ask for it are described in [`crate::protocol`].
//!
//! Doc comments on the fields below become the CRD's schema descriptions, so they are
//! what `kubectl explain distributedlock.spec` prints.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of leasehold's resources.
pub const GROUP: &str = "leasehold.dev";
/// Default `spec.leaseDurationSeconds`.
pub const DEFAULT_LEASE_DURATION_SECONDS: i32 = 15;
/// Default `spec.maxHolders`.
pub const DEFAULT_MAX_HOLDERS: i32 = 1;

/// A lock that pods acquire in FIFO order, each grant carrying a fencing token.
#[allow(clippy::duplicated_attributes)] // printcolumn entries legitimately repeat `type_`
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "leasehold.dev",
    version = "v1alpha1",
    kind = "DistributedLock",
    namespaced,
    status = "DistributedLockStatus",
    shortname = "dlock",
    category = "leasehold",
    derive = "PartialEq",
    doc = "A fair (FIFO), fenced distributed lock for pods. Pods ask for it with claim Leases labelled leasehold.dev/lock=<name>; the controller grants it in arrival order and gives every grant a strictly increasing fencing token.",
    printcolumn(
        name = "Holder",
        type_ = "string",
        description = "Pod of the first holder",
        json_path = ".status.holders[0].pod"
    ),
    printcolumn(
        name = "Queue",
        type_ = "integer",
        description = "Number of waiting claims",
        json_path = ".status.queueLength"
    ),
    printcolumn(
        name = "Token",
        type_ = "integer",
        description = "Last fencing token issued",
        json_path = ".status.fencingToken"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        description = "Whether the controller reconciles the lock and accepts its claims",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "Holders",
        type_ = "string",
        description = "Pods of every holder (kubectl get -o wide)",
        json_path = ".status.holders[*].pod",
        priority = "1"
    ),
    printcolumn(
        name = "Max",
        type_ = "integer",
        description = "How many may hold at once (spec.maxHolders)",
        json_path = ".spec.maxHolders",
        priority = "1"
    ),
    printcolumn(
        name = "Successor",
        type_ = "string",
        description = "The waiter that takes the next slot to free (kubectl get -o wide)",
        json_path = ".status.successor.claim",
        priority = "1"
    ),
    printcolumn(
        name = "Refused",
        type_ = "string",
        description = "Claims not queued, and why (status.refused)",
        json_path = ".status.refused[*].reason",
        priority = "1"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct DistributedLockSpec {
    /// How long, in seconds, a claim stays valid without renewal. Holders renew about
    /// every third of it and stop their work a quarter of it (at least 250 ms) before it
    /// runs out; the controller revokes a grant whose claim was not renewed for this long
    /// (plus 2 s), counted from no earlier than the grant. Waiting claims live by the
    /// longer of this and 180 s, renewed every third of that (once a minute). Short leases hand over faster after a crash but leave clients little
    /// room for a slow API server: at 1 s a renewal must answer within 333 ms, at 3 s
    /// within 1 s. Default 15.
    #[serde(default = "default_lease_duration_seconds")]
    #[schemars(range(min = 1, max = 3600))]
    pub lease_duration_seconds: i32,

    /// How many claims may hold the lock at once: 1 makes a mutex, more a counting
    /// semaphore. Lowering it revokes no one; new grants wait until fewer hold it. On the
    /// etcd backend a raise reaches a claim already waiting only when it claims anew.
    /// Default 1.
    #[serde(default = "default_max_holders")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_holders: i32,

    /// How many claims may wait at most (the designated successor included). A claim
    /// beyond it is not queued: the status lists it under `refused` with reason
    /// `QueueFull`, and its client gives up with that reason. Bounds the status object
    /// (about 250 bytes a waiter). Lowering it drops no one already waiting. Default 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4000))]
    pub max_queue: Option<i32>,

    /// Where the lock's claims live. Omitted: claim Leases on the Kubernetes API server,
    /// granted by the controller. `etcd`: keys in an etcd cluster the pods reach
    /// directly, granted in etcd's own order; the controller mirrors them into status.
    /// Do not change the backend of a lock in use, nor its etcd endpoints or key prefix:
    /// the holders under the old location are not fenced from those under the new, and
    /// their fencing tokens are not comparable (re-create the lock under a new name
    /// instead).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
}

/// The store a lock's claims live in.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Backend {
    /// Keep the claims in etcd: each claim is a key under a lease its process keeps
    /// alive, granted in creation order; the fencing token is the key's create
    /// revision (strictly increasing, but not 1, 2, 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdBackend>,
}

/// Default `spec.backend.etcd.keyPrefix`.
pub const DEFAULT_ETCD_KEY_PREFIX: &str = "/leasehold";

/// An etcd cluster holding a lock's claims.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackend {
    /// The etcd client URLs (`https://host:2379`, or `http://` without TLS), reached
    /// by the pods that lock and by the controller.
    #[schemars(length(min = 1))]
    pub endpoints: Vec<String>,
    /// The key prefix under which claims live, as
    /// `<keyPrefix>/<namespace>/<lock>/<claim>`. Default `/leasehold`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_prefix: Option<String>,
    /// A Secret in the lock's namespace with `ca.crt`, `tls.crt` and `tls.key` for
    /// etcd's TLS. The controller reads it through the API; pods that lock mount it at
    /// `/var/run/secrets/leasehold.dev/etcd` (or where `LEASEHOLD_ETCD_TLS_DIR` says).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_secret_ref: Option<SecretRef>,
}

impl EtcdBackend {
    /// The key prefix, default applied, without a trailing `/`.
    pub fn prefix(&self) -> &str {
        let p = self.key_prefix.as_deref().unwrap_or(DEFAULT_ETCD_KEY_PREFIX);
        p.trim_end_matches('/')
    }
}

/// A reference to a Secret in the same namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretRef {
    /// The Secret's name.
    pub name: String,
}

impl DistributedLockSpec {
    /// The etcd backend, when the lock's claims live in etcd.
    pub fn etcd(&self) -> Option<&EtcdBackend> {
        self.backend.as_ref().and_then(|b| b.etcd.as_ref())
    }
}

fn default_lease_duration_seconds() -> i32 {
    DEFAULT_LEASE_DURATION_SECONDS
}

fn default_max_holders() -> i32 {
    DEFAULT_MAX_HOLDERS
}

impl Default for DistributedLockSpec {
    fn default() -> Self {
        Self {
            lease_duration_seconds: DEFAULT_LEASE_DURATION_SECONDS,
            max_holders: DEFAULT_MAX_HOLDERS,
            max_queue: None,
            backend: None,
        }
    }
}

/// What the controller has granted, and who waits. Written only by the controller.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DistributedLockStatus {
    /// The claims holding the lock now, oldest grant first. An entry with `revoked` set
    /// lost its grant but still occupies its slot until its process has certainly stopped.
    #[serde(default)]
    pub holders: Vec<Holder>,

    /// The claims waiting for the lock, in the order they will be granted (first come,
    /// first served).
    #[serde(default)]
    pub queue: Vec<Waiter>,

    /// The number of entries in `queue`.
    #[serde(default)]
    pub queue_length: i32,

    /// The waiter that takes the next slot to free, with the fencing token reserved for
    /// it: set while every slot is occupied and someone waits, and always the head of
    /// `queue`. When a holder releases, the controller may tell this waiter directly
    /// that the slot is its own (a grant signed with `grantKey`) before it writes the
    /// status that lists it as a holder. So a successor is fenced like a holder: the
    /// next freed slot goes to it alone, and it leaves this place only by that grant,
    /// by withdrawing, or once its process has certainly stopped; one whose pod is gone
    /// without that certainty keeps a slot held back like a revoked holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successor: Option<Successor>,

    /// The public half of the Ed25519 key with which the controller that last wrote
    /// this status signs direct grants to the successor (hex). A waiter trusts a direct
    /// grant only when it verifies against this key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant_key: Option<String>,

    /// The last fencing token issued or reserved for the successor. It never decreases
    /// and no token is issued twice.
    #[serde(default)]
    pub fencing_token: i64,

    /// This lock's tokens are this epoch plus a count of grants. The controller takes it,
    /// once, from the clock (microseconds since 1970, and at least the lock's creation
    /// time) when it first sees the lock, so a lock deleted and re-created under the same
    /// name issues tokens above every token of the old one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token_epoch: Option<i64>,

    /// Claims the controller does not queue, each with why (at most 16, in arrival
    /// order): a client that finds its claim here gives up with that reason instead of
    /// waiting. `QueueFull` when `spec.maxQueue` claims wait already; the pod reasons when the claim
    /// names no live pod with its UID (a pod the controller has not seen yet may be listed
    /// for a moment, so clients give up on those only after 5 s).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<Refusal>,

    /// The `metadata.generation` of the spec this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Where the controller that last wrote this status takes release notices
    /// (`http://host:port`; it serves them at `/v1/release`). A holder releasing its
    /// grant tells the controller there first, which passes the slot on without waiting
    /// for the claim's release mark to be written and watched; if the notice is not
    /// answered as written, the holder marks its claim released as usual. Absent: the
    /// controller takes no notices, and holders release through their claim alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_url: Option<String>,

    /// Standard conditions, one per type. `Ready` is True while the controller
    /// reconciles this lock and accepts all its claims; False with the reason when the
    /// lock is deleted but waits for a held-back slot (`Deleting`: the message names the
    /// pods whose processes may still run), no claim can name the lock
    /// (`NameTooLong`), claims were rejected (`ClaimsRejected`: see the lock's Warning
    /// events) or its etcd cannot be reached (`EtcdUnavailable`).
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// One claim holding the lock.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    /// Name of the claim Lease that holds the lock.
    pub claim: String,
    /// Name of the pod whose process made the claim.
    pub pod: String,
    /// UID of that pod.
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    /// The fencing token of this grant: pass it to every resource the lock protects,
    /// which should reject requests carrying a lower token than it has seen.
    pub fencing_token: i64,
    /// When the grant was made (the controller's clock; informational).
    pub granted_at: Time,
    /// The lease the holder's process lives by, as its claim stated at the grant. A
    /// revoked holder's slot is held back for the longer of this and the lock's lease,
    /// so editing the lock cannot shorten the wait for a holder granted under a longer one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration_seconds: Option<i32>,
    /// The SHA-256 hash of the claim's release secret, recorded when the claim was first
    /// queued: only a release mark with the matching secret frees the slot at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_hash: Option<String>,
    /// Set only while a revoked holder's slot is held back: its grant was taken away
    /// (its claim deleted or forged, its pod force-deleted, or its lock deleted) while
    /// its process may run on, so the slot passes on once the holder releases, its pod
    /// is seen stopped, or one lease duration has passed without a renewal of its
    /// claim, by when the holder has stopped itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked: Option<Revocation>,
}

/// A claim the controller does not queue.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Refusal {
    /// Name of the claim Lease.
    pub claim: String,
    /// Why it is not queued.
    pub reason: RefuseReason,
}

/// Why a claim is not queued.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum RefuseReason {
    /// No pod of the name the claim gives is known.
    PodNotFound,
    /// The pod of that name has another UID than the claim states.
    PodUidMismatch,
    /// The pod has already finished.
    PodFinished,
    /// As many claims wait as the lock queues (`spec.maxQueue`, default 1000), or the
    /// waiters' entries fill the status's byte budget.
    QueueFull,
    /// The claim states no positive `spec.leaseDurationSeconds`: its process wrote one,
    /// so someone else removed it before the lock recorded the claim (the client then
    /// withdraws the claim and claims anew).
    LeaseMissing,
    /// The claim no longer names its pod as its process wrote it (its holder, its
    /// `leasehold.dev/pod-uid`, the Pod owner reference that matches both) or carries a
    /// malformed hash: changed by someone who may patch Leases before the lock recorded
    /// it (the client then withdraws the claim and claims anew).
    InvalidClaim,
    /// A reason this release does not know: written by a newer controller, read by an
    /// older client or replica (which take it as a passing reason, not a final one).
    /// Never written for a reason of its own.
    #[serde(other)]
    Unknown,
}

impl RefuseReason {
    /// The reason as written in status, events and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PodNotFound => "PodNotFound",
            Self::PodUidMismatch => "PodUidMismatch",
            Self::PodFinished => "PodFinished",
            Self::QueueFull => "QueueFull",
            Self::LeaseMissing => "LeaseMissing",
            Self::InvalidClaim => "InvalidClaim",
            Self::Unknown => "Unknown",
        }
    }

    /// What a user should know about it.
    pub fn message(self) -> &'static str {
        match self {
            Self::PodNotFound => "no pod of the name the claim gives (POD_NAME) exists in the lock's namespace",
            Self::PodUidMismatch => "the pod of that name has another UID than the claim gives (POD_UID)",
            Self::PodFinished => "the claim's pod has already finished",
            Self::QueueFull => "the lock's queue is full (spec.maxQueue claims wait): try again later",
            Self::LeaseMissing => {
                "the claim states no positive spec.leaseDurationSeconds (removed by someone who may patch Leases)"
            }
            Self::InvalidClaim => {
                "the claim does not name its pod as a client writes it (changed by someone who may patch Leases)"
            }
            Self::Unknown => "a reason a newer controller gives (see the Warning events of the claim's Lease)",
        }
    }

    /// Whether a client should give up at once: a full queue is no passing state of the
    /// controller's caches, while the pod reasons may be (a pod it has not seen yet).
    pub fn is_final(self) -> bool {
        self == Self::QueueFull
    }
}

/// Why and when a holder's grant was revoked while its slot is held back.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Revocation {
    /// Why the grant was revoked.
    pub reason: RevokeReason,
    /// When the controller revoked it (its clock; informational).
    pub at: Time,
}

/// Why a grant was revoked.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum RevokeReason {
    /// The holder's Pod object is gone (its slot is held back unless the kubelet
    /// reported its containers stopped, or its claim expired).
    PodGone,
    /// The holder's pod was replaced by another pod of the same name (another UID).
    PodReplaced,
    /// The holder's pod reached phase Succeeded or Failed.
    PodFinished,
    /// The holder's claim was not renewed within its lease duration plus a grace.
    Expired,
    /// Someone other than the holder deleted its claim, or wrote a release mark without
    /// its secret, while its pod lives.
    ForceReleased,
    /// The lock is being deleted: every grant is revoked, and the lock goes once no
    /// holder's process may still run.
    LockDeleted,
    /// A reason this release does not know: written by a newer controller, read by an
    /// older client (its grant is revoked all the same) or replica. Never written for a
    /// reason of its own.
    #[serde(other)]
    Unknown,
}

impl RevokeReason {
    /// The reason as written in status, events and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PodGone => "PodGone",
            Self::PodReplaced => "PodReplaced",
            Self::PodFinished => "PodFinished",
            Self::Expired => "Expired",
            Self::ForceReleased => "ForceReleased",
            Self::LockDeleted => "LockDeleted",
            Self::Unknown => "Unknown",
        }
    }
}

/// The waiter designated to take the next slot to free.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Successor {
    /// Name of the designated claim Lease (the head of the queue).
    pub claim: String,
    /// The fencing token reserved for its grant. Counted in `fencingToken`; if the
    /// successor leaves without the grant, its token is never issued.
    pub fencing_token: i64,
    /// The lease its process lives by, as its claim stated when it was designated: if
    /// it may have been told of its grant and its claim is then gone, its slot is held
    /// back for the longer of this and the lock's lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration_seconds: Option<i32>,
}

/// One claim waiting for the lock.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Waiter {
    /// Name of the waiting claim Lease.
    pub claim: String,
    /// Name of the pod whose process made the claim.
    pub pod: String,
    /// UID of that pod.
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    /// When the controller first queued the claim (its clock; informational).
    pub requested_at: Time,
    /// The SHA-256 hash of the claim's release secret, recorded when it was queued.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_hash: Option<String>,
    /// The lease its process lives by, as its claim stated when it was first queued.
    /// Never lowered afterwards (a neighbour patching the claim down cannot shorten the
    /// lease its grant records), and checked by the client before it acts on its grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration_seconds: Option<i32>,
    /// The SHA-256 hash of the claim owner's wait proof, recorded when it was queued:
    /// only the owner may wait for the claim's direct grant at the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_hash: Option<String>,
}
