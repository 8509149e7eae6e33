"""Offline evaluation cost per node as the fleet grows (`pytest --facts DIR`).

Fleet-scale runs judge saved facts documents (collected by playbooks or the scheduler), so the
controller's cost per node must stay flat as the node count grows. This writes N copies of a
healthy 8x H100 node's facts, runs the real suite on them, and reports seconds per node and the
ratio to the smallest fleet: a ratio near 1.0 means linear scaling.

    .venv/bin/python bench/offline_scale.py [--sizes 10,40,160] [-n 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from selftest.facts import healthy_h100, write_facts
from selftest.suite import run_suite


def measure(nodes: int, workers: int, work: Path) -> float:
    """Wall seconds of one offline suite run over `nodes` healthy nodes."""
    folder = write_facts(
        work / f"facts-{nodes}", **{f"node{i:05d}": healthy_h100() for i in range(nodes)}
    )
    args = ["--facts", str(folder), "--profile", "h100-sxm", "-q"]
    if workers > 1:
        args += ["-n", str(workers)]
    started = time.monotonic()
    run = run_suite(work / f"reports-{nodes}", *args, timeout=3600)
    elapsed = time.monotonic() - started
    if run.rc != 0:
        raise SystemExit(
            f"suite run on {nodes} nodes failed (exit {run.rc}):\n{run.output[-2000:]}"
        )
    return elapsed


def main() -> None:
    """Run the sizes and print seconds per node and the ratio to the first size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,40,160", help="fleet sizes, comma-separated")
    parser.add_argument("-n", "--workers", type=int, default=2, help="pytest-xdist workers")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        results = [(n, measure(n, args.workers, Path(tmp))) for n in sizes]
    base = results[0][1] / results[0][0]
    print(f"{'nodes':>6} {'seconds':>9} {'s/node':>8} {'ratio':>6}")
    for nodes, seconds in results:
        per_node = seconds / nodes
        print(f"{nodes:>6} {seconds:>9.1f} {per_node:>8.3f} {per_node / base:>6.2f}")


if __name__ == "__main__":
    main()
