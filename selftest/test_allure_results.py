"""The Allure results gpuhealth writes itself (one file per test, one facts attachment per
host), the fleet summary in the terminal and the report, and the writer's failure modes.

The HTML rendering of these results is proven in the browser by the bed's end-to-end test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import attr
import pytest
from allure_commons.model2 import TestResult as AllureTestResult

from gpuhealth import allure_writer
from gpuhealth.allure_results import AllureResults, Case, report_config
from gpuhealth.junit_results import JUnitResults
from gpuhealth.report import FleetSummary, NodeVerdict
from selftest.facts import healthy_h100, write_facts
from selftest.suite import REPO, run_suite

INVENTORY = "all:\n  vars:\n    gpu_profile: h100-sxm\n  hosts:\n    n1:\n    n2:\n    n3:\n"


def results(folder: Path) -> dict[str, dict]:
    """Test name -> its Allure result."""
    found = {}
    for path in folder.glob("*-result.json"):
        doc = json.loads(path.read_text())
        found[doc["name"]] = doc
    return found


def labels(result: dict) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for label in result["labels"]:
        found.setdefault(label["name"], []).append(label["value"])
    return found


def faulty_fleet(tmp_path: Path) -> tuple[Path, Path]:
    """n1 healthy; n2 gpu3 uncorrected ECC (FAIL), gpu5 at 84 C (WARN); n3's
    facts file is not JSON (an error for that host)."""
    n2 = healthy_h100()
    n2["gpus"][3]["ecc"]["volatile"]["uncorrected"] = 4
    n2["gpus"][5]["temperature_c"] = 84
    facts = write_facts(tmp_path / "facts", n1=healthy_h100(), n2=n2)
    (facts / "n3.json").write_text("{ not json")
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    return facts, inventory


@pytest.mark.suite
def test_one_result_per_test_with_labels_statuses_and_one_facts_attachment_per_host(tmp_path):
    facts, inventory = faulty_fleet(tmp_path)
    run = run_suite(tmp_path / "r", "--facts", str(facts), "--inventory", str(inventory))
    folder = tmp_path / "r" / "allure-results"
    found = results(folder)
    junit = ET.parse(tmp_path / "r" / "junit.xml").getroot()
    assert len(found) == int(junit.find("testsuite").get("tests"))

    ecc = found["test_ecc_errors[n2-gpu3]"]
    assert ecc["status"] == "failed"
    assert (
        "volatile uncorrected ECC errors 4 > 0. Action RESET_GPU" in ecc["statusDetails"]["message"]
    )
    got = labels(ecc)
    assert (
        got["parentSuite"] == ["n2"] and got["suite"] == ["memory"] and got["subSuite"] == ["gpu3"]
    )
    assert got["host"] == ["n2"] and got["gpu"] == ["3"] and got["check"] == ["ecc_errors"]
    assert got["severity"] == ["critical"] and got["profile"] == ["h100-sxm"]
    assert got["action"] == ["RESET_GPU"]
    assert got["serial"] == [healthy_h100()["gpus"][3]["serial"]]
    assert ecc["fullName"] == "tests.test_gpu#test_ecc_errors"
    assert {p["name"]: p["value"] for p in ecc["parameters"]} == {
        "gpuhealth_host": "n2",
        "gpu": "3",
    }

    warm = found["test_temperature[n2-gpu5]"]
    assert warm["status"] == "passed"  # a WARN passes, tagged, with its message and action
    assert labels(warm)["tag"] == ["WARN"] and labels(warm)["action"] == ["INSPECT"]
    assert "temperature 84 C" in warm["statusDetails"]["message"]

    broken = found["test_ecc_errors[n3-gpu0]"]
    assert broken["status"] == "broken" and "n3.json" in broken["statusDetails"]["message"]
    skipped = found["test_nccl_bandwidth[n1]"]
    assert skipped["status"] == "skipped"
    assert skipped["statusDetails"]["message"].startswith("not run at level quick")
    assert labels(found["test_ecc_errors[n1-gpu0]"]).get("action") is None

    facts_files = sorted(folder.glob("*-attachment.json"))
    assert len(facts_files) == 2  # n1 and n2; n3 has no facts to attach
    attached = [a for r in found.values() for a in r.get("attachments", [])]
    assert sorted(a["name"] for a in attached) == ["facts n1.json", "facts n2.json"]
    assert {(folder / a["source"]).is_file() for a in attached} == {True}
    # Few files: one per test, one per host's facts, and the run's four.
    others = [p.name for p in folder.iterdir() if not p.name.endswith("-result.json")]
    assert len(others) == 2 + 4, others
    assert run.rc == 1


@pytest.mark.suite
def test_results_use_only_fields_of_the_allure_model(tmp_path):
    """Written by hand for speed, so checked against allure-commons' own TestResult model."""
    facts, inventory = faulty_fleet(tmp_path)
    run_suite(tmp_path / "r", "--facts", str(facts), "--inventory", str(inventory))
    model = {f.name for f in attr.fields(AllureTestResult)}
    for result in results(tmp_path / "r" / "allure-results").values():
        assert set(result) <= model, set(result) - model
        AllureTestResult(**result)


