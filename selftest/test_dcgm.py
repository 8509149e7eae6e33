"""DCGM: `dcgmi diag -j` (3.x and 4.x layouts) and `dcgmi health -c -j` on the real samples,
the DCGM checks on them (and on edits of them that fail), and triage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuhealth import evidence as evidence_files
from gpuhealth.families.dcgm import evidence, parse_dcgm_table
from gpuhealth.families.dcgm import parse_dcgm as dcgm
from gpuhealth.parsing import ParseError
from selftest.facts import judge

DATA = Path(__file__).parent / "data" / "dcgm"
R1 = "vc_dcgmi_diag_r1.json"
R2 = "vc_dcgmi_diag_r2.json"
HEALTH = "vc_dcgmi_health_check.json"
FRAGMENT = "dcgm4_diag_r3_fragment_issue215.txt"
SMI = Path(__file__).parent / "data" / "nvidia-smi" / "gpud_h100x8_535.161.08_query.txt"


def dcgm4_text() -> str:
    """The real DCGM 4 `-r 3` fragment (issue #215) inside the 4.x top level it was cut from."""
    test = (DATA / FRAGMENT).read_text().strip().rstrip(",")
    return (
        '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": ['
        + test
        + ']}]}, "metadata": {"version": "4.1.1", "Driver Version Detected": "570.124.06"}}'
    )


def dcgm4_failing_gpu3() -> str:
    """The 4.x document with GPU 3 failing, its warning in the schema's shape."""
    doc = json.loads(dcgm4_text())
    result = doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][3]
    result["status"] = "Fail"
    result["warnings"] = [
        {
            "warning": "GPU 3 calculated at approximately 412.00 gigaflops, below the 800.00 "
            "expected",
            "error_id": 83,
            "error_category": 1,
            "error_severity": 2,
        }
    ]
    return json.dumps(doc)


def diag_section(text: str, level: int | None = 3) -> dict[str, Any]:
    found = evidence.diag_evidence(text)["dcgm"]
    found["level"] = level
    return found


def evaluate(name: str, facts: dict[str, Any], index: int | None = None, **overrides: Any):
    gpus = [{"index": i, "uuid": f"GPU-{i}", "serial": f"16501240315{i:02d}"} for i in range(8)]
    return judge(name, {"source": "evidence-file", "gpus": gpus, **facts}, index, **overrides)


# ---------------------------------------------------------------- parsers


def test_3x_level_1_has_only_node_wide_deployment_tests():
    diag = dcgm.parse_diag((DATA / R1).read_text())
    assert diag["layout"] == "3.x"
    assert [t["name"] for t in diag["tests"]][:3] == [
        "Denylist",
        "NVML Library",
        "CUDA Main Library",
    ]
    assert len(diag["tests"]) == 9
    assert {r["status"] for t in diag["tests"] for r in t["results"]} == {"Pass"}
    assert all(r["gpus"] == [] for t in diag["tests"] for r in t["results"])


def test_3x_level_2_has_per_gpu_results_with_info():
    diag = dcgm.parse_diag((DATA / R2).read_text())
    memory = next(t for t in diag["tests"] if t["name"] == "GPU Memory")
    assert memory["category"] == "Hardware"
    assert memory["results"] == [
        {
            "gpus": [0],
            "entity": None,
            "status": "Pass",
            "info": ["GPU 0 Allocated 15206918958 bytes (97.3%)"],
            "warnings": [],
        }
    ]


def test_4x_entity_results_info_lists_and_summary():
    diag = dcgm.parse_diag(dcgm4_text())
    assert (diag["layout"], diag["version"], diag["driver_version"]) == (
        "4.x",
        "4.1.1",
        "570.124.06",
    )
    (test,) = diag["tests"]
    assert test["name"] == "diagnostic" and test["summary"] == "Pass"
    assert [r["gpus"] for r in test["results"]] == [[i] for i in range(8)]
    assert test["results"][0]["info"][2] == (
        "GPU 0 calculated at approximately 859.08 gigaflops during this test"
    )


def test_4x_document_matches_nvidia_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((DATA / "dcgm_diag_schema_4x.json").read_text())
    schema.pop("$schema")  # "http://json-schema.org/schema#" names no draft; use the latest
    jsonschema.validate(json.loads(dcgm4_failing_gpu3()), schema)


def test_the_fragment_alone_is_not_a_document():
    with pytest.raises(ParseError, match="no 'DCGM Diagnostic' or 'DCGM GPU Diagnostic'"):
        dcgm.parse_diag((DATA / FRAGMENT).read_text())


