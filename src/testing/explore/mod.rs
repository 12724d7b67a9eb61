//! Exhaustive model checks that span modules (tests only): the whole claim protocol as
//! one state machine ([`system`]), explored by [`crate::testing::bfs`].

mod system;
