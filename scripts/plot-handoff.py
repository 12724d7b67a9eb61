#!/usr/bin/env python3
"""Draw docs/handoff.png from the CSV `cargo bench --features cli --bench handoff` writes.

    python3 scripts/plot-handoff.py [CSV] [PNG]

Defaults: $CARGO_TARGET_DIR/handoff.csv (else ~/.cache/leasehold/target/handoff.csv)
and docs/handoff.png. Needs matplotlib; on first use it is installed from PyPI into
~/.cache/leasehold/tools/plot-venv and the script re-runs itself there.
"""
import csv
import os
import subprocess
import sys
from collections import defaultdict

VENV = os.path.expanduser("~/.cache/leasehold/tools/plot-venv")
ORDER = ["floor", "etcd-library", "library", "controller", "etcdctl", "etcd-run", "run", "pod-gone"]


def ensure_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        py = os.path.join(VENV, "bin", "python3")
        if not os.path.exists(py):
            subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
            subprocess.run([py, "-m", "pip", "install", "-q", "matplotlib"], check=True)
        os.execv(py, [py] + sys.argv)


def main():
    ensure_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/leasehold/target"))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(target, "handoff.csv")
    out = sys.argv[2] if len(sys.argv) > 2 else "docs/handoff.png"
    series = defaultdict(list)
    with open(src) as f:
        for row in csv.DictReader(f):
            series[row["series"]].append(float(row["ms"]))
    keys = [k for k in ORDER if k in series]  # sigkill (seconds) is left out of the plot
    fig, ax = plt.subplots(figsize=(9, 5))
    for k in keys:
        xs = sorted(series[k])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"{k} (n={len(xs)}, median {xs[len(xs) // 2]:.1f} ms)")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xticks([1, 2, 5, 10, 20, 50, 100])
    ax.set_xlabel("handoff latency, ms (log scale)")
    ax.set_ylabel("fraction of handoffs at or below")
    ax.set_title("leasehold handoff latency vs etcdctl lock, one run on one etcd")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