def test_junk_before_the_json_nulls_and_upper_case_statuses_are_tolerated():
    doc = json.loads((DATA / R2).read_text())
    tests = doc["DCGM GPU Diagnostic"]["test_categories"][0]["tests"]
    tests.insert(1, None)
    tests[0]["results"][0]["status"] = "PASS"
    diag = dcgm.parse_diag("WARNING: THIS SHOULD NOT HAPPEN\n" + json.dumps(doc))
    assert diag["tests"][0]["results"][0]["status"] == "Pass"
    assert len(diag["tests"]) == 11


def test_output_that_is_not_json_is_an_error():
    with pytest.raises(ParseError, match="no JSON in the output.*Unable to connect"):
        dcgm.parse_diag("Error: Unable to connect to host engine. Host engine connection invalid")
    with pytest.raises(ParseError, match=r"not valid JSON: line \d+"):
        dcgm.parse_diag((DATA / R2).read_text()[:900])


def test_health_report_healthy_and_with_incidents():
    assert dcgm.parse_health((DATA / HEALTH).read_text()) == {
        "overall": "Healthy",
        "incidents": [],
    }
    warned = health_with_incident("Warning")
    assert dcgm.parse_health(warned) == {
        "overall": "Warning",
        "incidents": [
            {
                "entity": "GPU 3",
                "system": "PCIe system",
                "health": "Warning",
                "message": "Detected more than 8 PCIe replays per minute for GPU 3 : 12",
            }
        ],
    }


def health_with_incident(health: str) -> str:
    """The real report with one incident, in the tree dcgmi builds (Health.cpp, DcgmiOutput)."""
    doc = json.loads((DATA / HEALTH).read_text())
    doc["body"]["Overall Health"]["value"] = health
    doc["body"]["GPU"] = {
        "children": {
            "3": {
                "value": health,
                "children": {
                    "Errors": {
                        "children": {
                            "PCIe system": {
                                "value": health,
                                "overflow": [
                                    "Detected more than 8 PCIe replays per minute for GPU 3 : 12"
                                ],
                            }
                        }
                    }
                },
            }
        }
    }
    return json.dumps(doc)


# ---------------------------------------------------------------- checks


def test_level_1_passes_the_node_and_runs_nothing_per_gpu():
    facts = {"dcgm": diag_section((DATA / R1).read_text(), 1)}
    node = evaluate("dcgm_diag", facts)
    assert node.status == "PASS", node.text
    assert "dcgmi diag -r 1 (DCGM 3.x): 9 results passed" in node.text
    gpu = evaluate("dcgm_diag_gpu", facts, 0)
    assert gpu.status == "SKIP" and "no per-GPU tests" in gpu.text


def test_level_2_per_gpu_results_pass_on_their_gpu():
    facts = {"dcgm": diag_section((DATA / R2).read_text(), 2)}
    result = evaluate("dcgm_diag_gpu", facts, 0)
    assert result.status == "PASS" and "PCIe, GPU Memory passed" in result.text


def test_a_gpu_dcgm_has_no_result_for_fails():
    facts = {"dcgm": diag_section((DATA / R2).read_text(), 2)}
    result = evaluate("dcgm_diag_gpu", facts, 5)
    assert result.status == "FAIL" and "no result for GPU 5" in result.text


def test_4x_level_3_passes_every_gpu():
    facts = {"dcgm": diag_section(dcgm4_text())}
    for index in range(8):
        assert evaluate("dcgm_diag_gpu", facts, index).status == "PASS"
    assert evaluate("dcgm_diag", facts).status == "PASS"


def test_fail_fails_that_gpu_only_with_dcgm_message_and_rma_action():
    facts = {"dcgm": diag_section(dcgm4_failing_gpu3())}
    failed = evaluate("dcgm_diag_gpu", facts, 3)
    assert failed.status == "FAIL"
    assert failed.text.startswith("node17 gpu3 (GPU-3, serial 1650124031503)")
    assert "diagnostic Fail: GPU 3 calculated at approximately 412.00 gigaflops" in failed.text
    assert "(DCGM error 83)" in failed.text
    assert "RMA" in failed.advice and "-i 3" in failed.advice
    assert evaluate("dcgm_diag_gpu", facts, 2).status == "PASS"
    assert evaluate("dcgm_diag", facts).status == "PASS"


def test_warn_warns_and_skip_skips_with_the_reason():
    doc = json.loads(dcgm4_text())
    results = doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"]
    results[1]["status"] = "Warn"
    results[1]["warnings"] = [
        {"warning": "clocks throttled", "error_id": 9, "error_category": 1, "error_severity": 1}
    ]
    results[2]["status"] = "Skip"
    results[2]["info"] = ["not supported on this device"]
    facts = {"dcgm": diag_section(json.dumps(doc))}
    warned = evaluate("dcgm_diag_gpu", facts, 1)
    assert warned.status == "WARN" and "clocks throttled" in warned.text
    skipped = evaluate("dcgm_diag_gpu", facts, 2)
    assert skipped.status == "SKIP" and "not supported on this device" in skipped.text


