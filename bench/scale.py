"""Offline judging at fleet scale against bare pytest, measured in one run.

For each fleet size this writes N healthy 8x H100 facts documents and runs the health suite on
them as users run it (`pytest --facts DIR`, every report on: JUnit, Allure results, verdicts,
saved facts), then runs bare pytest (no gpuhealth, no Allure) on the same number of trivial
tests: the floor any pytest-based suite pays for collecting and reporting that many tests. It
prints both times, their ratio, the suite's peak RSS, the size and file count of its reports,
and the seconds per node, which must stay flat as the fleet grows.

    .venv/bin/python bench/scale.py                      # 16, 64 and 256 nodes
    .venv/bin/python bench/scale.py --sizes 1024 -n 2    # the target size, 2 xdist workers
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from selftest.facts import healthy_h100, write_facts  # noqa: E402

FLOOR_TEST = """\
import pytest

@pytest.mark.parametrize("case", range({count}))
def test_trivial(case):
    pass
"""


@dataclass
class Run:
    seconds: float
    rss_mb: float
    rc: int
    output: str


def timed(argv: list[str], cwd: Path) -> Run:
    """Wall time and peak RSS (this process alone, not xdist workers) of one command."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(time.monotonic() - started, usage.ru_maxrss / 1024, proc.returncode, output)


def workers(count: int) -> list[str]:
    return ["-n", str(count)] if count > 1 else []


def suite(nodes: int, folder: Path, count: int) -> tuple[Run, int, int, int]:
    """The suite on `nodes` saved documents: its run, the tests it ran, report bytes, files."""
    facts = write_facts(folder / "facts", **{f"node{i:05d}": healthy_h100() for i in range(nodes)})
    reports = folder / "reports"
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-c",
        str(REPO / "pytest.ini"),
        "--rootdir",
        str(REPO),
        str(REPO / "tests"),
        "--facts",
        str(facts),
        "--profile",
        "h100-sxm",
        f"--junitxml={reports / 'junit.xml'}",
        f"--alluredir={reports / 'allure-results'}",
        f"--verdicts={reports / 'verdicts.json'}",
        f"--save-facts={reports / 'facts'}",
        "-q",
        *workers(count),
    ]
    run = timed(argv, folder)
    if run.rc != 0:
        raise SystemExit(
            f"the suite failed on {nodes} nodes (exit {run.rc}):\n{run.output[-3000:]}"
        )
    tests = int(ET.parse(reports / "junit.xml").getroot().find("testsuite").get("tests"))
    files = [p for p in reports.rglob("*") if p.is_file()]
    return run, tests, sum(p.stat().st_size for p in files), len(files)


def floor(tests: int, folder: Path, count: int) -> Run:
    """Bare pytest on as many trivial tests: no plugins of ours, no Allure, no reports."""
    (folder / "test_floor.py").write_text(FLOOR_TEST.format(count=tests))
    (folder / "pytest.ini").write_text("[pytest]\n")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    argv += ["-p", "no:gpuhealth.plugin", "-p", "no:allure_pytest", "test_floor.py"]
    run = timed([*argv, *workers(count)], folder)
    if run.rc != 0:
        raise SystemExit(f"bare pytest failed (exit {run.rc}):\n{run.output[-2000:]}")
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,64,256", help="fleet sizes, comma-separated")
    parser.add_argument("-n", "--workers", type=int, default=1, help="pytest-xdist workers")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"gpuhealth offline judging vs bare pytest; {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, -n {args.workers}"
    )
    print(
        f"{'nodes':>6} {'tests':>7} {'suite s':>8} {'floor s':>8} {'ratio':>6} {'RSS MB':>7} "
        f"{'reports MB':>10} {'files':>7} {'files/node':>10} {'ms/node':>8}"
    )
    for nodes in sizes:
        with tempfile.TemporaryDirectory(prefix=f"gpuhealth-scale-{nodes}-") as tmp:
            folder = Path(tmp)
            (folder / "floor").mkdir()
            run, tests, size, files = suite(nodes, folder, args.workers)
            bare = floor(tests, folder / "floor", args.workers)
        print(
            f"{nodes:>6} {tests:>7} {run.seconds:>8.1f} {bare.seconds:>8.1f} "
            f"{run.seconds / bare.seconds:>6.2f} {run.rss_mb:>7.0f} {size / 1e6:>10.1f} "
            f"{files:>7} {files / nodes:>10.1f} {1000 * run.seconds / nodes:>8.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
