"""`gpuhealth triage` and `gpuhealth node-check` drive the sinks as the suite does: an output
registered for them (sinks.ENTRY_POINTS) gets every finding and the verdicts; one that fails
is named on stderr, stops no other and never turns a node's FAIL (or a failed output) into a
pass; and each entry point opens its own outputs only."""

from __future__ import annotations

import errno
import json
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhealth import cli, sinks
from gpuhealth.integrations import nodecheck, prometheus
from gpuhealth.local import LocalVerdict, judge_facts
from gpuhealth.report import NodeVerdict
from gpuhealth.sinks import FinishedTest, Record, RunEnd, RunInfo, Sink, Sinks
from selftest.facts import healthy_h100, limits

TICKET = (
    Path(__file__).parent
    / "data"
    / "tickets"
    / "ticket_h100_gsp-heartbeat_table_dmesg_ibstat_nccl.txt"
)
H100 = ["--profile", "h100-sxm", "--expected-gpus", "8"]


class Kept(Sink):
    """Keeps what it is fed (the class, so a test reads it after the run)."""

    name = "kept"
    entry = ""
    hosts: list[str] = []
    statuses: list[tuple[str, int | None, str, str]] = []
    phases: dict[str, tuple[str, bool]] = {}  # test id -> how it ended (when, skipped)
    verdicts: list[str] = []

    def open(self, run: RunInfo) -> bool:
        Kept.entry, Kept.hosts, Kept.statuses, Kept.verdicts = run.entry, [], [], []
        Kept.phases = {}
        return True

    def host(self, host: str, record: Record) -> None:
        Kept.hosts.append(host)

    def outcome(self, test: FinishedTest) -> None:
        Kept.statuses += test.statuses()
        Kept.phases[test.nodeid] = (test.when, test.skipped)

    def close(self, end: RunEnd) -> None:
        Kept.verdicts = [f"{v.host} {v.verdict}" for v in end.verdicts]


class Broken(Sink):
    """Fails at the first finding."""

    name = "broken"

    def open(self, run: RunInfo) -> bool:
        return True

    def outcome(self, test: FinishedTest) -> None:
        raise OSError("disk full")

    def close(self, end: RunEnd) -> None:
        raise AssertionError("a sink that failed is not closed")


@pytest.fixture
def register(monkeypatch) -> Iterator:
    """`register(entry, *names)`: the entry point opens these sinks, in this order; `kept`
    and `broken` are the modules of Kept and Broken, as if in gpuhealth.sinks."""
    for name, kind in (("kept", Kept), ("broken", Broken)):
        module = types.ModuleType(f"gpuhealth.sinks.{name}")
        module.SINK = kind  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, module.__name__, module)

    def register(entry: str, *names: str) -> None:
        monkeypatch.setitem(sinks.ENTRY_POINTS, entry, names)
        sinks.registered.cache_clear()

    yield register
    sinks.registered.cache_clear()


def test_each_entry_point_opens_its_own_outputs():
    suite = {kind.__module__ for kind in sinks.registered()}
    assert suite == {f"gpuhealth.sinks.{name}" for name in sinks.NAMES}
    assert not suite & {"gpuhealth.sinks.triage", "gpuhealth.sinks.node_check"}
    assert [k.__module__ for k in sinks.registered("triage")] == ["gpuhealth.sinks.triage"]
    assert [k.__name__ for k in sinks.registered("node-check")] == [
        "NodeCheckSink",
        "PrometheusSink",
        "SlurmSink",
    ]


# ---------------------------------------------------------------- triage


