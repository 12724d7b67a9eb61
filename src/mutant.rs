//! Bugs this project once had (or a change could put in), each behind a switch that is
//! always off outside `cargo test`: the exhaustive explorers' mutation tests (`decide::explore`,
//! `explore::system`) put them back one at a time and must find each.

/// One bug put back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) enum Mutant {
    /// A pod object gone is taken as its processes stopped (no kubelet report needed).
    PodGoneAsStopped,
    /// A forged release mark counts as the owner's release.
    ForgedAsReleased,
    /// A claim deleted by someone else frees its holder's slot at once.
    DeletedClaimFreesAtOnce,
    /// A designated successor that may have been told of its grant is dropped like a
    /// waiter, not held back like a holder.
    SuccessorNotFenced,
    /// A deleted lock is let go while a revoked holder's slot is still held back.
    LetGoWithSlotHeldBack,
    /// A re-created lock's tokens start afresh, not above the old lock's.
    NoTokenEpoch,
    /// New claims are queued in reverse arrival order.
    LifoQueue,
    /// A revoked holder's slot (its etcd key, on the etcd backend) is held back by the
    /// lock's current lease, not the longer one its claim stated at its grant.
    HoldBackBySpecLease,
    /// A grant records the lease its claim states at that moment (a neighbour may have
    /// patched it down), not the longest recorded while it waited.
    LeaseAsPatchedAtGrant,
    /// A granted waiter counts how long it may act from its last waiting renewal by its
    /// wait lease, not by its lease.
    WaiterActsOnWaitRenewal,
    /// The controller deletes a claim it judged expired without reading it afresh and
    /// deleting under that read's resourceVersion (on its cache's word).
    ExpiryWithoutFreshRead,
    /// A claim stating no lease is queued (recorded without one), and its client accepts
    /// a waiter's record without a lease (as from an older controller): the lock's lease
    /// then judges a process that lives by a longer one.
    QueuedWithoutLease,
    /// A new claim stamped with a fencing token below the epoch is taken as an earlier
    /// incarnation's holder: it skips the queue and holds a slot back for its lease.
    StampTrusted,
    /// The controller writes a lock's status without the resourceVersion it read as a
    /// precondition (over whatever was written since).
    StatusWithoutVersion,
    /// The controller takes a revoked holder's claim out of view as gone on its cache's
    /// word, neither reading nor deleting it (its holder may renew it on).
    StrayWithoutRead,
    /// The controller tells every claim its plan grants of its grant before the status
    /// write, not only the successor the stored status designates.
    DirectGrantBeforeStored,
    /// The etcd controller holds back the key of a pod its cache shows gone or replaced
    /// without reading the pod afresh (a pod that claimed just now loses its claim).
    EtcdHoldBackWithoutFreshRead,
    /// The etcd controller deletes or moves a key without its mod revision as the Txn's
    /// condition (a key gone meanwhile is made up again, on the controller's lease).
    EtcdWriteWithoutRevision,
    /// The etcd controller revokes the client's lease before moving the key onto its
    /// own: the key goes with the lease, and the waiter behind grants itself.
    EtcdClientLeaseRevokedFirst,
    /// A designated successor takes any release mark on the one holder's claim as its
    /// grant, not only one that opens the recorded hash (so a neighbour's forged mark
    /// lets it act beside the holder).
    HandoverByAnyMark,
    /// The controller tells a designated successor of its grant before the status write
    /// while other holders keep their slots, by the `maxHolders` its cache shows (the
    /// user may have lowered it since).
    DirectGrantBesideHolders,
    /// A client accepts a record of a lease longer than the one it wrote (its claim's
    /// lease raised before the lock recorded it): once its process dies, the lock holds
    /// its slot back that long, an hour for a neighbour's raise.
    RecordLongerLease,
    /// An invalid claim the status does not record gets only an event, not a refusal:
    /// a claim changed (its pod UID, say) after its client read it back at its notice
    /// time and before the lock placed it leaves the client waiting for ever.
    InvalidClaimUnlisted,
    /// The etcd controller moves a held-back key onto a lease it granted and keeps that
    /// lease alive no more: etcd counts its TTL from the grant, so a move that lands
    /// late (a slow disk) ends the hold-back before a process that renewed until the
    /// move is certainly dead.
    EtcdNoKeepAliveAfterMove,
}

#[cfg_attr(not(test), allow(dead_code))]
impl Mutant {
    /// Every mutant, in the order they were added.
    pub(crate) const ALL: [Mutant; 24] = [
        Mutant::PodGoneAsStopped,
        Mutant::ForgedAsReleased,
        Mutant::DeletedClaimFreesAtOnce,
        Mutant::SuccessorNotFenced,
        Mutant::LetGoWithSlotHeldBack,
        Mutant::NoTokenEpoch,
        Mutant::LifoQueue,
        Mutant::HoldBackBySpecLease,
        Mutant::LeaseAsPatchedAtGrant,
        Mutant::WaiterActsOnWaitRenewal,
        Mutant::ExpiryWithoutFreshRead,
        Mutant::QueuedWithoutLease,
        Mutant::StampTrusted,
        Mutant::StatusWithoutVersion,
        Mutant::StrayWithoutRead,
        Mutant::DirectGrantBeforeStored,
        Mutant::EtcdHoldBackWithoutFreshRead,
        Mutant::EtcdWriteWithoutRevision,
        Mutant::EtcdClientLeaseRevokedFirst,
        Mutant::HandoverByAnyMark,
        Mutant::DirectGrantBesideHolders,
        Mutant::RecordLongerLease,
        Mutant::InvalidClaimUnlisted,
        Mutant::EtcdNoKeepAliveAfterMove,
    ];

    /// Whether the decide core's world model (`decide::explore`) can show it; the
    /// others need time, records or a neighbour's patches, which only the system model
    /// (`explore::system`) has.
    pub(crate) fn in_decide_model(self) -> bool {
        !matches!(
            self,
            Mutant::HoldBackBySpecLease
                | Mutant::LeaseAsPatchedAtGrant
                | Mutant::WaiterActsOnWaitRenewal
                | Mutant::ExpiryWithoutFreshRead
                | Mutant::QueuedWithoutLease
                | Mutant::StampTrusted
                | Mutant::StatusWithoutVersion
                | Mutant::StrayWithoutRead
                | Mutant::DirectGrantBeforeStored
                | Mutant::EtcdHoldBackWithoutFreshRead
                | Mutant::EtcdWriteWithoutRevision
                | Mutant::EtcdClientLeaseRevokedFirst
                | Mutant::HandoverByAnyMark
                | Mutant::DirectGrantBesideHolders
                | Mutant::RecordLongerLease
                | Mutant::InvalidClaimUnlisted
                | Mutant::EtcdNoKeepAliveAfterMove
        )
    }
}

#[cfg(test)]
thread_local! {
    static ON: std::cell::Cell<Option<Mutant>> = const { std::cell::Cell::new(None) };
}

/// Put `m` back (tests only) until the returned guard goes.
#[cfg(test)]
pub(crate) fn mutate(m: Mutant) -> impl Drop {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            ON.with(|c| c.set(None));
        }
    }
    ON.with(|c| c.set(Some(m)));
    Restore
}

/// Whether mutant `m` is on: never outside `cargo test`.
#[inline]
pub(crate) fn on(m: Mutant) -> bool {
    #[cfg(test)]
    return ON.with(|c| c.get() == Some(m));
    #[cfg(not(test))]
    {
        let _ = m;
        false
    }
}
