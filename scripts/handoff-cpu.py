#!/usr/bin/env python3
"""Where the CPU goes during each handoff of the handoff benchmark's process paths.

Records every context switch while the benchmark runs, then, for each handoff (one
section's `end` line to the next section's `start` line in the kept log), adds up the
CPU time each process spent inside it, by role: the holder's process tree (`H.`), the
next holder's (`W.`), a contender started less than 50 ms before the handoff began or
during it (`N.`: the bench starts one as each holder exits), the other queued
contenders (`Q.`), and everything else by command name; `idle` is the idle CPUs'
share. With `--timeline`, also prints the median handoff's schedule on each CPU (`--at Q`:
the one at quantile Q, 1 the slowest).

    B=$(cargo bench --features cli --bench handoff --no-run 2>&1 | sed -n 's/.*(\\(.*\\))$/\\1/p')
    mkdir -p /tmp/h
    perf record -a -k monotonic -o /tmp/h/perf.data \\
        -e sched:sched_switch,sched:sched_process_exec,sched:sched_process_exit,sched:sched_process_fork \\
        -- $B --bench --rounds 100 --only etcd-run,etcdctl --keep-logs /tmp/h
    TZ=UTC perf script -i /tmp/h/perf.data -F comm,pid,tid,cpu,tod,time,event,trace --ns > /tmp/h/sched.txt
    python3 scripts/handoff-cpu.py /tmp/h etcd-run etcdctl --timeline

Roles: a contender is a process the benchmark started that runs `leasehold` or
`etcdctl`; for `leasehold run` its children are the supervisor (`sup`) and CMD's
process (`cmd`, the pre-started guard until it execs CMD), their children `cmd+`; for
`etcdctl`, CMD is its child. The holder is the contender that exits first after the
handoff began; the next holder is the one whose CMD execs `sh` inside it.
"""

import argparse
import bisect
import collections
import datetime
import re
import statistics
import sys
from pathlib import Path

LINE = re.compile(r"^\s*(.+?)\s+(\d+)/(\d+)\s+\[(\d+)\]\s+(\S+ \S+)\s+([\d.]+):\s+(\S+):\s*(.*)$")
LOGS = {"etcd-run": "bench-etcd-run.log", "run": "bench-run.log", "etcdctl": "etcdctl.log"}


