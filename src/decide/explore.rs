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
//! `LEASEHOLD_EXPLORE=pods,claims,max_holders,depth cargo test --lib explore -- --nocapture`.

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

use super::proptests::{Event, Model};

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

/// What one exploration covered.
#[derive(Debug)]
struct Covered {
    states: usize,
    transitions: usize,
    depth: usize,
    secs: f64,
}

/// Explore every state within `bound`; panics with the trace of the first violation.
/// A state is remembered by a 64-bit hash of its key (a collision, about one in 10^7 at
/// a million states, would only leave one state unexplored); models are kept only while
/// they wait to be expanded.
fn explore(bound: Bound) -> Covered {
    let started = Instant::now();
    // How each state was reached: its parent's index and the event (the first: none).
    let mut reached: Vec<Option<(usize, Event)>> = vec![None];
    let start = Model::new();
    let mut seen: HashSet<u64> = HashSet::from([digest(&start.key())]);
    let mut frontier = VecDeque::from([(start, 0usize, 0usize)]);
    let (mut transitions, mut deepest) = (0, 0);
    while let Some((model, at, depth)) = frontier.pop_front() {
        deepest = deepest.max(depth);
        for e in model.enabled(bound.pods, bound.claims, bound.max_holders) {
            transitions += 1;
            let mut next = model.clone();
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| next.apply(&e))) {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("{why}\ntrace:\n{}", trace(&reached, at, &e));
            }
            if !seen.insert(digest(&next.key())) {
                continue;
            }
            reached.push(Some((at, e)));
            if depth + 1 < bound.depth {
                frontier.push_back((next, reached.len() - 1, depth + 1));
            } else {
                deepest = deepest.max(depth + 1);
            }
        }
    }
    Covered {
        states: reached.len(),
        transitions,
        depth: deepest,
        secs: started.elapsed().as_secs_f64(),
    }
}

fn digest(key: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// The events from the empty lock to state `at`, then `last`, one a line.
fn trace(reached: &[Option<(usize, Event)>], mut at: usize, last: &Event) -> String {
    let mut events = vec![format!("{last:?}   <- the rule broke here")];
    while let Some((parent, e)) = &reached[at] {
        events.push(format!("{e:?}"));
        at = *parent;
    }
    events.reverse();
    events
        .iter()
        .enumerate()
        .map(|(i, e)| format!("  {:>2}. {e}\n", i + 1))
        .collect()
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
    use super::{Mutant, mutate};
    let bugs = [
        Mutant::PodGoneAsStopped,
        Mutant::ForgedAsReleased,
        Mutant::DeletedClaimFreesAtOnce,
        Mutant::SuccessorNotFenced,
        Mutant::LetGoWithSlotHeldBack,
        Mutant::NoTokenEpoch,
        Mutant::LifoQueue,
    ];
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
