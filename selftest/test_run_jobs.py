"""`gpuhealth run --jobs N`: the suite as N shards at once on one machine, merged into the
reports asked for, gives the report of one pytest process and exits as it would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhealth import jobs
from gpuhealth import report as reporting
from gpuhealth.jobs import JobsUsageError, ShardRun, jobs_count, report_paths
from selftest.facts import healthy_h100, write_facts
from selftest.suite import REPO, run_suite
from selftest.test_shards import _allure, _junit

FLEET = ("node5", "node6", "node7", "node8")  # shard 2/2 holds node5, 1/2 the others


def _jobs(tmp: Path, reports: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`gpuhealth run --jobs 2` on the suite, its reports under `reports` (as run_suite's)."""
    command = [
        *(sys.executable, "-m", "gpuhealth.cli", "run", "--jobs", "2", "--"),
        *("-c", str(REPO / "pytest.ini"), "--rootdir", str(REPO), str(REPO / "tests")),
        f"--junitxml={reports / 'junit.xml'}",
        f"--alluredir={reports / 'allure-results'}",
        f"--verdicts={reports / 'verdicts.json'}",
        *("--save-facts", str(reports / "facts")),
        *(f"--history={tmp / 'jobs.sqlite'}", "--history-create"),
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("jobs")
    docs = {host: healthy_h100() for host in FLEET}
    for number, doc in enumerate(docs.values()):  # its own GPUs: shards share one store
        for gpu in doc["gpus"]:
            gpu["serial"], gpu["uuid"] = gpu["serial"] + str(number), gpu["uuid"] + str(number)
    docs["node5"]["gpus"][3]["ecc"]["volatile"]["uncorrected"] = 4
    write_facts(tmp / "facts", **docs)
    return tmp


@pytest.mark.suite
def test_two_jobs_give_the_report_of_one_process(fleet):
    facts = ("--facts", str(fleet / "facts"), "--profile", "h100-sxm")
    whole = run_suite(fleet / "whole", *facts)
    jobs = _jobs(fleet, fleet / "out", *facts)
    assert whole.rc == 1, whole.output[-2000:]
    assert jobs.returncode == 1, jobs.stdout + jobs.stderr
    assert "shard 1/2: exit 0 (ok): " in jobs.stdout
    assert "shard 2/2: exit 1 (tests failed): 1 failed" in jobs.stdout
    assert "verdicts.json: 4 nodes: 3 PASS, 1 FAIL" in jobs.stdout
    failed_log = fleet / "out" / ".gpuhealth-jobs" / "shard2" / "pytest.log"
    assert f"shard 2/2's output: {failed_log}" in jobs.stdout
    assert "test_ecc_errors[node5-gpu3]" in failed_log.read_text()

    out = fleet / "out"
    mine = json.loads((out / "verdicts.json").read_text())
    theirs = whole.verdicts
    assert list(mine["nodes"]) == list(theirs["nodes"])
    assert mine["nodes"] == theirs["nodes"]
    assert _junit(out) == _junit(whole.reports)
    assert _allure(out) == _allure(whole.reports)
    # only the logs stay behind: the shards' reports were merged and moved
    left = sorted(p.name for p in (out / ".gpuhealth-jobs").rglob("*") if p.is_file())
    assert left == ["pytest.log", "pytest.log"]


@pytest.mark.suite
def test_a_usage_error_is_reported_once_with_the_shards_code(fleet):
    jobs = _jobs(fleet, fleet / "bad", "--facts", str(fleet / "facts"), "--profile", "nosuch")
    assert jobs.returncode == 4, jobs.stdout + jobs.stderr
    assert "shard 1/2: exit 4 (usage error)" in jobs.stdout
    assert jobs.stderr.count("nosuch") == 1, jobs.stderr
    assert jobs.stderr.startswith("shard 1/2 (log "), jobs.stderr
    assert ", 2/2 (log " in jobs.stderr
    assert not (fleet / "bad" / "verdicts.json").exists()  # nothing merged


@pytest.mark.parametrize(
    "args, refused",
    [
        (["-n", "4"], "-n"),
        (["-n4"], "-n"),
        (["--numprocesses=2"], "--numprocesses"),
        (["--shard", "1/2"], "--shard"),
        (["--prometheus-textfile-dir=/tmp"], "--prometheus"),
        (["--collect-only"], "--collect-only"),
        (["--co", "-q"], "--co"),
    ],
)
def test_options_that_make_no_sense_with_jobs_are_refused(args, refused):
    with pytest.raises(JobsUsageError, match=f"^{refused}.* cannot be given with --jobs"):
        report_paths(["--facts", "f", *args], Path("/x"))


def test_reports_go_where_pytest_args_ask_else_to_reports(tmp_path):
    wanted = report_paths(["--verdicts", "v/a.json", "--junit-xml=j.xml"], tmp_path)
    assert wanted == {
        "verdicts.json": tmp_path / "v/a.json",
        "junit.xml": tmp_path / "j.xml",
        "allure-results": tmp_path / "reports/allure-results",
        "facts": tmp_path / "reports/facts",
    }
    assert jobs_count("3") == 3
    assert jobs_count("auto") >= 1


def test_a_merge_failure_is_exit_2_with_the_merges_message(tmp_path, monkeypatch, capsys):
    """Two shards that both judged node1 (as shards of different fleets would): no merged
    report, the shards' folders kept to look at."""

    def start(args: list[str], count: int, base: Path) -> list[ShardRun]:
        runs = []
        for index in range(1, count + 1):
            folder = base / f"shard{index}"
            folder.mkdir(parents=True)
            node = reporting.NodeVerdict("node1", counts={"PASS": 1})
            reporting.write_json([node], folder / "verdicts.json", {"hosts": ["node1"]})
            (folder / "pytest.log").write_text("1 passed in 0.10s\n")
            runs.append(ShardRun(f"{index}/{count}", folder, subprocess.Popen(["true"])))
        return runs

    monkeypatch.setattr(jobs, "start", start)
    assert jobs.run(2, ["--verdicts", "out/v.json"], tmp_path) == 2
    said = capsys.readouterr()
    assert "shard 2/2: exit 0 (ok): 1 passed in 0.10s" in said.out
    assert "gpuhealth run: merge failed: host node1 is in" in said.err
    assert "shards overlap" in said.err
    assert not (tmp_path / "out/v.json").exists()
    assert (tmp_path / "out/.gpuhealth-jobs/shard2/verdicts.json").is_file()