class Trace:
    """Context switches (per CPU: start, end, process, command) and process events."""

    def __init__(self, path: Path):
        self.runs = collections.defaultdict(list)
        self.parent, self.forked, self.exits = {}, {}, {}
        self.execs = collections.defaultdict(list)
        since, offset = {}, None
        for line in open(path, errors="replace"):
            m = LINE.match(line)
            if not m:
                continue
            comm, pid, tid, cpu, tod, t, event, rest = m.groups()
            if offset is None:
                # The section logs are in wall-clock time (`date +%s%N`), perf's in
                # CLOCK_MONOTONIC: `tod` is perf's wall clock for the same instant.
                day, frac = tod.split(".")
                wall = datetime.datetime.strptime(day, "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.timezone.utc)
                offset = wall.timestamp() + float("0." + frac) - float(t)
            t, cpu, pid, tid = float(t) + offset, int(cpu), int(pid), int(tid)
            if event == "sched:sched_switch":
                if cpu in since:
                    self.runs[cpu].append((since[cpu], t, pid, comm))
                since[cpu] = t
            elif event == "sched:sched_process_fork":
                child = int(re.search(r"child_pid=(\d+)", rest).group(1))
                self.parent[child], self.forked[child] = pid, t
            elif event == "sched:sched_process_exec":
                self.execs[pid].append((t, rest.split()[0].split("=", 1)[1]))
            elif event == "sched:sched_process_exit" and pid == tid:
                self.exits[pid] = t
        if offset is None:
            sys.exit(f"{path}: no event with a time of day (perf record -k monotonic; perf script -F ...,tod,...)")
        self.starts = {cpu: [r[0] for r in rs] for cpu, rs in self.runs.items()}
        processes = {p for rs in self.runs.values() for _, _, p, _ in rs} | set(self.execs)
        self.children = collections.defaultdict(list)
        for child, parent in self.parent.items():
            if child in processes and child != parent:
                self.children[parent].append(child)

    def ran(self, a: float, b: float):
        """(cpu, start, end, pid, comm) of every run overlapping [a, b], clipped."""
        for cpu, rs in self.runs.items():
            i = max(bisect.bisect_left(self.starts[cpu], a) - 1, 0)
            while i < len(rs) and rs[i][0] < b:
                st, en, pid, comm = rs[i]
                i += 1
                if min(en, b) > max(st, a):
                    yield cpu, max(st, a), min(en, b), pid, comm


def contenders(trace: Trace):
    """Each process of a contender's tree -> (its contender, its role)."""
    def ran(p: int, name: str) -> bool:
        return any(f.endswith("/" + name) for _, f in trace.execs.get(p, []))

    bench = {p for p, es in trace.execs.items() if any("/handoff-" in f for _, f in es)}
    tree = {}
    for b in bench:
        for c in trace.children[b]:
            if ran(c, "leasehold"):
                levels = ["run", "sup", "cmd", "cmd+"]
            elif ran(c, "etcdctl"):
                levels = ["run", "cmd", "cmd+"]
            else:
                continue
            found, todo = {}, [(c, 0)]
            while todo:
                p, depth = todo.pop()
                found[p] = (c, levels[min(depth, len(levels) - 1)])
                todo += [(k, depth + 1) for k in trace.children[p]]
            # `leasehold dev` (the benchmark's control plane) is no contender.
            if not any(ran(p, "etcd") for p in found):
                tree.update(found)
    return tree


def handoffs(log: Path):
    """(end, next start) of each handoff in a section log; those over 100 ms left out."""
    marks = sorted((int(ns) / 1e9, what == "start") for what, ns in (l.split() for l in open(log)))
    return [(a[0], b[0]) for a, b in zip(marks, marks[1:]) if not a[1] and b[1] and b[0] - a[0] < 0.1]


def sides(trace: Trace, tree, gap):
    """The holder's contender and the next holder's in `gap`."""
    a, b = gap
    tops = {t for t, _ in tree.values()}
    holder = min(((trace.exits[t], t) for t in tops if trace.exits.get(t, 0) > a), default=(0, None))[1]
    nxt = next((tree[p][0] for p, (_, role) in tree.items() if role == "cmd" and any(
        a - 0.001 < t < b and f.endswith("/sh") for t, f in trace.execs.get(p, []))), None)
    return holder, nxt


def label(trace: Trace, tree, gap, who, pid: int, comm: str) -> str:
    """Whose run this is in `gap` (`who`: the holder's and the next holder's contenders)."""
    if pid == 0:
        return "idle"
    if pid not in tree:
        return comm
    top, role = tree[pid]
    if top == who[0]:
        return "H." + role
    if top == who[1]:
        return "W." + role
    return ("N." if trace.forked.get(top, 0) > gap[0] - 0.05 else "Q.") + role


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path, help="the --keep-logs dir, with sched.txt (`TZ=UTC perf script` output)")
    ap.add_argument("paths", nargs="+", choices=sorted(LOGS), help="which series")
    ap.add_argument("--timeline", action="store_true", help="print the median handoff's schedule too")
    ap.add_argument("--at", type=float, default=0.5, metavar="Q",
                    help="with --timeline, the handoff at this quantile instead of the median (1 = the slowest)")
    args = ap.parse_args()
    trace = Trace(args.dir / "sched.txt")
    tree = contenders(trace)
    for path in args.paths:
        gaps = handoffs(args.dir / LOGS[path])
        if not gaps:
            print(f"{path}: no handoffs in {LOGS[path]}", file=sys.stderr)
            continue
        cpu_ms = collections.Counter()
        for gap in gaps:
            who = sides(trace, tree, gap)
            for _, st, en, pid, comm in trace.ran(*gap):
                cpu_ms[label(trace, tree, gap, who, pid, comm)] += (en - st) * 1e3
        lens = [(b - a) * 1e3 for a, b in gaps]
        print(f"== {path}: n={len(gaps)} median {statistics.median(lens):.2f} ms, mean {statistics.mean(lens):.2f} ms"
              f" ({len(trace.runs)} CPUs): CPU ms per handoff")
        for who, ms in cpu_ms.most_common(16):
            print(f"   {who:20s} {ms / len(gaps):7.3f}")
        if args.timeline:
            ranked = sorted(gaps, key=lambda g: g[1] - g[0])
            a, b = ranked[min(int(args.at * len(ranked)), len(ranked) - 1)]
            who = sides(trace, tree, (a, b))
            print(f"-- the handoff at quantile {args.at}, {1e3 * (b - a):.2f} ms; ms after its start (+ ms on the CPU):")
            for cpu in sorted(trace.runs):
                runs = [(st, en, pid, comm) for c, st, en, pid, comm in trace.ran(a, b) if c == cpu]
                cells = [f"{(st - a) * 1e3:5.2f}+{(en - st) * 1e3:.2f} {label(trace, tree, (a, b), who, pid, comm)}"
                         for st, en, pid, comm in sorted(runs) if en - st >= 5e-5]
                print(f"   cpu{cpu}: " + "; ".join(cells))
            for pid, es in trace.execs.items():
                for t, f in es:
                    if a < t < b:
                        print(f"   exec {(t - a) * 1e3:5.2f} {f} ({label(trace, tree, (a, b), who, pid, '')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
