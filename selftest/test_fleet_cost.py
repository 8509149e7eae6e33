"""What each host costs once per run, held to its slower, plainer form (issue 24, item 5).

Judging 1,024 saved documents pays every per-document step 1,024 times: the screen for values
no report can store (documents._storable, before the walk that names a value's path) and the
facts document written for people in the Allure report (plugin.readable_json, instead of
json's pure-Python `indent`). Each must give what the plain form gives. With `-n N`, xdist's
controller pays for every test: its scheduling must not grow with the fleet.
"""

from __future__ import annotations

import gc
import json
import sys
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import pytest
from allure_commons.model2 import TestResult as AllureTestResult
from allure_commons.utils import md5
from xdist.scheduler import LoadScopeScheduling

from gpuhealth import documents, junit_results, plugin
from gpuhealth.allure_results import AllureResults, Case
from gpuhealth.plugin import XdistHostScheduling, readable_json
from selftest.facts import healthy_h100, write_facts
from selftest.mutations import FACT_VALUES, mutated_facts
from selftest.suite import run_suite
from selftest.test_fuzz import EXAMPLES, fuzz


def same_verdict(doc: dict[str, Any]) -> None:
    """The screen passes a document exactly when the walk with paths finds nothing in it."""
    found = documents._first_unstorable(doc)
    assert documents._storable(doc) == (found is None), found
    assert documents._unstorable(doc) == found


