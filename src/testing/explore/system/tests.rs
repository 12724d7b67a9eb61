//! The system model's configurations: those `cargo test` explores, the mutation test,
//! and any other by hand: `LEASEHOLD_SYSTEM=clients,max_holders,spec_lease,
//! client_lease,menu,depth[,settle_depth] cargo test --features cli --lib explore::system::tests::every
//! -- --nocapture`, where `menu` lists the letters of what else may happen: `n`eighbour
//! (patches and deletes claims; `d`: deletes only), lease `r`emovals, `u`nlabelled claims, `s`tamps (a
//! token stamped on a claim, a stamped claim of the neighbour's own), `p`ods, `l`ock deletion, `w`atch
//! lag, `c`ontroller failover, `k`ills, hangs and notices, `m`axHolders changed by the user, lease `h`our
//! raises, `i`nvalid claims (a pod UID changed; clients read unplaced claims back). With `LEASEHOLD_MUTANT=Name`
//! too, `explore::system::tests::the_system` looks for that mutant within that run.

use super::{Config, Menu, System};
use crate::mutant::{Mutant, mutate};
use crate::testing::bfs::{Covered, explore_settling};

/// A configuration, its depth, and the depth within which every state must settle.
#[derive(Clone, Copy, Debug)]
struct Run {
    cfg: Config,
    depth: usize,
    settle: usize,
}

fn menu(letters: &str) -> Menu {
    Menu {
        neighbour: letters.contains('n'),
        strips: letters.contains('r'),
        stamps: letters.contains('s'),
        unlabels: letters.contains('u'),
        deletes: letters.contains('n') || letters.contains('d'),
        pods: letters.contains('p'),
        lock: letters.contains('l'),
        lag: letters.contains('w'),
        leaders: letters.contains('c'),
        kills: letters.contains('k'),
        resize: letters.contains('m'),
        raises: letters.contains('h'),
        invalids: letters.contains('i'),
    }
}

const fn run(
    clients: usize,
    max_holders: i32,
    (spec_lease, client_lease): (i32, i32),
    menu: Menu,
    depth: usize,
) -> Run {
    Run {
        cfg: Config {
            clients,
            max_holders,
            spec_lease,
            client_lease,
            menu,
        },
        depth,
        settle: 0,
    }
}

fn check(r: Run) -> Covered {
    let covered = explore_settling(System::new(r.cfg), r.depth, r.settle).unwrap_or_else(|found| panic!("{found}"));
    println!(
        "explored {:?}: {} states, {} transitions, depth {}, {:.1} s",
        r, covered.states, covered.transitions, covered.depth, covered.secs
    );
    covered
}

/// The run `LEASEHOLD_SYSTEM` asks for, if any.
fn by_hand() -> Option<Run> {
    let spec = std::env::var("LEASEHOLD_SYSTEM").ok()?;
    let f: Vec<&str> = spec.split(',').map(str::trim).collect();
    assert!(
        (6..=7).contains(&f.len()),
        "LEASEHOLD_SYSTEM=clients,max_holders,spec_lease,client_lease,menu,depth[,settle_depth]"
    );
    let n = |i: usize| f[i].parse::<i32>().expect("a number");
    let settle = f.get(6).map_or(0, |_| n(6) as usize);
    Some(Run {
        settle,
        ..run(n(0) as usize, n(1), (n(2), n(3)), menu(f[4]), n(5) as usize)
    })
}

/// What `cargo test` explores: the whole menu to a shallow depth, then each kind of
/// fault alone to a deeper one (2 clients, maxHolders 1, a 4 s lock lease under the
/// clients' 8 s, so the rules that take the longer lease are exercised), and a
/// semaphore of 2 among 3 clients: with a neighbour and pods, and with its `maxHolders`
/// changed under a controller whose watches lag. Every state within `settle` steps must
/// settle.
fn ci() -> Vec<Run> {
    // (clients, maxHolders, menu, depth, settle depth)
    let runs = [
        (2, 1, "nplwck", 6, 4),
        (2, 1, "n", 8, 5),
        (2, 1, "w", 9, 6),
        (2, 1, "l", 9, 7),
        (2, 1, "ck", 7, 5),
        (3, 2, "np", 6, 4),
        (2, 1, "rsuhi", 7, 3),
        (3, 2, "mw", 8, 4),
    ];
    let to_run = |(clients, max, letters, depth, settle)| Run {
        settle,
        ..run(clients, max, (4, 8), menu(letters), depth)
    };
    runs.into_iter().map(to_run).collect()
}

