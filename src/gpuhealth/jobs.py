"""`gpuhealth run --jobs N -- PYTEST ARGS`: judge a fleet with N pytest processes on one
machine, one shard each (`--shard K/N`), and merge their reports into the ones asked for.

Why not `pytest -n N`: xdist's controller handles every test's reports alone (0.47 ms of
CPU a test, mostly pytest's terminal reporter and unpickling), so more workers stop helping
at ~1.4x. Shards are independent processes that share nothing but the run store (SQLite
takes turns between writers on one machine), so they scale with the cores; the merge is
`gpuhealth merge`'s (gpuhealth.shards), file for file. Extrapolated from 256 nodes on 2 CPUs
(README, Performance): 16 cores judge 1,024 nodes in ~27 s (one process: ~156 s), 10,000 in
~4 min, over half of it the single-threaded merge.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhealth import shards

# pytest's exit codes (pytest.ExitCode) as the summary names them.
_CODES = {
    0: "ok",
    1: "tests failed",
    2: "interrupted",
    3: "internal error",
    4: "usage error",
    5: "no tests collected",
}
# The shards' folders, next to the requested verdicts.json: kept after the run for the logs.
FOLDER = ".gpuhealth-jobs"
LOG = "pytest.log"
# pytest's last line: `=== 1 failed, 170 passed in 2.10s ===` (or without rules, with -q).
_SUMMARY = re.compile(r" in [0-9.]+s( \([0-9:]+\))?( =+)?$")
# Options that make no sense with --jobs, and why.
_REFUSED = {
    "-n": "--jobs already runs one pytest process a shard (xdist's -n adds a controller each)",
    "--numprocesses": "--jobs already runs one pytest process a shard",
    "--shard": "--jobs gives each process its shard; for CI jobs, use --shard and "
    "`gpuhealth merge` without --jobs",
    "--prometheus-textfile-dir": "each shard would write the file with its own hosts only",
    "--collect-only": "a collection writes no report to merge: run pytest --collect-only",
    "--co": "a collection writes no report to merge: run pytest --co",
}
# The report options, the name the shard and the merge write them under, and the default
# (the suite's pytest.ini and plugin write reports/ in the folder pytest runs in).
_REPORTS = {
    "--verdicts": (shards.VERDICTS, "reports/verdicts.json"),
    "--junitxml": (shards.JUNIT, "reports/junit.xml"),
    "--junit-xml": (shards.JUNIT, "reports/junit.xml"),
    "--alluredir": (shards.ALLURE, "reports/allure-results"),
    "--save-facts": (shards.FACTS, "reports/facts"),
}

_NAMES = sorted({name for name, _ in _REPORTS.values()})


class JobsUsageError(Exception):
    """The command line asks for something --jobs cannot do (the message says what)."""


def jobs_count(text: str) -> int:
    """`--jobs N` (N >= 1) or `auto` (the machine's cores)."""
    if text == "auto":
        return os.cpu_count() or 1
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number >= 1 or auto")
    return int(text)


def report_paths(args: list[str], here: Path) -> dict[str, Path]:
    """Where the user wants each report (merged name -> path), from PYTEST ARGS or the
    defaults; JobsUsageError for an option --jobs refuses."""
    wanted = {name: here / default for name, default in _REPORTS.values()}
    for i, arg in enumerate(args):
        option, equals, value = arg.partition("=")
        short = re.fullmatch(r"-n(\S*)", arg)
        if option in _REFUSED or short:
            shown = "-n" if short else option
            raise JobsUsageError(f"{shown} cannot be given with --jobs: {_REFUSED[shown]}")
        if option in _REPORTS:
            if not equals:
                if i + 1 == len(args):
                    raise JobsUsageError(f"{option} needs a value")
                value = args[i + 1]
            wanted[_REPORTS[option][0]] = here / os.path.expanduser(value)
    return wanted


@dataclass
class ShardRun:
    """One shard's pytest process, its report folder and its exit code."""

    shard: str
    folder: Path
    process: subprocess.Popen[bytes]
    code: int = -1

    @property
    def log(self) -> Path:
        return self.folder / LOG

    def summary(self) -> str:
        """pytest's last summary line (`== 1 failed, 170 passed in 2.1s ==`), else the
        log's last line."""
        lines = [line.strip() for line in self.log.read_text(errors="replace").splitlines()]
        lines = [line for line in lines if line]
        ruled = [line.strip("= ") for line in lines if _SUMMARY.search(line)]
        return ruled[-1] if ruled else (lines[-1] if lines else "(no output)")

    def error(self) -> str:
        """What the log says went wrong (the last 20 lines), the shard's folder left out so
        that every shard's same error reads the same."""
        text = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        return text.replace(str(self.folder), "<shard folder>")


def start(args: list[str], count: int, base: Path) -> list[ShardRun]:
    """Start the N shards' pytest processes, each writing its reports and log in base/K."""
    runs = []
    for index in range(1, count + 1):
        folder = base / f"shard{index}"
        folder.mkdir(parents=True)
        command = [
            *(sys.executable, "-m", "pytest", *args, f"--shard={index}/{count}"),
            *(
                f"{option}={folder / name}"
                for option, (name, _) in _REPORTS.items()
                if option != "--junit-xml"
            ),
        ]
        with open(folder / LOG, "wb") as log:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        runs.append(ShardRun(f"{index}/{count}", folder, process))
    return runs


def _place(merged: Path, wanted: dict[str, Path]) -> None:
    """Move the merged reports where the user asked for them: an Allure folder replaces the
    old one (as the suite's --clean-alluredir does), facts files join the folder's others."""
    for name, target in wanted.items():
        source = merged / name
        if not source.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if name == shards.FACTS:
            target.mkdir(exist_ok=True)
            for doc in source.iterdir():
                os.replace(doc, target / doc.name)
            continue
        if name == shards.ALLURE and target.is_dir():
            old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
            target.rename(old)
            shutil.rmtree(old)
        shutil.move(str(source), str(target))


def _remove(path: Path) -> None:
    """Delete a file or folder if it is there."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _evidence(runs: list[ShardRun], verdicts: Path) -> None:
    """Each shard's load-test evidence (evidence/<host>/, next to its verdicts.json) into
    the one next to the requested verdicts.json, as an unsharded run writes it."""
    target = verdicts.parent / "evidence"
    for run in runs:
        for host in sorted((run.folder / "evidence").glob("*")):
            target.mkdir(parents=True, exist_ok=True)
            if (target / host.name).exists():
                shutil.rmtree(target / host.name)
            shutil.move(str(host), str(target / host.name))


def run(count: int, args: list[str], here: Path | None = None) -> int:
    """Judge with `count` shards at once and merge; pytest's exit code for the whole run
    (that of a shard that could not run wins, unmerged: the report would lack its hosts)."""
    here = here or Path.cwd()
    wanted = report_paths(args, here)
    base = wanted[shards.VERDICTS].parent / FOLDER
    shutil.rmtree(base, ignore_errors=True)  # an earlier --jobs run's shards
    began = time.monotonic()
    runs = start(args, count, base)
    for shard_run in runs:
        try:
            code = shard_run.process.wait()
        except KeyboardInterrupt:  # ^C reached the shards too: each ends as pytest does
            code = shard_run.process.wait()
        shard_run.code = 128 - code if code < 0 else code  # killed: as a shell reports it
    print(f"gpuhealth run: {count} shards in {time.monotonic() - began:.1f} s")
    for shard_run in runs:
        name = _CODES.get(shard_run.code, "crashed")
        print(f"  shard {shard_run.shard}: exit {shard_run.code} ({name}): {shard_run.summary()}")
    # An interrupted shard (^C: exit 2) wrote its partial reports, as pytest does: merged,
    # they say complete: false. A shard that could not run or wrote none leaves its hosts out.
    broken = [
        r for r in runs if r.code not in (0, 1, 2) or not (r.folder / shards.VERDICTS).is_file()
    ]
    if broken:
        errors: dict[tuple[int, str], list[ShardRun]] = {}
        for shard_run in broken:
            errors.setdefault((shard_run.code, shard_run.error()), []).append(shard_run)
        for (code, text), alike in errors.items():
            named = ", ".join(f"{r.shard} (log {r.log})" for r in alike)
            print(f"shard {named} exited {code} ({_CODES.get(code, 'crashed')}):", file=sys.stderr)
            print(text, file=sys.stderr)
        return next((r.code for r in broken if r.code not in (0, 1, 2)), 2)  # 2: no report
    began = time.monotonic()
    try:
        done = shards.merge(base / "merged", [r.folder for r in runs])
        _place(base / "merged", wanted)
        _evidence(runs, wanted[shards.VERDICTS])
        for shard_run in runs:  # the merged reports hold them now (hard links or copies)
            for name in (*_NAMES, "evidence"):
                _remove(shard_run.folder / name)
        _remove(base / "merged")
    except (shards.MergeError, OSError) as exc:
        print(f"gpuhealth run: merge failed: {exc}", file=sys.stderr)
        return 2
    print(f"merged in {time.monotonic() - began:.1f} s: {done[0]}")
    for shard_run in runs:
        if shard_run.code:
            print(f"  shard {shard_run.shard}'s output: {shard_run.log}")
    return max(r.code for r in runs)  # 2 interrupted, else 1 tests failed, else 0


def _run(args: argparse.Namespace) -> int:
    pytest_args = list(args.pytest_args)
    if pytest_args[:1] == ["--"]:
        pytest_args = pytest_args[1:]
    try:
        return run(args.jobs, pytest_args)
    except JobsUsageError as exc:
        print(f"gpuhealth run: {exc}", file=sys.stderr)
        return 4


def add_parser(sub: Any) -> None:
    """`gpuhealth run --jobs N -- [PYTEST ARGS...]`."""
    parser = sub.add_parser(
        "run",
        help="judge with N pytest processes on this machine, one shard each, merged",
        description="Run `pytest PYTEST ARGS --shard K/N` for K = 1..N at once (each into its "
        f"own folder under {FOLDER}/ next to the verdicts.json asked for, its output in "
        f"{LOG} there), then merge their reports into the paths PYTEST ARGS ask for "
        "(--verdicts, --junitxml, --alluredir, --save-facts; else reports/). Exits as pytest "
        "would: 0 all passed, 1 tests failed, a shard's own code where one could not run, 2 "
        "where the merge failed. On 16 cores, 1,024 nodes would take ~27 s with --jobs 16 "
        "against ~156 s in one process (extrapolated from 256 nodes: README, Performance).",
    )
    parser.add_argument(
        "--jobs", type=jobs_count, required=True, metavar="N", help="processes: N or auto (cores)"
    )
    parser.add_argument(
        "pytest_args", nargs=argparse.REMAINDER, metavar="-- PYTEST ARGS", help="pytest's"
    )
    parser.set_defaults(func=_run)