@pytest.mark.suite
def test_the_run_level_files_carry_the_fleet_summary(tmp_path):
    facts, inventory = faulty_fleet(tmp_path)
    run_suite(tmp_path / "r", "--facts", str(facts), "--inventory", str(inventory))
    folder = tmp_path / "r" / "allure-results"
    environment = (folder / "environment.properties").read_text().splitlines()
    assert environment[0] == "verdicts=3 nodes: 1 PASS, 2 FAIL"
    assert environment[1] == r"worst\ nodes=n2 FAIL RESET_GPU; n3 FAIL RERUN"
    (globals_file,) = folder.glob("*-globals.json")
    (page,) = json.loads(globals_file.read_text())["attachments"]
    overview = (folder / page["source"]).read_text()
    assert page["type"] == "text/html" and "<td>n1</td><td>PASS</td>" in overview
    assert overview.index("<td>n2</td>") < overview.index("<td>n1</td>")  # worst first
    categories = json.loads((folder / "categories.json").read_text())
    assert categories[0]["name"].startswith("RMA: ")


def test_the_allure_3_config_is_the_one_the_code_makes():
    """allurerc.json (categories by action code, for `make report`) is generated: regenerate
    it with `python -c 'import json; from gpuhealth.allure_results import report_config;
    print(json.dumps(report_config(), indent=2))' > allurerc.json`."""
    assert json.loads((REPO / "allurerc.json").read_text()) == report_config()


@pytest.mark.suite
def test_clean_alluredir_replaces_the_last_run_and_leaves_no_old_folder(tmp_path):
    facts, inventory = faulty_fleet(tmp_path)
    folder = tmp_path / "r" / "allure-results"
    folder.mkdir(parents=True)
    (folder / "stale-result.json").write_text("{}")
    stale = tmp_path / "r" / ".allure-results.old-deadbeef"  # left by a killed run
    stale.mkdir()
    run_suite(tmp_path / "r", "--facts", str(facts), "--inventory", str(inventory))
    assert not (folder / "stale-result.json").exists()
    assert results(folder)
    assert sorted(p.name for p in (tmp_path / "r").iterdir() if p.name.startswith(".allure")) == []


@pytest.mark.suite
def test_an_allure_folder_that_cannot_be_made_is_one_usage_error(tmp_path):
    facts, inventory = faulty_fleet(tmp_path)
    (tmp_path / "file").write_text("")
    run = run_suite(
        tmp_path / "r", "--facts", str(facts), f"--alluredir={tmp_path / 'file' / 'allure'}"
    )
    assert run.rc == 4, run.output
    assert "gpuhealth: cannot write Allure results to" in run.output
    assert "Traceback" not in run.output