def test_the_screen_agrees_with_the_walk_on_damaged_documents():
    fuzz(mutated_facts(healthy_h100()), same_verdict, EXAMPLES // 4)


def nested(depth: int) -> Any:
    """A value `depth` containers deep (alternately objects and lists) around a text."""
    found: Any = "x"
    for level in range(depth):
        found = [found] if level % 2 else {"x": found}
    return found


@pytest.mark.parametrize(
    "value",
    [
        2**63 - 1,
        2**63,
        -(2**63),
        -(2**63) - 1,
        "a" * documents.MAX_TEXT,
        "a" * (documents.MAX_TEXT + 1),
        nested(documents.MAX_DEPTH - 1),
        nested(documents.MAX_DEPTH),
        float("-inf"),
        1e308,
        *FACT_VALUES,
    ],
)
def test_the_screen_agrees_with_the_walk_at_each_limit(value):
    doc = healthy_h100()
    doc["gpus"][2]["ecc"]["volatile"]["corrected"] = value
    same_verdict(doc)


def test_a_document_the_screen_doubts_is_named_by_the_walk():
    """A type JSON never gives (a tuple from a caller of validated()) is left to the walk."""
    doc = {"schema_version": 3, "odd": (1, 2)}
    assert not documents._storable(doc)
    assert documents._unstorable(doc) is None


def test_readable_json_reads_back_as_the_document_on_fewer_lines():
    doc = healthy_h100()
    text = readable_json(doc)
    assert json.loads(text) == doc
    assert text.count("\n") < json.dumps(doc, indent=1).count("\n") / 2
    lines = text.splitlines()
    # A counter group on one line; an object that nests one item per line, indented.
    assert any(line.strip().startswith('"volatile": {"corrected": 0') for line in lines)
    assert ' "gpus": [' in lines and "  {" in lines


def test_readable_json_writes_what_json_writes_for_any_value():
    def prop(doc: dict[str, Any]) -> None:
        text = readable_json(doc)
        assert "".join(text.split()) == "".join(json.dumps(doc).split())
        assert json.dumps(json.loads(text)) == json.dumps(doc)  # NaN compares unequal

    fuzz(mutated_facts(healthy_h100()), prop, EXAMPLES // 4)
    odd_keys = {1: [{"a": [1]}], None: {"x": {"y": 1}}, 1.5: "\u00e9\n", False: []}
    assert json.loads(readable_json(odd_keys)) == json.loads(json.dumps(odd_keys))


@pytest.mark.suite
def test_the_facts_attachment_is_the_document(tmp_path):
    doc = healthy_h100()
    facts = write_facts(tmp_path / "facts", n1=doc)
    run = run_suite(tmp_path / "r", "--facts", str(facts), "--profile", "h100-sxm")
    assert run.rc == 0, run.output
    attached = list((tmp_path / "r" / "allure-results").glob("*-attachment.json"))
    assert len(attached) == 1
    assert json.loads(attached[0].read_text()) == documents.validated(doc, "n1")


def plain_result(case: Case, uuid: str) -> dict[str, Any]:
    """An Allure result as allure-pytest's model gives it: a plain dict, every field."""
    test = f"{case.nodeid.partition('::')[0].removesuffix('.py').replace('/', '.')}#"
    test += case.nodeid.partition("::")[2].partition("[")[0]
    result: dict[str, Any] = {
        "uuid": uuid,
        "historyId": md5(test, *(v for _, v in sorted(case.parameters))),
        "testCaseId": md5(test),
        "fullName": test,
        "titlePath": case.nodeid.partition("::")[0].split("/"),
        "name": case.name,
        "status": case.status,
        "stage": "finished",
        "start": case.start_ms,
        "stop": case.stop_ms,
        "labels": [{"name": n, "value": v} for n, v in case.labels],
        "parameters": [{"name": n, "value": v} for n, v in case.parameters],
    }
    details = {"message": case.message, "trace": case.trace}
    if case.message or case.trace:
        result["statusDetails"] = {k: v for k, v in details.items() if v}
    if case.description:
        result["description"] = case.description
    if case.attachments:
        result["attachments"] = case.attachments
    return result


CASES = [
    Case(
        "tests/test_gpu.py::test_ecc_errors[n1-gpu3]",
        "test_ecc_errors[n1-gpu3]",
        "passed",
        "",
        "",
        1,
        2,
        [("parentSuite", "n1"), ("host", "n1"), ("gpu", "3")],
        [("gpuhealth_host", "n1"), ("gpu", "3")],
        "Uncorrectable ECC",
        [],
    ),
    Case(
        'tests/sub/test_x.py::test_y[h\u00e9"<&>-gpu0]',
        'test_y[h\u00e9"<&>]',
        "failed",
        "FAIL: \u2603 4 > 0.\nAction RMA",
        "trace\tline",
        1700000000000,
        1700000000001,
        [("host", 'h\u00e9"<&>'), ("tag", "WARN"), ("serial", "\x00\x7f")],
        [("gpuhealth_host", 'h\u00e9"<&>'), ("a", "z")],
        "",
        [{"name": "facts n1.json", "source": "x-attachment.json", "type": "application/json"}],
    ),
    Case(
        "tests/test_node.py::test_driver",
        "test_driver",
        "skipped",
        "",
        "only trace",
        0,
        0,
        [],
        [],
        "\U0001f600 summary",
        [],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=["passed", "odd-text", "no-params"])
def test_an_allure_result_is_what_json_writes_for_the_plain_result(case, tmp_path):
    """Results are written from pre-encoded fragments (AllureResults.write): byte for byte
    what json.dumps writes for the result as a plain dict, read by Allure's own model."""
    results = AllureResults(tmp_path, clean=False, background=False)
    results.write(case)
    results.write(case)
    first, second = sorted(tmp_path.glob("*-result.json"))
    for path in (first, second):
        text = path.read_text()
        uuid = path.name.removesuffix("-result.json")
        assert text == json.dumps(plain_result(case, uuid))
        AllureTestResult(**json.loads(text))
        assert str(UUID(uuid)) == uuid
    assert first.name != second.name


def test_text_that_needs_no_escaping_is_written_as_it_is_and_any_other_escaped():
    """JUnit's attribute values skip the escaping only where it would change nothing."""
    texts = [chr(c) for c in range(0x2FF)] + ["tests/test_gpu.py", "a&b", "\ud800", "\U0001f600"]
    texts += ["test_x[n1-gpu3]", 'x"y', "tab\there", "\x7f", "~"]
    for text in texts:
        assert junit_results.attribute(text) == junit_results._legal(text).translate(
            junit_results._ATTRIBUTE
        ), repr(text)


QUIET = SimpleNamespace(loadscopesched=lambda *args: None)  # xdist's log, unprinted


class Worker:
    """What xdist's scheduler sees of a worker: the test indexes it was sent."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []
        self.done = 0

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent += indexes

    def shutdown(self) -> None:
        self.shutting_down = True


def schedule(scheduler: Any, ids: list[str], crash: int | None = None) -> list[Worker]:
    """Two workers collect `ids` and run what they are sent, in turn, one test at a time
    (the first worker is lost after `crash` tests, as xdist reports it)."""
    workers = [Worker("gw0"), Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, list(ids))
    scheduler.schedule()
    while any(w.done < len(w.sent) for w in workers if w in scheduler.assigned_work):
        for worker in [w for w in workers if w in scheduler.assigned_work]:
            if worker is workers[0] and worker.done == crash:
                scheduler.remove_node(worker)
            elif worker.done < len(worker.sent):
                scheduler.mark_test_complete(worker, worker.sent[worker.done])
                worker.done += 1
    return workers


def fleet_ids(hosts: int) -> tuple[list[str], dict[str, str]]:
    """Test ids of `hosts` 2-GPU nodes, grouped by host as plugin.host_groups groups them."""
    ids, groups = [], {}
    for host in (f"n{h}" for h in range(hosts)):
        groups[host] = host
        ids += [f"tests/test_node.py::test_driver_version[{host}]"]
        for gpu in (f"{host}-gpu0", f"{host}-gpu1"):
            groups[gpu] = host
            ids += [f"tests/test_gpu.py::test_{check}[{gpu}]" for check in ("ecc", "power")]
    return ids, groups


def test_hosts_are_scheduled_as_xdist_schedules_them_at_a_flat_cost():
    ids, groups = fleet_ids(40)
    config = SimpleNamespace(getvalue=lambda name: ["2*popen"], option=SimpleNamespace())
    config.option.loadscopereorder = False
    ours = XdistHostScheduling(groups).pytest_xdist_make_scheduler(config, QUIET)
    theirs = LoadScopeScheduling(config, QUIET)
    theirs._split_scope = ours._split_scope  # xdist's own, a host a scope
    counted: list[int] = []
    pending_of = ours._pending_of
    ours._pending_of = lambda units: counted.append(len(units)) or pending_of(units)
    got, want = schedule(ours, ids), schedule(theirs, ids)
    assert [w.sent for w in got] == [w.sent for w in want]
    assert sorted(got[0].sent + got[1].sent) == list(range(len(ids)))
    assert max(counted) <= 3  # a worker's unfinished hosts, not every host it was given
    hosts = [{groups[ids[i].rpartition("[")[2][:-1]] for i in w.sent} for w in got]
    assert not hosts[0] & hosts[1]  # each host's tests on one worker


def test_a_lost_worker_hands_back_only_its_unfinished_tests():
    ids, groups = fleet_ids(10)
    config = SimpleNamespace(getvalue=lambda name: ["2*popen"], option=SimpleNamespace())
    config.option.loadscopereorder = False
    ours = XdistHostScheduling(groups).pytest_xdist_make_scheduler(config, QUIET)
    lost, kept = schedule(ours, ids, crash=7)
    ran = lost.sent[: lost.done] + kept.sent[: kept.done]
    assert sorted(ran) == list(range(len(ids)))  # every test once, none twice


@pytest.mark.parametrize("command_line", [True, False])
def test_a_finished_run_is_left_out_of_garbage_collection_only_from_a_command_line(
    command_line, monkeypatch
):
    """pytest's last collections and the interpreter's at exit walk the whole run; a program
    that called pytest.main() keeps running and must get its memory back."""
    config = SimpleNamespace(stash={plugin._STATE: object()})
    config.invocation_params = SimpleNamespace(args=("--facts", "f") if command_line else ())
    monkeypatch.setattr(sys, "argv", ["pytest", "--facts", "f"])
    before = gc.get_freeze_count()
    try:
        plugin.pytest_unconfigure(config)
        assert (gc.get_freeze_count() > before) == command_line
    finally:
        gc.unfreeze()


@pytest.mark.parametrize("command_line", [True, False])
def test_a_suite_process_collects_garbage_less_often_only_from_a_command_line(
    command_line, monkeypatch
):
    """pytest keeps every report: full collections at Python's default thresholds walk them
    again and again. A program that called pytest.main() keeps its own thresholds."""
    config = SimpleNamespace(invocation_params=SimpleNamespace(args=("--facts", "f")))
    monkeypatch.setattr(sys, "argv", ["pytest", "--facts", "f"] if command_line else ["prog"])
    before = gc.get_threshold()
    try:
        plugin._collect_garbage_less(config)
        assert (gc.get_threshold() == plugin.GC_THRESHOLDS) == command_line
    finally:
        gc.set_threshold(*before)
