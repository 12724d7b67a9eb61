//! Integration tests against a real kube-apiserver, etcd and kube-controller-manager
//! started on loopback by `leasehold dev` (one control plane for this test binary).
//!
//! The binaries come from `scripts/provision-k8s.sh` (run by `scripts/test.sh`).

mod admission;
mod chart;
mod cli;
mod client;
mod conformance;
mod controller;
mod corpus;
mod etcd;
mod examples;
mod flood;
mod ha;
mod harness;
mod library;
mod neighbour;
mod notice;
mod outage;
mod scale;
mod smoke;
mod support;