#[test]
fn every_interleaving_of_the_whole_protocol_within_the_bound_keeps_every_rule() {
    if let Some(r) = by_hand() {
        check(r);
        return;
    }
    for r in ci() {
        let covered = check(r);
        assert!(covered.states > 10_000, "the bound explores too little: {covered:?}");
    }
}

/// The mutant `LEASEHOLD_MUTANT` names, if any (to try a bound by hand).
fn mutant_by_hand() -> Option<Mutant> {
    let name = std::env::var("LEASEHOLD_MUTANT").ok()?;
    Mutant::ALL.into_iter().find(|m| format!("{m:?}") == name)
}

/// A bug put back, the clients and `maxHolders` that show it, the menu, the lock's and
/// the clients' leases, and a depth past its shortest trace (with the depth within
/// which states must settle, for a bug that breaks liveness).
type Bug = (Mutant, (usize, i32), &'static str, (i32, i32), (usize, usize));

/// Each bug put back, with the configuration that shows it: the fewest actors that
/// can, the lock's and the clients' leases, and a depth past its shortest trace. (A
/// lock lease of 1 s under the clients' 12 s is the lowered lease of issue #41's first
/// finding, and puts the controller's expiry before the holder's first renewal.)
const MUTANTS: [Bug; 19] = [
    (Mutant::PodGoneAsStopped, (2, 1), "p", (4, 8), (8, 0)),
    (Mutant::ForgedAsReleased, (2, 1), "n", (4, 8), (8, 0)),
    (Mutant::DeletedClaimFreesAtOnce, (2, 1), "d", (4, 8), (8, 0)),
    (Mutant::HoldBackBySpecLease, (2, 1), "d", (4, 8), (11, 0)),
    (Mutant::LeaseAsPatchedAtGrant, (2, 1), "n", (4, 8), (8, 0)),
    (Mutant::WaiterActsOnWaitRenewal, (2, 1), "", (4, 8), (6, 0)),
    (Mutant::ExpiryWithoutFreshRead, (2, 1), "w", (4, 8), (7, 0)),
    (Mutant::LifoQueue, (2, 1), "", (4, 8), (4, 0)),
    (Mutant::LetGoWithSlotHeldBack, (2, 1), "l", (4, 8), (6, 0)),
    (Mutant::NoTokenEpoch, (2, 1), "l", (4, 8), (10, 0)),
    (Mutant::QueuedWithoutLease, (2, 1), "r", (1, 12), (9, 0)),
    (Mutant::StampTrusted, (2, 1), "s", (4, 8), (3, 0)),
    (Mutant::StatusWithoutVersion, (2, 1), "c", (4, 8), (6, 0)),
    (Mutant::StrayWithoutRead, (2, 1), "u", (4, 8), (8, 0)),
    (Mutant::DirectGrantBeforeStored, (2, 1), "", (4, 8), (3, 0)),
    (Mutant::HandoverByAnyMark, (2, 1), "n", (4, 8), (9, 0)),
    (Mutant::DirectGrantBesideHolders, (3, 2), "mw", (4, 8), (8, 0)),
    (Mutant::RecordLongerLease, (1, 1), "h", (4, 8), (4, 0)),
    (Mutant::InvalidClaimUnlisted, (1, 1), "i", (4, 8), (4, 4)),
];

/// The mutants to look for: [`MUTANTS`], or the one `LEASEHOLD_MUTANT` names within
/// the run `LEASEHOLD_SYSTEM` asks for (to try a bound by hand).
fn mutants() -> Vec<(Mutant, Run)> {
    if let (Some(m), Some(r)) = (mutant_by_hand(), by_hand()) {
        return vec![(m, r)];
    }
    let to_run = |(bug, (clients, max), letters, leases, (depth, settle)): Bug| {
        let r = run(clients, max, leases, menu(letters), depth);
        (bug, Run { settle, ..r })
    };
    MUTANTS.into_iter().map(to_run).collect()
}

#[test]
fn the_system_model_finds_each_bug_put_back_with_its_trace() {
    for (bug, r) in mutants() {
        let _on = mutate(bug);
        let started = std::time::Instant::now();
        let found = explore_settling(System::new(r.cfg), r.depth, r.settle);
        let found = found
            .err()
            .unwrap_or_else(|| panic!("{bug:?} was put back and nothing was found within {r:?}"));
        assert!(found.trace.starts_with("   1. "), "{bug:?}: no trace in {found}");
        let secs = started.elapsed().as_secs_f64();
        println!("{bug:?} found within {r:?} in {secs:.1} s:\n{found}\n");
    }
}
