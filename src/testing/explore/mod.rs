//! Exhaustive model checks that span modules (tests only): the whole claim protocol as
//! one state machine ([`system`]), and the etcd backend's controller side ([`etcd`]),
//! both explored by [`crate::testing::bfs`].

mod etcd;
mod system;
