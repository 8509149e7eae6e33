"""Offline judging at fleet scale against bare pytest, measured in one run.

For each fleet size this writes N healthy 8x H100 facts documents and runs the health suite on
them as users run it (`pytest --facts DIR`, every report on: JUnit, Allure results, verdicts,
saved facts), then runs bare pytest (no gpuhealth, no Allure) on the same number of trivial
tests: the floor any pytest-based suite pays for collecting and reporting that many tests. It
prints both times, their ratio (and that of their CPU time, steadier on a shared machine), both
peak RSS, the Allure results' size (bytes and disk use, per 128 nodes) and files per node, and
the milliseconds per node, which must stay flat as the fleet grows. With --html it renders
each size's report (`make report`) and opens it in headless Chromium: generation time, size,
files and the time until the page settles.

Every size's files are kept until the end: deleting ~100,000 files makes ext4 slow to create
new ones for a while (its inode allocator skips recently freed inodes), which would bill one
size's clean-up to the next.

    .venv/bin/python bench/scale.py                      # 16, 64 and 256 nodes
    .venv/bin/python bench/scale.py --sizes 1024 -n 2    # the target size, 2 xdist workers
                                                         # (and each process's CPU per test)
    .venv/bin/python bench/scale.py --sizes 128 --html   # and the HTML report
"""

from __future__ import annotations

import argparse
import json
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
    cpu_s: float  # user + system, its waited-for children's included (the Allure writer's)
    rss_mb: float
    rc: int
    output: str


def timed(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> Run:
    """Wall time, CPU time and peak RSS of one command (the largest single process of its
    tree that was waited for, as getrusage reports it: not a sum over xdist workers). On a
    shared machine the CPU time is the steadier measure: other work stretches wall time."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env
    )
    output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return Run(time.monotonic() - started, cpu, usage.ru_maxrss / 1024, proc.returncode, output)


def workers(count: int) -> list[str]:
    return ["-n", str(count)] if count > 1 else []


@dataclass
class Reports:
    tests: int
    allure_bytes: int
    allure_disk: int  # bytes of the blocks the files take
    allure_files: int
    total_bytes: int


def sizes(folder: Path) -> tuple[int, int, int]:
    """Bytes, disk use and file count of the files under a folder."""
    stats = [p.stat() for p in folder.rglob("*") if p.is_file()]
    return sum(s.st_size for s in stats), sum(s.st_blocks * 512 for s in stats), len(stats)


def per_process(path: Path) -> dict[str, float]:
    """Each process's own CPU seconds, as bench/cpu_at_exit.py wrote them."""
    lines = path.read_text().split("\n") if path.is_file() else []
    return {who: float(cpu) for who, cpu in (line.split() for line in lines if line)}


def suite(nodes: int, folder: Path, count: int) -> tuple[Run, Reports, dict[str, float]]:
    """The suite on `nodes` saved documents (one node with an ECC fault, as a fleet has),
    and the CPU seconds of each of its processes (controller, xdist workers)."""
    docs = {f"node{i:05d}": healthy_h100() for i in range(nodes)}
    docs["node00000"]["gpus"][3]["ecc"]["volatile"]["uncorrected"] = 4
    facts = write_facts(folder / "facts", **docs)
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
        "-p",
        "cpu_at_exit",
        *workers(count),
    ]
    cpu = folder / "cpu-per-process"
    env = {**os.environ, "GPUHEALTH_BENCH_CPU": str(cpu)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "bench"), env.get("PYTHONPATH")]))
    run = timed(argv, folder, env)
    verdicts = json.loads((reports / "verdicts.json").read_text())["nodes"]
    bad = [host for host, node in verdicts.items() if node["verdict"] != "PASS"]
    if run.rc != 1 or bad != ["node00000"] or len(verdicts) != nodes:  # exactly one fails
        raise SystemExit(
            f"unexpected suite run on {nodes} nodes (exit {run.rc}):\n{run.output[-3000:]}"
        )
    tests = int(ET.parse(reports / "junit.xml").getroot().find("testsuite").get("tests"))
    allure, disk, files = sizes(reports / "allure-results")
    return run, Reports(tests, allure, disk, files, sizes(reports)[0]), per_process(cpu)