def test_a_registered_output_gets_triage_findings_and_verdicts(register, capsys):
    register("triage", "triage", "kept")
    status = cli.main(["triage", str(TICKET), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert status == cli.EXIT_FAIL and doc["verdict"] == "FAIL"
    assert Kept.entry == "triage"
    assert Kept.hosts == [TICKET.stem]
    assert Kept.statuses == [
        (f["host"], f["gpu"], f["check"], f["status"]) for f in doc["findings"]
    ]
    assert Kept.verdicts == [f"{TICKET.stem} FAIL"]


def test_a_failing_output_of_triage_stops_no_other_and_is_no_verdict(register, capsys):
    register("triage", "broken", "triage", "kept")
    status = cli.main(["triage", str(TICKET)])
    out, err = capsys.readouterr()
    assert out.endswith("verdict: FAIL\n")  # triage's own output, after the broken one
    assert Kept.verdicts == [f"{TICKET.stem} FAIL"]
    assert err == "gpuhealth triage: broken not written: OSError: disk full\n"
    assert status == cli.EXIT_BUG  # not 0, and not a verdict on the evidence


# ---------------------------------------------------------------- node-check


def judged(ecc_errors: int) -> LocalVerdict:
    """A node-check judgement of an H100 node with `ecc_errors` on gpu3, as the probe would
    have given it."""
    facts = healthy_h100()
    facts["gpus"][3]["ecc"]["volatile"]["uncorrected"] = ecc_errors
    profile = limits("h100-sxm")
    verdict, outcomes = judge_facts("n9", facts, profile)
    return LocalVerdict("n9", verdict, outcomes, time.time() - 2, 1.5, facts, profile)


def node_check(monkeypatch, ecc_errors: int, *args: str) -> int:
    monkeypatch.setattr(nodecheck, "judge_here", lambda chosen, target: judged(ecc_errors))
    return cli.main(["node-check", "--host", "n9", *H100, *args])


def test_a_registered_output_gets_node_check_findings_and_verdict(register, monkeypatch, capsys):
    register("node-check", "node_check", "kept")
    assert node_check(monkeypatch, 3, "--json") == nodecheck.EXIT_FAIL
    doc = json.loads(capsys.readouterr().out)
    assert Kept.entry == "node-check"
    assert Kept.hosts == ["n9"]  # what it measured: an exporter's rows
    assert ("n9", 3, "ecc_errors", "FAIL") in Kept.statuses
    assert len(Kept.statuses) == len(judged(3).outcomes)
    # Each finding ends as the suite's test of it would, for a sink that reads phases.
    assert Kept.phases["node-check::ecc_errors[n9-gpu3]"] == ("call", False)
    assert Kept.phases["node-check::ecc_errors[n9-gpu0]"] == ("", False)
    skipped = [s for s in Kept.statuses if s[3] == "SKIP"]
    assert skipped and all(
        Kept.phases[f"node-check::{check}[n9{'' if gpu is None else f'-gpu{gpu}'}]"]
        == ("setup", True)
        for _, gpu, check, _ in skipped
    )
    assert Kept.verdicts == ["n9 FAIL"] and doc["verdict"] == "FAIL"


@pytest.mark.parametrize("ecc_errors", [0, 3])
def test_a_failing_output_of_node_check_stops_no_other_and_never_passes(
    register, monkeypatch, capsys, tmp_path, ecc_errors
):
    register("node-check", "broken", "node_check", "prometheus", "kept")
    status = node_check(
        monkeypatch, ecc_errors, "--json", "--prometheus-textfile-dir", str(tmp_path)
    )
    out, err = capsys.readouterr()
    verdict = "PASS" if not ecc_errors else "FAIL"
    assert json.loads(out)["verdict"] == verdict
    assert (
        f'gpuhealth_node_verdict{{host="n9",verdict="{verdict}"}} 1.0'
        in (tmp_path / prometheus.FILE_NAME).read_text()
    )
    assert Kept.verdicts == [f"n9 {verdict}"]
    assert err == "gpuhealth node-check: broken not written: OSError: disk full\n"
    assert status == nodecheck.EXIT_FAIL  # a healthy node whose output failed fails closed


def test_node_check_fails_closed_on_a_textfile_it_cannot_write(monkeypatch, capsys, tmp_path):
    nowhere = tmp_path / "missing"
    status = node_check(monkeypatch, 0, "--prometheus-textfile-dir", str(nowhere))
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].startswith("n9: PASS (")
    assert err.startswith(f"gpuhealth node-check: cannot write {nowhere / prometheus.FILE_NAME}: ")
    assert status == nodecheck.EXIT_FAIL


class Unwritable:
    """A standard output that fails on write (an I/O error, not the reader leaving)."""

    def write(self, text: str) -> int:
        raise OSError(errno.EIO, "Input/output error")

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(
    ("ecc_errors", "npd"), [(0, nodecheck.NPD_UNKNOWN), (3, nodecheck.NPD_PROBLEM)]
)
def test_an_npd_answer_that_was_not_written_never_says_healthy(
    monkeypatch, capsys, ecc_errors, npd
):
    """NPD reads the line and the exit code: a line that could not be written leaves a
    healthy node unknown to it (never OK), a failing one a problem."""
    monkeypatch.setattr(sys, "stdout", Unwritable())
    status = node_check(monkeypatch, ecc_errors, "--npd")
    err = capsys.readouterr().err
    assert err.startswith("gpuhealth node-check: node-check output not written: OSError: ")
    assert status == npd


def test_the_reader_leaving_is_not_an_output_failing(tmp_path):
    class Closed(Broken):
        def outcome(self, test: FinishedTest) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    run = RunInfo(["n1"], "quick", None, None, None, entry="triage")
    fed = Sinks(run, (Closed, Kept))
    fed.outcome(FinishedTest("triage::ecc_errors[n1-gpu0]", 0, record=Record("n1", 0)))
    fed.close(RunEnd([NodeVerdict("n1")], [], True, 0))
    assert fed.reader_left and fed.problems == []
    assert Kept.verdicts == ["n1 PASS"]


def test_a_slurm_that_cannot_be_told_is_named_after_its_own_steps(monkeypatch):
    from gpuhealth.integrations import slurm

    said: list[str] = []
    monkeypatch.setattr(slurm, "act_on_self", lambda name, result, apply, say: say("slurm: x") or 1)
    options = types.SimpleNamespace(slurm=True, slurm_node="n9", apply=True, json=True)
    run = RunInfo(["n9"], "quick", None, options, None, entry="node-check")
    fed = Sinks(run, (sinks.registered("node-check")[2],))
    monkeypatch.setattr("builtins.print", lambda text, file=None: said.append(text))
    fed.close(RunEnd([NodeVerdict("n9", "FAIL")], [], True, 1))
    assert said == ["slurm: x"]
    assert fed.problems == ["Slurm not told node n9's FAIL: see above"]
