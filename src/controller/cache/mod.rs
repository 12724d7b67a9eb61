//! What the controller has seen, shared by every backend: the slim pod cache, its own
//! status writes and claim deletions not yet shown by the watches, the memory of relists,
//! and the tracker of renewals and pod stops on the controller's monotonic clock.

pub(crate) mod pods;
pub(crate) mod relisted;
pub(crate) mod tracker;
pub(crate) mod written;
