//! Exhaustive exploration of the decide core's world model (the property test's
//! `Model`, with the real [`super::decide`] inside): from the empty lock, every sequence
//! of events up to a depth, breadth first, each distinct state once, every rule checked
//! after every decision (mutual exclusion against processes that may still run, tokens
//! strictly increasing across deletion and re-creation, grants and the queue in arrival
//! order, no live waiter lost, a running process's slot never freed, idempotence). Where
//! the property test samples random histories, this covers every interleaving within
//! the bound; a violation fails with the shortest event trace that reaches it.
//!
//! The bound of `cargo test` is [`CI`]; a larger one runs by hand:
//! `LEASEHOLD_EXPLORE=pods,claims,max_holders,depth cargo test --features cli --lib explore -- --nocapture`.

use std::panic::catch_unwind;

use super::proptests::{Event, Model};
use crate::testing::bfs::{Covered, Machine, explore as bfs};

/// How far to explore.
#[derive(Clone, Copy, Debug)]
struct Bound {
    pods: usize,
    claims: usize,
    max_holders: i32,
    depth: usize,
}

/// The bound `cargo test` explores.
const CI: Bound = Bound {
    pods: 2,
    claims: 3,
    max_holders: 2,
    depth: 6,
};

/// The world model within a bound, as a machine to explore.
#[derive(Clone)]
struct Bounded(Model, Bound);

impl Machine for Bounded {
    type Step = Event;
    fn steps(&self) -> Vec<Event> {
        let Bounded(model, b) = self;
        model.enabled(b.pods, b.claims, b.max_holders)
    }
    fn take(&mut self, e: &Event) {
        self.0.apply(e);
    }
    fn key(&self) -> String {
        self.0.key()
    }
}

/// Explore every state within `bound`; panics with the trace of the first violation.
fn explore(bound: Bound) -> Covered {
    bfs(Bounded(Model::new(), bound), bound.depth).unwrap_or_else(|found| panic!("{found}"))
}

/// The bound from `LEASEHOLD_EXPLORE` (pods,claims,max_holders,depth), else [`CI`].
fn bound() -> Bound {
    let Ok(spec) = std::env::var("LEASEHOLD_EXPLORE") else {
        return CI;
    };
    let n: Vec<usize> = spec.split(',').map(|v| v.trim().parse().expect("a number")).collect();
    assert_eq!(n.len(), 4, "LEASEHOLD_EXPLORE=pods,claims,max_holders,depth");
    assert!(
        n[0] <= super::proptests::PODS,
        "at most {} pods",
        super::proptests::PODS
    );
    Bound {
        pods: n[0],
        claims: n[1],
        max_holders: n[2] as i32,
        depth: n[3],
    }
}

#[test]
fn every_interleaving_within_the_bound_keeps_every_rule() {
    let bound = bound();
    let covered = explore(bound);
    println!(
        "explored {bound:?}: {} states, {} transitions, depth {}, {:.1} s",
        covered.states, covered.transitions, covered.depth, covered.secs
    );
    assert!(covered.states > 1000, "the bound explores too little: {covered:?}");
}

/// The bound of the mutation test: narrower than [`CI`] (one slot), deeper (a lock
/// deleted, let go and re-created takes seven events).
const MUTANTS: Bound = Bound {
    pods: 2,
    claims: 2,
    max_holders: 1,
    depth: 7,
};

#[test]
fn the_explorer_finds_each_bug_put_back_with_its_trace() {
    use crate::mutant::{Mutant, mutate};
    let bugs = Mutant::ALL.into_iter().filter(|m| m.in_decide_model());
    for bug in bugs {
        let _on = mutate(bug);
        let found = catch_unwind(|| explore(MUTANTS));
        let Err(panic) = found else {
            panic!("{bug:?} was put back and the explorer found nothing within {MUTANTS:?}");
        };
        let why = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(why.contains("trace:\n   1. "), "{bug:?}: no trace in {why:?}");
        println!("{bug:?} found:\n{why}\n");
    }
}
