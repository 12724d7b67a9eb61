//! The test machinery, in one place: what checks the shipped code without being part of
//! what it does.
//!
//! - `bfs`: the breadth-first explorer the exhaustive models share (tests only);
//! - `explore`: the whole claim protocol as one state machine, around the controller's
//!   own turn, and the etcd backend's controller side (tests only);
//! - `mock_api`: request-shape mocks of the API server for unit tests (tests only);
//! - [`check`]: the critical-section log checker (`leasehold check-log`, the integration
//!   tests, the e2e scripts);
//! - `spawn_for_process`, `proxy`, `scale`: a local control plane per test binary,
//!   a fault-injecting proxy and the scale workload, for the integration tests, the
//!   benches and the soak (the `cli` feature);
//! - `tidy`: the house rules as a test (tests only).
//!
//! Not here: `crate::mutant`, the switches that put past bugs back for the mutation
//! tests. Shipped code consults them, so they stay a leaf at the bottom of the import
//! order; everything here sits above the code it drives. Below it, only test modules
//! (`#[cfg(test)]`) of shipped files import from here (`mock_api`, `bfs`); above it, the
//! binary's `check-log` uses `check`.

#[cfg(test)]
pub(crate) mod bfs;
pub mod check;
#[cfg(all(test, feature = "controller"))]
mod explore;
#[cfg(feature = "cli")]
mod harness;
#[cfg(all(test, feature = "client"))]
pub(crate) mod mock_api;
#[cfg(feature = "cli")]
pub mod proxy;
#[cfg(feature = "cli")]
pub mod scale;
#[cfg(test)]
mod tidy;

#[cfg(feature = "cli")]
pub use harness::spawn_for_process;