def html(folder: Path) -> str:
    """`make report` on the run's results, then the page opened in headless Chromium."""
    from selftest.testbed.htmlreport import chromium, ensure_chromium, make_report, serve

    ensure_chromium()  # installs, if any, are not part of the timings
    subprocess.run(["make", "-s", "-C", str(REPO), ".tools/node_modules/.bin/allure"], check=True)
    started = time.monotonic()
    index = make_report(folder / "reports")
    generated = time.monotonic() - started
    size, _, files = sizes(index.parent)
    with serve(index.parent) as url:
        started = time.monotonic()
        dom = chromium(url, "--dump-dom", timeout=1800)
        loaded = time.monotonic() - started
    if "metadata-item-key" not in dom or "test_ecc_errors[node00000-gpu3]" not in dom:
        raise SystemExit(f"the report at {index} does not show the summary and the failed test")
    return (
        f"HTML: generated in {generated:.0f} s, {size / 1e6:.1f} MB in {files} files, "
        f"settled in Chromium in {loaded:.1f} s, showing the summary and the failed test"
    )


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


def controller_share(cpu: dict[str, float], tests: int) -> str:
    """What the suite's processes spent per test: the controller and, with xdist, the
    workers, and then the most that more workers can give while the controller handles every
    test's reports alone (the workers' share spread over 14 of 16 cores, the controller and
    the Allure writer on the others)."""
    controller = cpu.get("controller", 0.0) / tests * 1000
    workers = sum(v for k, v in cpu.items() if k != "controller") / tests * 1000
    if not workers:
        return f"CPU per test: {controller:.3f} ms in one process"
    bound = max(controller, workers / 14)
    return (
        f"CPU per test: controller {controller:.3f} ms, workers {workers:.3f} ms in all; "
        f"at 16 cores (-n 14) at least {bound:.3f} ms a test"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,64,256", help="fleet sizes, comma-separated")
    parser.add_argument("-n", "--workers", type=int, default=1, help="pytest-xdist workers")
    parser.add_argument("--html", action="store_true", help="render and open the HTML report")
    args = parser.parse_args()
    print(
        f"gpuhealth offline judging vs bare pytest; {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, -n {args.workers}"
    )
    print(
        f"{'nodes':>6} {'tests':>7} {'suite s':>8} {'floor s':>8} {'ratio':>6} {'CPU ratio':>9} "
        f"{'RSS MB':>7} "
        f"{'floor RSS':>9} {'Allure MB/128 nodes':>19} {'on disk':>7} {'files/node':>10} "
        f"{'ms/node':>7}"
    )
    with tempfile.TemporaryDirectory(prefix="gpuhealth-scale-") as tmp:
        for index, nodes in enumerate(int(s) for s in args.sizes.split(",")):
            folder = Path(tmp) / f"{index}-{nodes}"  # a size may be given twice
            (folder / "floor").mkdir(parents=True)
            run, reports, cpu = suite(nodes, folder, args.workers)
            bare = floor(reports.tests, folder / "floor", args.workers)
            per128 = 128 / nodes / 1e6
            print(
                f"{nodes:>6} {reports.tests:>7} {run.seconds:>8.1f} {bare.seconds:>8.1f} "
                f"{run.seconds / bare.seconds:>6.2f} {run.cpu_s / bare.cpu_s:>9.2f} "
                f"{run.rss_mb:>7.0f} {bare.rss_mb:>9.0f} "
                f"{reports.allure_bytes * per128:>19.1f} {reports.allure_disk * per128:>7.1f} "
                f"{reports.allure_files / nodes:>10.1f} {1000 * run.seconds / nodes:>7.0f}",
                flush=True,
            )
            print(f"       {controller_share(cpu, reports.tests)}", flush=True)
            if args.html:
                print(f"       {html(folder)}", flush=True)


if __name__ == "__main__":
    main()
