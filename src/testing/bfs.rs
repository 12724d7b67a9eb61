//! Exhaustive breadth-first exploration of a state machine, for the model checks (tests
//! only): every sequence of steps from a start, up to a depth, each distinct state once
//! (by a 64-bit hash of its key), its properties checked by the machine's own
//! assertions as each step is taken. A broken property comes back with the shortest
//! trace of steps that reaches it.
//!
//! Three machines use it: the decide core's world model (`decide::explore`), the etcd
//! backend's model (`testing::explore::etcd`) and the whole protocol — API server,
//! two controllers, clients, a neighbour, time (`explore::system`).

use std::collections::{HashSet, VecDeque};
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Instant;

/// A state machine to explore. A broken property is a panic in [`Machine::take`].
pub(crate) trait Machine: Clone {
    /// One step.
    type Step: Clone + Debug;
    /// The steps enabled in this state.
    fn steps(&self) -> Vec<Self::Step>;
    /// Take one step, checking every property it touches (a panic says which broke).
    fn take(&mut self, step: &Self::Step);
    /// What the machine's future depends on: two states with the same key behave alike
    /// under every sequence of steps.
    fn key(&self) -> String;
    /// Check that from this state the machine, left to run fairly (every enabled step
    /// that makes progress eventually taken, no more faults), gets where it must (a
    /// panic says where it did not). By default: nothing to check.
    fn settles(&self) {}
}

/// What one exploration covered.
#[derive(Debug)]
pub(crate) struct Covered {
    /// Distinct states reached.
    pub states: usize,
    /// Steps taken (to new states or not).
    pub transitions: usize,
    /// The deepest state reached.
    pub depth: usize,
    /// Wall time.
    pub secs: f64,
}

/// A property that broke: why, and the steps from the start that break it.
#[derive(Debug)]
pub(crate) struct Found {
    /// The failed assertion's message.
    pub why: String,
    /// The steps, one a line, numbered from 1.
    pub trace: String,
}

impl std::fmt::Display for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}\ntrace:\n{}", self.why, self.trace)
    }
}

/// Explore every state reachable from `start` in at most `depth` steps.
pub(crate) fn explore<M: Machine>(start: M, depth: usize) -> Result<Covered, Found> {
    explore_settling(start, depth, 0)
}

/// [`explore`], checking also that every state within `settle_depth` steps of the start
/// settles ([`Machine::settles`]).
pub(crate) fn explore_settling<M: Machine>(start: M, depth: usize, settle_depth: usize) -> Result<Covered, Found> {
    let started = Instant::now();
    // How each state was reached: its parent's index and the step (the first: none).
    let mut reached: Vec<Option<(usize, M::Step)>> = vec![None];
    let mut seen: HashSet<u64> = HashSet::from([digest(&start.key())]);
    let mut frontier = VecDeque::from([(start, 0usize, 0usize)]);
    let (mut transitions, mut deepest) = (0, 0);
    while let Some((machine, at, d)) = frontier.pop_front() {
        deepest = deepest.max(d);
        for step in machine.steps() {
            transitions += 1;
            let mut next = machine.clone();
            let broke = |panic: Box<dyn std::any::Any + Send>, reached: &[Option<(usize, M::Step)>]| Found {
                why: panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default(),
                trace: trace(reached, at, &step),
            };
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| next.take(&step))) {
                return Err(broke(panic, &reached));
            }
            if !seen.insert(digest(&next.key())) {
                continue;
            }
            if d < settle_depth
                && let Err(panic) = catch_unwind(AssertUnwindSafe(|| next.settles()))
            {
                return Err(broke(panic, &reached));
            }
            reached.push(Some((at, step)));
            if d + 1 < depth {
                frontier.push_back((next, reached.len() - 1, d + 1));
            } else {
                deepest = deepest.max(d + 1);
            }
        }
    }
    Ok(Covered {
        states: reached.len(),
        transitions,
        depth: deepest,
        secs: started.elapsed().as_secs_f64(),
    })
}

fn digest(key: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// The steps from the start to state `at`, then `last`, one a line.
fn trace<S: Debug>(reached: &[Option<(usize, S)>], mut at: usize, last: &S) -> String {
    let mut steps = vec![format!("{last:?}   <- the rule broke here")];
    while let Some((parent, s)) = &reached[at] {
        steps.push(format!("{s:?}"));
        at = *parent;
    }
    steps.reverse();
    steps
        .iter()
        .enumerate()
        .map(|(i, s)| format!("  {:>2}. {s}\n", i + 1))
        .collect()
}
