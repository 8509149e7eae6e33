"""The run's outputs as sinks: a failing one stops no other, a test's record survives its trip
from an xdist worker, and the README's "Adding an output" walkthrough is followed to the
letter in a copy of the tree."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuhealth.families.history.checks import Regression
from gpuhealth.history.run import History
from gpuhealth.report import NodeVerdict, Outcome, VerdictDocument
from gpuhealth.results import Action, Shared
from gpuhealth.sinks import FinishedTest, Record, RunEnd, RunInfo, Sink, SinkError, Sinks
from gpuhealth.sinks import allure as allure_sink
from selftest.facts import healthy_h100, write_facts
from selftest.suite import REPO, run_suite
from selftest.test_docs import chapter, in_tree


def run_info(tmp_path: Path) -> RunInfo:
    return RunInfo(
        hosts=["n1"],
        level="quick",
        verdicts=tmp_path / "verdicts.json",
        options=SimpleNamespace(),
        history=History(None, tmp_path),
    )


class Kept(Sink):
    """Keeps what it was fed."""

    name = "kept"

    def open(self, run: RunInfo) -> bool:
        self.tests: list[str] = []
        self.closed: list[str] = []
        return True

    def outcome(self, test: FinishedTest) -> None:
        self.tests.append(test.nodeid)

    def close(self, end: RunEnd) -> None:
        self.closed = [v.host for v in end.verdicts]


class Broken(Sink):
    """Fails at its first test."""

    name = "broken"
    fails_run = False

    def open(self, run: RunInfo) -> bool:
        return True

    def outcome(self, test: FinishedTest) -> None:
        raise SinkError(f"broken output not written: disk full at {test.nodeid}")

    def close(self, end: RunEnd) -> None:
        raise AssertionError("a sink that failed is not closed")


class Store(Sink):
    """Fails at the end, and its failure fails the run (as the run store's does)."""

    name = "store"
    fails_run = True

    def open(self, run: RunInfo) -> bool:
        return True

    def close(self, end: RunEnd) -> None:
        raise KeyError("no such table")


class Unasked(Sink):
    """Not asked for by this run: never fed."""

    name = "unasked"

    def open(self, run: RunInfo) -> bool:
        return False

    def close(self, end: RunEnd) -> None:
        raise AssertionError("an output the run did not ask for is not closed")


def test_a_failing_sink_is_reported_and_stops_no_other(tmp_path):
    sinks = Sinks(run_info(tmp_path), (Broken, Unasked, Kept))
    kept = next(s for s in sinks.open if isinstance(s, Kept))
    for nodeid in ("t::test_a[n1]", "t::test_b[n1]"):
        sinks.outcome(FinishedTest(nodeid, 0, record=Record("n1")))
    sinks.close(RunEnd([NodeVerdict("n1")], [], complete=True, exit_status=0))
    assert kept.tests == ["t::test_a[n1]", "t::test_b[n1]"]
    assert kept.closed == ["n1"]
    assert sinks.problems == ["broken output not written: disk full at t::test_a[n1]"]
    assert not sinks.failed_run


def test_a_sink_whose_failure_fails_the_run_says_so(tmp_path):
    sinks = Sinks(run_info(tmp_path), (Store, Kept))
    sinks.close(RunEnd([], [], complete=True, exit_status=0))
    assert sinks.problems == ["store not written: KeyError: 'no such table'"]
    assert sinks.failed_run


def test_a_record_crosses_from_a_worker_whole():
    shared = Shared("nvlink_domain", "nvlink_domain", "rack07", "NVLink domain", "abc", "fix")
    record = Record(
        "n1",
        3,
        check="ecc_errors",
        status="FAIL",
        message="volatile uncorrected ECC errors 3 > 0",
        label="n1 gpu3",
        action="RESET_GPU",
        details=[shared, Regression({"check": "ecc_errors", "gpu": 3, "metric": "ecc"})],
        attachments=[{"name": "facts n1.json", "source": "x-attachment.json"}],
        rows=[{"gpu": 3, "gpu_key": "S1", "metric": "ecc", "value": 3.0}],
    )
    wire = record.wire()
    assert all(isinstance(v, (str, int, float, list, dict, type(None))) for v in wire)
    assert Record.of(wire) == record
    assert Record.of(record) is record  # in one process: no copy
    assert Record.of(Record("n1").wire()) == Record("n1")


# Kinds a wire could name that are no detail a family declares: a module that runs a command
# on import (the probe's `python -m` entry, which ends the process), the base class, an
# attribute path, another package, a kind that is no string.
NOT_DETAILS = [
    "gpuhealth.probe.__main__:X",
    "gpuhealth.results:Detail",
    "gpuhealth.results:Shared.__base__",
    "os:system",
    ["gpuhealth.results:Shared"],
]


def test_a_wired_detail_is_only_a_class_a_family_declares():
    """Detail.unwire imports the module a wire names only where families declare details
    (gpuhealth.results, gpuhealth.families) and takes only a declared Detail subclass; any
    other kind is refused, in a fresh interpreter, before its module is imported."""
    script = textwrap.dedent(
        f"""
        import sys
        from gpuhealth.results import Detail
        for kind in {NOT_DETAILS!r}:
            try:
                Detail.unwire((kind,))
            except TypeError as exc:
                print("refused", exc)
        print("imported", "gpuhealth.probe.__main__" in sys.modules)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd="/"
    )
    lines = done.stdout.splitlines()
    assert lines[:-1] == [f"refused not a result detail: {kind!r}" for kind in NOT_DETAILS]
    assert lines[-1] == "imported False"
    assert done.returncode == 0, done.stderr


def test_a_test_stands_for_each_check_outcome_it_carries():
    record = Record("n1", 0, check="ecc_errors", status="WARN")
    assert FinishedTest("t::test_ecc_errors[n1-gpu0]", 0, record=record).statuses() == [
        ("n1", 0, "ecc_errors", "WARN")
    ]
    unreachable = FinishedTest("t::test_power[n2-gpu1]", 0, record=Record("n2", 1))
    unreachable.record.unreachable, unreachable.when = "ssh: no route to host", "setup"
    assert unreachable.statuses() == [("n2", 1, "power", "ERROR")]
    fleet = Record(
        fleet=[
            {"host": "n1", "check": "nccl_multinode", "status": "FAIL", "message": "slow"},
            {"host": "n2", "check": "nccl_multinode", "status": "NOTE", "message": "fast"},
        ]
    )
    assert FinishedTest("t::test_nccl_multinode[fleet]", 0, record=fleet).statuses() == [
        ("n1", None, "nccl_multinode", "FAIL")
    ]


def test_an_answer_nothing_vouches_for_is_never_healthy():
    node = NodeVerdict("n1", "PASS", reasons=["3 checks passed, 0 skipped"])
    doc = VerdictDocument([node], [Outcome("ecc_errors", "PASS", "n1", 0, "0 errors", "n1 gpu0")])
    refused = doc.refused("serve", "the latest verdict is 900 s old", Action.INSPECT)
    answer = refused.node_json()
    assert (answer["verdict"], answer["fail_count"]) == ("NOT_CHECKED", 1)
    assert answer["failed_checks"] == [
        {
            "check": "serve",
            "gpu": None,
            "message": "the latest verdict is 900 s old",
            "action": "INSPECT",
        }
    ]
    assert answer["reasons"][0] == "the latest verdict is 900 s old"
    assert doc.node_json()["verdict"] == "PASS"  # the judgement itself is unchanged
    failed = VerdictDocument([NodeVerdict("n2", "FAIL", actions=["RMA"])])
    assert failed.refused("serve", "stale", Action.RERUN).node_json()["actions"] == [
        "RMA",
        "RERUN",
    ]


# ---------------------------------------------------------------- the walkthrough


def walkthrough() -> tuple[str, str, str]:
    """The module the walkthrough writes (its path and content) and its NAMES line."""
    text = chapter("Adding an output")
    ((path, body),) = re.findall(
        r"^ *`(src/[\w/.]+\.py)`:\n\n *```python\n(.*?)^ *```", text, re.M | re.S
    )
    (names,) = re.findall(r"^ *(NAMES = \(\n.*?^ *\))$", text, re.M | re.S)
    return path, textwrap.dedent(body), textwrap.dedent("   " + names)


def test_the_walkthrough_writes_one_module_and_one_line():
    path, _, names = walkthrough()
    assert path == "src/gpuhealth/sinks/csv_verdicts.py"
    assert names.endswith('"prometheus",\n    "csv_verdicts",\n)')


def suite(tree: Path, facts: Path, reports: Path, *options: str) -> subprocess.CompletedProcess:
    """The copied tree's suite on `facts`, its ECC checks only, without a run store."""
    return in_tree(
        tree,
        "-m",
        "pytest",
        "-c",
        str(tree / "pytest.ini"),
        "--facts",
        str(facts),
        "--profile",
        "h100-sxm",
        "--no-history",
        f"--verdicts={reports / 'verdicts.json'}",
        "-k",
        "ecc_errors",
        *options,
        cwd=reports,
    )


@pytest.mark.suite
def test_the_new_output_is_registered_and_written(tmp_path):
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "tests", tree / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pytest.ini", tree)
    path, body, names = walkthrough()
    (tree / path).write_text(body)
    init = tree / "src/gpuhealth/sinks/__init__.py"
    text, count = re.subn(r"^NAMES = \(\n.*?^\)$", names, init.read_text(), flags=re.M | re.S)
    assert count == 1
    init.write_text(text)

    bad = healthy_h100()
    bad["gpus"][3]["ecc"]["volatile"]["uncorrected"] = 3
    facts = write_facts(tmp_path / "facts", n1=healthy_h100(), n2=bad)
    out = tmp_path / "verdicts.csv"
    run = suite(tree, facts, tmp_path, f"--verdicts-csv={out}")
    assert run.returncode == 1, run.stdout + run.stderr
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["host", "verdict", "action", "failed_tests", "reason"]
    assert [r[:4] for r in rows[1:]] == [["n2", "FAIL", "RESET_GPU", "1"], ["n1", "PASS", "", "0"]]
    assert rows[1][4].startswith("n2 gpu3 (") and "[ecc_errors]" in rows[1][4]

    # An output that cannot be written is reported; every other one is still written.
    (tmp_path / "verdicts.json").unlink()
    nowhere = tmp_path / "no such folder" / "verdicts.csv"
    run = suite(tree, facts, tmp_path, f"--verdicts-csv={nowhere}")
    assert run.returncode == 1, run.stdout + run.stderr
    assert "gpuhealth: verdicts CSV not written to" in run.stdout
    assert (tmp_path / "verdicts.json").is_file()


@pytest.mark.suite
def test_a_green_run_whose_verdicts_were_not_written_exits_red(tmp_path):
    """verdicts.json is what `gpuhealth act` and drain scripts read: a run that could not
    write it must not exit 0 and leave them the last run's. Its other reports are written."""
    facts = write_facts(tmp_path / "facts", n1=healthy_h100())
    reports = tmp_path / "r"
    (reports / "verdicts.json").mkdir(parents=True)  # the write's rename onto it fails
    run = run_suite(reports, "--facts", str(facts), "--profile", "h100-sxm", "-k", "ecc_errors")
    assert run.rc == 1, run.output
    assert f"verdicts not written to {reports / 'verdicts.json'}" in run.output
    assert set(run.outcomes().values()) == {"passed"} and (reports / "junit.xml").is_file()


@pytest.mark.parametrize("host", ["n1", "fe80::1", "a::b"])
def test_a_host_named_with_colons_keeps_its_test_name_and_check(host):
    """An IPv6 address as a host name: the test's name and check are read before its
    parameters, so `::` inside them does not cut the name (Allure's result name, JUnit's)."""
    nodeid = f"tests/test_gpu.py::test_ecc_errors[{host}-gpu0]"
    test = FinishedTest(nodeid, 0, 1, Record(host, 0, status="PASS", message="0 errors"))
    assert allure_sink.case(test).name == f"test_ecc_errors[{host}-gpu0]"
    assert test.check == "ecc_errors"
