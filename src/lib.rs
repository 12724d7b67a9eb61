//! leasehold: fair (FIFO), fenced distributed locks for Kubernetes pods.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod check;
pub mod claim;
pub mod cli;
pub mod client;
pub mod controller;
pub mod crd;
pub mod decide;
pub mod dev;
pub mod guard;
pub mod telemetry;
