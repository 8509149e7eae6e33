"""A fleet split across CI jobs (`pytest --shard K/N`) and merged back (`gpuhealth merge`)
gives the report of the unsharded run: the same verdicts, JUnit test cases and Allure results,
and each shard's run in the one store they share."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gpuhealth import report as reporting
from gpuhealth.config import ConfigError
from gpuhealth.history.store import Store
from gpuhealth.shards import MergeError, Shard, merge
from selftest.facts import healthy_h100, write_facts
from selftest.suite import run_suite

# Shard 1 of 2 holds node6-node8, shard 2 node5 (a hash of the name decides).
FLEET = ("node5", "node6", "node7", "node8")


@pytest.mark.parametrize("text", ["0/2", "3/2", "2", "a/b", "1/0", "-1/2", "1/2/3"])
def test_a_shard_is_k_of_n(text):
    with pytest.raises(ConfigError, match="give K/N with 1 <= K <= N"):
        Shard.parse(text)


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_every_host_is_in_exactly_one_shard(count):
    hosts = [f"gpu{i:05d}" for i in range(2000)]
    shards = [Shard.parse(f"{k}/{count}") for k in range(1, count + 1)]
    held = [[h for h in hosts if shard.holds(h)] for shard in shards]
    assert sorted(h for part in held for h in part) == hosts
    # a hash, not the place in the list: with half the hosts gone, the rest stay put
    half = hosts[::2]
    kept = set(half)
    assert [shard.select(half, str) for shard in shards] == [
        [h for h in part if h in kept] for part in held
    ]
    assert all(len(part) > 2000 / count * 0.85 for part in held)  # and they come out even


def _suite(reports: Path, facts: Path, *args: str):
    return run_suite(reports, "--facts", str(facts), "--profile", "h100-sxm", *args)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """The fleet (one node failing ECC, one with a broken facts document) judged whole, and
    as two shards run at the same time into one new store, then merged."""
    tmp = tmp_path_factory.mktemp("shards")
    docs = {host: healthy_h100() for host in FLEET}
    for number, doc in enumerate(docs.values()):  # each node its own GPUs, as in a fleet
        for gpu in doc["gpus"]:
            gpu["serial"] = f"{gpu['serial'][:-1]}{number}"
            gpu["uuid"] = f"{gpu['uuid'][:-1]}{number}"
    docs["node5"]["gpus"][3]["ecc"]["volatile"]["uncorrected"] = 4
    facts = write_facts(tmp / "facts", **docs)
    (facts / "node7.json").write_text('{"schema_version": 3, "gpus": "none"}')
    whole = _suite(tmp / "whole", facts)
    store = tmp / "shared.sqlite"
    with ThreadPoolExecutor(2) as pool:
        shards = list(
            pool.map(
                lambda k: _suite(
                    tmp / f"shard{k}",
                    facts,
                    f"--shard={k}/2",
                    f"--history={store}",
                    "--history-create",
                ),
                (1, 2),
            )
        )
    merged = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuhealth.cli",
            "merge",
            str(tmp / "merged"),
            str(tmp / "shard1"),
            str(tmp / "shard2"),
        ],
        capture_output=True,
        text=True,
    )
    return {"tmp": tmp, "whole": whole, "shards": shards, "merged": merged, "store": store}


def _junit(folder: Path) -> tuple[dict[str, str], dict[tuple[str, str], list[Any]]]:
    """The counts and test cases of a JUnit file (the objects' addresses a traceback of an
    error shows left out: they differ from one process to the next)."""
    suite = ET.parse(folder / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    counts = {k: suite.get(k, "") for k in ("tests", "failures", "errors", "skipped")}
    cases = {
        (c.get("classname", ""), c.get("name", "")): [
            (x.tag, x.get("message"), re.sub(" at 0x[0-9a-f]+", "", x.text or "")) for x in c
        ]
        for c in suite
    }
    return counts, cases


def _allure(folder: Path) -> list[tuple[str, str, str, str | None]]:
    found = []
    for path in (folder / "allure-results").glob("*-result.json"):
        result = json.loads(path.read_text())
        message = result.get("statusDetails", {}).get("message")
        found.append(
            (result["fullName"], json.dumps(result["parameters"]), result["status"], message)
        )
    return sorted(found)


@pytest.mark.suite
def test_two_shards_merge_into_the_unsharded_report(runs):
    whole, shards, merged = runs["whole"], runs["shards"], runs["merged"]
    assert whole.rc == 1, whole.output[-2000:]
    assert [s.rc for s in shards] == [1, 1], shards[1].output[-2000:]
    assert merged.returncode == 0, merged.stderr
    assert [sorted(s.verdicts["nodes"]) for s in shards] == [["node6", "node7", "node8"], ["node5"]]
    assert [s.verdicts["shard"] for s in shards] == ["1/2", "2/2"]
    assert "shard" not in whole.verdicts
    assert "verdicts.json: 4 nodes: 2 PASS, 2 FAIL" in merged.stdout

    out = runs["tmp"] / "merged"
    mine = json.loads((out / "verdicts.json").read_text())
    theirs = whole.verdicts
    volatile = {"generated_at", "history", "shards"}
    assert {k: v for k, v in mine.items() if k not in volatile} == {
        k: v for k, v in theirs.items() if k not in volatile
    }
    assert mine["nodes"]["node7"]["verdict"] == "FAIL"  # its tests errored: broken facts
    assert list(mine["nodes"]) == list(theirs["nodes"])  # worst first, as a run orders them

    assert _junit(out) == _junit(whole.reports)
    # the fleet-level test (multi-node NCCL) every shard skipped alike is there once
    assert sum(name.startswith("test_nccl_multinode") for _, name in _junit(out)[1]) == 1
    assert _allure(out) == _allure(whole.reports)
    environment = (out / "allure-results/environment.properties").read_text()
    assert environment == (whole.reports / "allure-results/environment.properties").read_text()
    assert "verdicts=4 nodes: 2 PASS, 2 FAIL" in environment


@pytest.mark.suite
def test_both_shards_recorded_their_own_run_in_the_shared_store(runs):
    store = Store(f"sqlite:///{runs['store']}", runs["tmp"])
    try:
        recorded = store.runs()
    finally:
        store.close()
    assert sorted(sorted(run["nodes"]) for run in recorded) == [
        ["node5"],
        ["node6", "node7", "node8"],
    ]
    merged = json.loads((runs["tmp"] / "merged/verdicts.json").read_text())
    assert sorted(merged["history"]["runs"]) == sorted(run["uid"] for run in recorded)


@pytest.mark.suite
def test_merge_refuses_what_is_not_one_fleet(runs, tmp_path):
    tmp = runs["tmp"]
    with pytest.raises(MergeError, match="host node5 is in .* shards overlap"):
        merge(tmp_path / "twice", [tmp / "shard2", tmp / "whole"])
    with pytest.raises(MergeError, match="shard 2/2 is missing: give every shard's folder"):
        merge(tmp_path / "half", [tmp / "shard1"])
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "verdicts.json").write_text((tmp / "shard2/verdicts.json").read_text())
    with pytest.raises(
        MergeError, match=f"junit.xml is in some shards' folders but not in {partial}"
    ):
        merge(tmp_path / "out", [tmp / "shard1", partial])
    with pytest.raises(MergeError, match="no verdicts.json"):
        merge(tmp_path / "out", [tmp / "shard1", tmp_path])


def _shard(folder: Path, host: str, fleet_case: str) -> Path:
    """A shard's report folder: one node's verdict and a JUnit file with one test of that
    node and one fleet-level test (`fleet_case`: its result element)."""
    folder.mkdir()
    node = reporting.NodeVerdict(
        host, counts={"PASS": 1, "WARN": 0, "FAIL": 0, "SKIP": 0, "ERROR": 0}
    )
    reporting.write_json([node], folder / "verdicts.json", {"hosts": [host], "source": "pytest"})
    (folder / "junit.xml").write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="gpuhealth" '
        'tests="2" time="1.0" timestamp="2026-11-27T00:00:00" hostname="ci">'
        f'<testcase classname="tests.test_gpu" name="test_driver[{host}]" time="0.1" />'
        f'<testcase classname="tests.test_nccl" name="test_nccl_multinode[fleet]" time="9">'
        f"{fleet_case}</testcase></testsuite></testsuites>"
    )
    return folder


def test_a_fleet_level_test_the_shards_ended_differently_is_kept_per_shard(tmp_path):
    """Multi-node NCCL at --level full runs over each shard's own hosts: different results
    are different measurements, each kept and named after its shard."""
    one = _shard(tmp_path / "a", "n1", '<failure message="busbw 10 &lt; 40">slow</failure>')
    two = _shard(tmp_path / "b", "n2", "")
    merge(tmp_path / "out", [one, two])
    counts, cases = _junit(tmp_path / "out")
    assert counts == {"tests": "4", "failures": "1", "errors": "0", "skipped": "0"}
    assert set(cases) == {
        ("tests.test_gpu", "test_driver[n1]"),
        ("tests.test_gpu", "test_driver[n2]"),
        ("tests.test_nccl", f"test_nccl_multinode[fleet] ({one})"),
        ("tests.test_nccl", f"test_nccl_multinode[fleet] ({two})"),
    }


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("shard", 2, "'shard' is not a str"),
        ("hosts", 5, "'hosts' is not a list"),
        ("hosts", [1], "'hosts' is not a list of host names"),
        ("history", "x", "'history' is not a dict"),
        ("source", [], "'source' is not a str"),
    ],
)
def test_a_verdicts_json_with_odd_run_fields_is_a_merge_error(tmp_path, field, value, message):
    """A hand-edited or foreign verdicts.json: the merge names the file and the field."""
    one, two = _shard(tmp_path / "a", "n1", ""), _shard(tmp_path / "b", "n2", "")
    path = two / "verdicts.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: value}))
    with pytest.raises(MergeError, match=f"{path}: {message}"):
        merge(tmp_path / "out", [one, two])


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("x-result.json", '{"uuid": "x", "name"'),  # the shard's job cut off while writing
        ("x-result.json", '{"uuid": "x", "historyId": "h", "name": "t"}'),
        ("g-globals.json", '{"attach'),
    ],
)
def test_an_allure_file_cut_short_is_a_merge_error(tmp_path, name, body):
    one, two = _shard(tmp_path / "a", "n1", ""), _shard(tmp_path / "b", "n2", "")
    for folder in (one, two):
        (folder / "allure-results").mkdir()
    (two / "allure-results" / name).write_text(body)
    with pytest.raises(MergeError, match=f"{two / 'allure-results' / name}: not what Allure"):
        merge(tmp_path / "out", [one, two])


def test_a_merge_into_a_folder_that_holds_files_is_refused(tmp_path):
    """A CI job's merge step run again into its earlier OUT: the error said a host's facts
    were in two shards."""
    one, two = _shard(tmp_path / "a", "n1", ""), _shard(tmp_path / "b", "n2", "")
    merge(tmp_path / "out", [one, two])
    with pytest.raises(MergeError, match=r"out is not empty \(an earlier merge\?\)"):
        merge(tmp_path / "out", [one, two])


def test_a_shard_that_held_no_host_adds_no_test(tmp_path):
    """More shards than a small fleet fills: an empty shard's stand-ins (`test_driver[NOTSET]`,
    skipped: pytest's empty parameter set) are no tests of the fleet's report, as the
    unsharded run has none; only a fleet with no host at all keeps them."""
    one = _shard(tmp_path / "a", "n1", "")
    empty = tmp_path / "empty"
    empty.mkdir()
    reporting.write_json([], empty / "verdicts.json", {"hosts": [], "source": "pytest"})
    (empty / "junit.xml").write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="gpuhealth" '
        'tests="1" time="0.1" timestamp="2026-11-27T00:00:00" hostname="ci">'
        '<testcase classname="tests.test_gpu" name="test_driver[NOTSET]" time="0">'
        '<skipped message="got empty parameter set" /></testcase></testsuite></testsuites>'
    )
    for folder in (one, empty):
        (folder / "allure-results").mkdir()
    result = {"uuid": "u1", "historyId": "h1", "name": "test_driver[NOTSET]", "status": "skipped"}
    (empty / "allure-results" / "u1-result.json").write_text(json.dumps(result))
    merge(tmp_path / "out", [one, empty])
    counts, cases = _junit(tmp_path / "out")
    assert counts["tests"] == "2" and ("tests.test_gpu", "test_driver[NOTSET]") not in cases
    assert not (tmp_path / "out" / "allure-results" / "u1-result.json").exists()
    merge(tmp_path / "none", [empty])
    assert ("tests.test_gpu", "test_driver[NOTSET]") in _junit(tmp_path / "none")[1]