def test_the_writer_refuses_names_that_leave_its_folder_and_says_what_failed(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    frames = b"".join(
        f"{name} {len(body)}\n".encode() + body
        for name, body in [("ok-result.json", b"{}"), ("../escape.json", b"x"), ("..", b"")]
    )
    proc = subprocess.run(
        [sys.executable, "-I", allure_writer.__file__, str(folder)],
        input=frames,
        capture_output=True,
    )
    assert (folder / "ok-result.json").read_bytes() == b"{}"
    assert not (tmp_path / "escape.json").exists()
    assert proc.returncode == 1
    assert b"2 Allure files not written (refused file name '../escape.json'" in proc.stderr


def test_a_writer_that_dies_is_replaced_by_writing_in_process(tmp_path):
    out = AllureResults(tmp_path / "a", clean=False, background=True)
    assert out._writer is not None
    out._writer.kill()
    out._writer.wait()
    case = Case("tests/test_x.py::test_y[n1]", "test_y[n1]", "passed", "", "", 1, 2, [], [], "", [])
    for _ in range(3000):  # enough to overflow the pipe's buffer and meet the dead reader
        out.write(case)
    problem = out.close()
    assert problem is not None and "Allure writer process died" in problem
    assert "results before that may be missing" in problem
    assert len(list((tmp_path / "a").glob("*-result.json"))) > 0  # the rest, in-process


def verdict(host: str, state: str, action: str = "", failed: list | None = None) -> NodeVerdict:
    v = NodeVerdict(host, state, reasons=[f"{host} is {state}"], failed=failed or [])
    v.actions = [action] if action else []
    return v


def test_fleet_summary_counts_names_the_worst_and_ranks_failed_checks():
    ecc = [{"check": "ecc_errors", "gpu": 3}, {"check": "ecc_errors", "gpu": 5}]
    verdicts = [
        verdict("n9", "UNREACHABLE", "DRAIN"),
        verdict("n2", "FAIL", "RESET_GPU", ecc),
        verdict("n4", "FAIL", "DRAIN", [{"check": "nvlink", "gpu": 0}, *ecc[:1]]),
        verdict("n3", "WARN", "INSPECT"),
        *(verdict(f"p{i}", "PASS") for i in range(20)),
    ]
    summary = FleetSummary.of(verdicts)
    assert summary.line == "24 nodes: 20 PASS, 1 WARN, 2 FAIL, 1 UNREACHABLE"
    assert [v.host for v in summary.worst] == ["n9", "n2", "n4"]
    assert summary.checks == ["ecc_errors: 2 nodes, 3 GPUs", "nvlink: 1 node, 1 GPU"]
    lines = summary.lines(top=2)
    assert (
        lines[1] == "worst nodes (2 of 3):"
        and lines[2] == "  n9  UNREACHABLE DRAIN: n9 is UNREACHABLE"
    )
    assert (
        dict(summary.metadata(top=2))["worst nodes"]
        == "n9 UNREACHABLE DRAIN; n2 FAIL RESET_GPU (+1 more)"
    )


@pytest.mark.suite
def test_the_terminal_leads_with_the_fleet_summary_and_lists_only_nodes_to_look_at(tmp_path):
    n2 = healthy_h100()
    n2["gpus"][3]["ecc"]["volatile"]["uncorrected"] = 4
    docs = {f"n{i:03d}": healthy_h100() for i in range(60)}
    docs["n002"] = n2
    facts = write_facts(tmp_path / "facts", **docs)
    run = run_suite(tmp_path / "r", "--facts", str(facts), "--profile", "h100-sxm", "-q")
    out = run.output
    assert out.index("gpuhealth fleet summary") < out.index("gpuhealth verdicts")
    assert out.index("gpuhealth verdicts") < out.index("= FAILURES =")
    assert "60 nodes: 59 PASS, 1 FAIL" in out and "  ecc_errors: 1 node, 1 GPU" in out
    assert "... and 59 PASS nodes (-v lists them)" in out
    table = out[out.index("gpuhealth verdicts") : out.index("= FAILURES =")]
    assert "n002" in table and "n001 " not in table


@pytest.mark.suite
def test_junit_carries_no_gpuhealth_properties(tmp_path):
    """What a test tells the Reporter travels on its reports, not as JUnit properties (those
    cost more than the check at fleet scale)."""
    facts, inventory = faulty_fleet(tmp_path)
    run_suite(tmp_path / "r", "--facts", str(facts), "--inventory", str(inventory))
    assert list(ET.parse(tmp_path / "r" / "junit.xml").getroot().iter("property")) == []


def test_junit_is_streamed_as_pytest_writes_it_and_survives_hostile_text(tmp_path):
    path = tmp_path / "r" / "junit.xml"
    out = JUnitResults(path, "gpuhealth")
    out.case("tests/test_gpu.py::test_ecc_errors[n1-gpu0]", 0.0012, None, "", "")
    hostile = 'n2 gpu3: "4 > 0" & <x>\x00\x1b[31m\ud800 done'
    out.case("tests/test_gpu.py::test_ecc_errors[n2-gpu3]", 0.5, "failure", hostile, hostile)
    out.case("tests/test_dcgm.py::test_dcgm_diag[n1]", 0, "skipped", "not run", "not run")
    out.case("tests/test_node.py::test_gpu_count[n3]", 0, "error", 'failed on setup with "x"', "")
    out.close()
    suite = ET.parse(path).getroot().find("testsuite")
    assert {k: suite.get(k) for k in ("name", "tests", "failures", "skipped", "errors")} == {
        "name": "gpuhealth",
        "tests": "4",
        "failures": "1",
        "skipped": "1",
        "errors": "1",
    }
    cases = suite.findall("testcase")
    assert [c.get("classname") for c in cases][:2] == ["tests.test_gpu", "tests.test_gpu"]
    failure = cases[1].find("failure")
    assert failure.get("message").startswith('n2 gpu3: "4 > 0" & <x>#x00#x1B[31m#xD800 done')
    assert cases[2].find("skipped").get("type") == "pytest.skip"
    assert [p.name for p in path.parent.iterdir()] == ["junit.xml"]  # no spool left behind


@pytest.mark.suite
def test_a_large_report_is_rendered_as_a_folder_the_browser_loads_in_pieces(tmp_path):
    """Above SINGLE_FILE_MAX tests `make report` writes Allure's folder form (one HTML file
    would be ~90 MB per 128 nodes); below it, the single file that opens from disk."""
    facts, inventory = faulty_fleet(tmp_path)
    run_suite(tmp_path / "r", "--facts", str(facts), "--inventory", str(inventory))
    make = ["make", "-s", "-C", str(REPO), "report", f"REPORTS={tmp_path / 'r'}"]
    folder = subprocess.run([*make, "SINGLE_FILE_MAX=10"], capture_output=True, text=True)
    assert folder.returncode == 0, folder.stderr
    report = tmp_path / "r" / "allure-report"
    assert (report / "index.html").is_file() and (report / "data" / "test-results").is_dir()
    assert f"serve it: python3 -m http.server -d {report}" in folder.stdout
    single = subprocess.run(make, capture_output=True, text=True)
    assert single.returncode == 0, single.stderr
    assert sorted(p.name for p in report.iterdir() if p.is_dir()) == []


def test_a_test_whose_worker_crashed_or_that_never_ended_is_still_reported(tmp_path):
    """xdist reports a test whose worker died with when "???" and no teardown; a run cut
    short leaves a test without one: both must still be in JUnit and Allure, not vanish."""
    from gpuhealth.plugin import RunState
    from gpuhealth.reporter import Reporter

    state = RunState(
        config=SimpleNamespace(option=SimpleNamespace(level="quick")),  # type: ignore[arg-type]
        targets={"n1": SimpleNamespace(name="n1", gpu_slots=2)},  # type: ignore[dict-item]
        profiles=None,  # type: ignore[arg-type]
        verdicts=tmp_path / "verdicts.json",
        facts_dir=tmp_path / "facts",
        allure=AllureResults(tmp_path / "allure", clean=False, background=False),
        junit=JUnitResults(tmp_path / "junit.xml", "gpuhealth"),
    )
    reporter = Reporter(state)
    crashed = pytest.TestReport(
        "tests/test_gpu.py::test_power[n1-gpu0]",
        ("x", None, "x"),
        {},
        "failed",
        "worker 'gw0' crashed while running it",
        "???",
    )
    reporter.pytest_runtest_logreport(crashed)
    started = pytest.TestReport(
        "tests/test_gpu.py::test_power[n1-gpu1]",
        ("x", None, "x"),
        {},
        "passed",
        None,
        "setup",
        start=1.0,
        stop=1.5,
    )
    reporter.pytest_runtest_logreport(started)
    reporter.pytest_sessionfinish(None, 2)  # type: ignore[arg-type]
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")}
    assert "crashed while running it" in cases["test_power[n1-gpu0]"].find("error").get("message")
    assert "the run ended before the test did" in cases["test_power[n1-gpu1]"].find("error").get(
        "message"
    )
    found = results(tmp_path / "allure")
    assert {found[n]["status"] for n in ("test_power[n1-gpu0]", "test_power[n1-gpu1]")} == {
        "broken"
    }
    # Neither reported its record, yet both count against n1: placed by their ids.
    verdicts = json.loads((tmp_path / "verdicts.json").read_text())
    assert verdicts["complete"] is False
    n1 = verdicts["nodes"]["n1"]
    assert n1["verdict"] == "FAIL" and n1["counts"]["ERROR"] == 2