def test_failed_deployment_test_fails_the_node():
    doc = json.loads((DATA / R1).read_text())
    persistence = doc["DCGM GPU Diagnostic"]["test_categories"][0]["tests"][4]
    persistence["results"][0] = {
        "status": "Fail",
        "warnings": [{"warning": "Persistence mode for GPU 0 is disabled.", "error_id": 16}],
    }
    facts = {"dcgm": diag_section(json.dumps(doc), 1)}
    result = evaluate("dcgm_diag", facts)
    assert result.status == "FAIL"
    assert "Persistence Mode Fail: Persistence mode for GPU 0 is disabled." in result.text


def test_runtime_error_and_empty_results_fail():
    stopped = {"dcgm": diag_section('{"DCGM Diagnostic": {"runtime_error": "GPU 2 is busy"}}')}
    result = evaluate("dcgm_diag", stopped)
    assert result.status == "FAIL" and "stopped: GPU 2 is busy" in result.text
    empty = {"dcgm": diag_section('{"DCGM GPU Diagnostic": {"version": "4.2.3"}}')}
    assert evaluate("dcgm_diag", empty).status == "FAIL"


def test_a_diag_that_did_not_run_fails_the_node_and_skips_the_gpus():
    section = {"level": 2, "error": "dcgmi not found: sh: 1: dcgmi: not found", "diag": None}
    section.update(action="FIX_CONFIG", advice="install DCGM")
    node = evaluate("dcgm_diag", {"dcgm": section})
    assert node.status == "FAIL" and "did not run: dcgmi not found" in node.text
    assert evaluate("dcgm_diag_gpu", {"dcgm": section}, 0).status == "SKIP"


def test_health_healthy_passes_warning_warns_failure_fails():
    def health(text: str) -> dict[str, Any]:
        return {"dcgm_health": evidence.health_evidence(text)["dcgm_health"]}

    assert evaluate("dcgm_health", health((DATA / HEALTH).read_text())).status == "PASS"
    warned = evaluate("dcgm_health", health(health_with_incident("Warning")))
    assert warned.status == "WARN" and "GPU 3 PCIe system Warning" in warned.text
    failed = evaluate("dcgm_health", health(health_with_incident("Failure")))
    assert failed.status == "FAIL" and "PCIe replays" in failed.text


@pytest.mark.parametrize(
    ("detail", "action"),
    [
        ("dcgmi: command not found", "install DCGM"),
        ("Error: Unable to connect to host engine. Host engine connection invalid", "nvidia-dcgm"),
        ("Error: Health watches not enabled. Please enable watches.", "dcgmi health -s a"),
    ],
)
def test_health_that_cannot_be_read_fails_with_the_fix(detail, action):
    section: dict[str, Any] = {"health": None}
    section["unavailable"] = {"health": {"kind": "error", "detail": detail}}
    result = evaluate("dcgm_health", {"dcgm_health": section})
    assert result.status == "FAIL" and detail in result.text
    assert action in result.advice


def test_health_skips_where_dcgm_is_not_expected():
    skipped = {"skipped": "DCGM not expected on this host (dcgm_installed: false)"}
    result = evaluate("dcgm_health", {"dcgm_health": skipped})
    assert result.status == "SKIP" and "dcgm_installed: false" in result.text


# ---------------------------------------------------------------- triage


def run_triage(*paths: Path | str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuhealth.cli",
            "triage",
            "--json",
            "--node",
            "node17",
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_triage_reads_diag_and_health_of_one_node(tmp_path):
    failing = tmp_path / "diag.json"
    failing.write_text(dcgm4_failing_gpu3())
    proc = run_triage(failing, DATA / HEALTH)
    assert proc.returncode == 1, proc.stderr
    found = {(f["check"], f["gpu"]): f for f in json.loads(proc.stdout)["findings"]}
    # No GPU records in DCGM output: the node check names the failing GPU itself.
    diag = found[("dcgm_diag", None)]
    assert diag["status"] == "FAIL" and "GPU 3 diagnostic Fail: GPU 3 calculated" in diag["message"]
    assert found[("dcgm_health", None)]["status"] == "PASS"
    # With the node's nvidia-smi -q alongside, each GPU's results are judged on that GPU.
    proc = run_triage(failing, SMI)
    found = {(f["check"], f["gpu"]): f for f in json.loads(proc.stdout)["findings"]}
    assert found[("dcgm_diag_gpu", 3)]["status"] == "FAIL"
    assert "serial 1650124032506" in found[("dcgm_diag_gpu", 3)]["message"]
    assert found[("dcgm_diag_gpu", 0)]["status"] == "PASS"
    assert found[("dcgm_diag", None)]["status"] == "PASS"


def test_triage_of_passing_level_2(tmp_path):
    proc = run_triage(DATA / R2)
    assert proc.returncode == 0, proc.stderr
    found = {(f["check"], f["gpu"]): f for f in json.loads(proc.stdout)["findings"]}
    assert found[("dcgm_diag", None)]["status"] == "PASS"
    assert found[("dcgm_health", None)]["status"] == "SKIP"


# ---------------------------------------------------------------- the table form, as pasted

TABLES = Path(__file__).parent / "data" / "dcgm"


def _triage_one(name: str) -> dict[str, Any]:
    """The findings of `gpuhealth triage` on one sample, by check."""
    path = TABLES / name
    kind, facts = evidence_files.facts_from_file(path)
    return {"kind": kind.name, "facts": facts}


def test_the_diag_table_of_a_node_without_fabric_manager_fails_gpu_memory():
    found = _triage_one("nccltests_issue264_dcgmi_diag_r3_table_gpu_memory_fail.txt")
    assert found["kind"] == "dcgmi diag"
    diag = found["facts"]["dcgm"]["diag"]
    assert (diag["layout"], diag["version"], diag["driver_version"]) == (
        "3.x table",
        "3.3.8",
        "560.35.03",
    )
    tests = {t["name"]: t for t in diag["tests"]}
    memory = tests["GPU Memory"]["results"]
    assert [(r["gpus"], r["status"]) for r in memory] == [([], "Fail")]
    assert len(memory[0]["warnings"]) == 8
    assert memory[0]["warnings"][1].startswith("GPU 1 Error using CUDA API cuInit")
    assert (
        "Unable to initialize CUDA library: 'system not yet initialized'"
        in (memory[0]["warnings"][1])
    )
    info = tests["Persistence Mode"]["results"][0]["info"][0]
    assert info.startswith("Persistence mode for GPU 0 is disabled. Enable persistence mode by")
    finding = judge("dcgm_diag", found["facts"], None, None)
    assert finding.status.name == "FAIL" and "GPU Memory Fail" in finding.result.message


@pytest.mark.parametrize(
    ("name", "passed"),
    [
        ("gnosia93_dcgmi_diag_r3_table_2xrtxpro6000_deployment_pass.txt", 18),
        ("dcgm_user_guide_dcgmi_diag_r3_table_4.0.0_4gpu_pass.txt", 28),
    ],
)
def test_healthy_diag_tables_pass(name, passed):
    found = _triage_one(name)
    finding = judge("dcgm_diag", found["facts"], None, None)
    assert finding.status.name == "PASS", finding
    assert f"{passed} results passed" in finding.result.message


def test_the_4x_table_gives_per_gpu_results_under_each_test():
    diag = _triage_one("dcgm_user_guide_dcgmi_diag_r3_table_4.0.0_4gpu_pass.txt")["facts"]
    software = diag["dcgm"]["diag"]["tests"][0]
    assert software["summary"] == "Pass"
    assert [r["gpus"] for r in software["results"]] == [[0], [1], [2], [3]]


@pytest.mark.parametrize(
    ("name", "status", "words"),
    [
        (
            "dcgm_command_reference_dcgmi_health_c_table_l4_power_warning.txt",
            "WARN",
            "GPU 0 Power system Warning: Detected clocks event due to power violation in GPU 0. "
            "Monitor the power conditions. This GPU can still perform workload.",
        ),
        ("dcgmi_health_c_table_healthy_despite_corrected_ecc.txt", "PASS", "Healthy"),
    ],
)
def test_health_tables_are_judged_as_their_json(name, status, words):
    found = _triage_one(name)
    assert found["kind"] == "dcgmi health -c"
    finding = judge("dcgm_health", found["facts"], None, None)
    assert finding.status.name == status and words in finding.result.message, finding


@pytest.mark.parametrize(
    ("cut", "message"),
    [(-2, "no closing border"), (-6, "no closing border")],
)
def test_a_table_cut_short_is_refused(cut, message):
    lines = (TABLES / "nccltests_issue264_dcgmi_diag_r3_table_gpu_memory_fail.txt").read_text()
    text = "\n".join(lines.splitlines()[:cut])
    with pytest.raises(ParseError, match=message):
        parse_dcgm_table.parse_diag(text)
