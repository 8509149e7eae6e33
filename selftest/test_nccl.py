"""nccl-tests: the parser on every real log, the NCCL checks on them, and triage of them."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import gpuhealth
from gpuhealth.config import ConfigError, validate
from gpuhealth.families.nccl import evidence
from gpuhealth.families.nccl import parse_nccl_tests as nccl_tests
from gpuhealth.parsing import ParseError
from selftest.facts import PROFILES
from selftest.facts import judge as judge_facts

DATA = Path(__file__).parent / "data" / "nccl-tests"
ONE_NODE = "nccltests_issue290_1node_8xH100_nvls_all_reduce.txt"
LEGACY = "nccltests_issue37_8xV100_all_gather_legacy.txt"
RING = "nccltests_issue290_2node_16xH100_ring_low_bw.txt"
TWO_NODES = "nccltests_issue309_2node_16xH100_all_reduce.txt"
FOUR_NODES = "nccltests_issue309_4node_32xH100_vm_all_reduce.txt"
SRUN = "awsome_2x_p5.48xlarge_efa_all_reduce_srun.txt"
MPIJOB = "awsome_2x_p5.48xlarge_eks_mpijob_excerpt.log"
P4DE = "awsome_2x_p4de.24xlarge_efa_all_reduce_srun.txt"
ALLTOALL = "nccltests_issue287_rtx5090_1gpu_alltoall_na_wrong.txt"


def parse(name: str) -> dict[str, Any]:
    return nccl_tests.parse((DATA / name).read_text())


def section(name: str, nodes: int | None = None) -> dict[str, Any]:
    """The `nccl` section triage builds from a saved log."""
    found = evidence.evidence((DATA / name).read_text())["nccl"]
    found["nodes"] = nodes
    return found


def judge(name: str, nccl: dict[str, Any], profile: str = "h100-sxm", **overrides: Any):
    facts = {"source": "evidence-file", "nccl": nccl}
    return judge_facts(name, facts, None, profile, "node5", **overrides)


# ---------------------------------------------------------------- parser, every real log

# file -> (collective, ranks from rank lines, hosts if the list is complete, rows, last size,
#          last out-of-place busbw, avg footer)
EXPECTED = {
    SRUN: ("all_reduce", None, None, 32, 17179869184, 487.09, None),
    MPIJOB: ("all_reduce", None, None, 7, 2147483648, 437.79, 52.9753),
    P4DE: ("all_reduce", None, None, 29, 2147483648, 78.33, None),
    "coreweave_64xH100_ib_sharp_all_reduce_excerpt.txt": (
        "all_reduce",
        None,
        None,
        5,
        8589934592,
        386.56,
        373.187,
    ),
    "coreweave_gb200_20racks_1440gpu_all_reduce.txt": (
        "all_reduce",
        1440,
        None,
        6,
        17179869184,
        405.74,
        297.808,
    ),
    "coreweave_gb200_nvl72_2racks_all_reduce.txt": (
        "all_reduce",
        144,
        None,
        6,
        17179869184,
        810.41,
        688.487,
    ),
    ALLTOALL: ("alltoall", 1, ["GENOA-01"], 1, 33554432, 0.0, 0.0),
    LEGACY: ("all_gather", None, None, 1, 4294967296, 129.05, 128.942),
    ONE_NODE: ("all_reduce", 8, ["node005"], 6, 4294967296, 473.60, 439.369),
    RING: ("all_reduce", 16, ["node005", "node007"], 11, 8589934592, 89.90, 85.5294),
    TWO_NODES: ("all_reduce", 16, ["bm-h100-01", "bm-h100-02"], 32, 17179869184, 469.21, 139.56),
    FOUR_NODES: (
        "all_reduce",
        32,
        ["pt01", "spt01", "spt02", "pt02"],
        32,
        17179869184,
        365.84,
        107.51,
    ),
}


# Runs that stopped on an error before their first result row -> the error's words.
ABORTED = {
    "nccltests_issue264_8xH100_aborted_system_not_yet_initialized.txt": "'system not yet",
    "nccltests_issue338_2xH20_mpirun_aborted_system_not_yet_initialized.txt": "common.cu:1030",
    "nccltests_issue355_16xH800_alltoall_aborted_in_first_row.txt": "illegal memory access",
}


def test_every_sample_is_covered():
    names = {p.name for p in DATA.iterdir() if p.name != "SOURCE.md"}
    assert names == set(EXPECTED) | set(ABORTED)


@pytest.mark.parametrize("name", sorted(ABORTED))
def test_a_run_that_aborted_before_its_first_row_fails_with_its_error(name):
    text = (DATA / name).read_text()
    assert nccl_tests.looks_like(text)
    with pytest.raises(nccl_tests.Aborted, match=ABORTED[name]):
        nccl_tests.parse(text)
    record = evidence.evidence(text)["nccl"]
    for check in ("nccl_bandwidth", "nccl_data_integrity"):
        finding = judge(check, record)
        assert finding.status.name == "FAIL", finding
        assert "aborted before its first result" in finding.result.message
        assert ABORTED[name] in finding.result.message


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parser_reads_every_real_log(name):
    collective, ranks, hosts, rows, last_size, last_busbw, avg = EXPECTED[name]
    run = parse(name)
    assert run["collective"] == collective
    assert run["ranks"] == ranks
    assert (run["hosts"] if run["hosts_complete"] else None) == hosts
    assert len(run["rows"]) == rows
    last = run["rows"][-1]
    assert last["size"] == last_size
    assert last["out_of_place"]["busbw_gbps"] == pytest.approx(last_busbw)
    assert run["avg_busbw_gbps"] == (pytest.approx(avg) if avg is not None else None)


def test_header_devices_and_footer_of_the_healthy_single_node_log():
    run = parse(ONE_NODE)
    assert run["header"] == {
        "nthread": 1,
        "ngpus": 8,
        "min_bytes": 134217728,
        "max_bytes": 4294967296,
        "warmup_iters": 5,
        "iters": 2,
        "validation": 1,
        "step": 2,
        "step_kind": "factor",
    }
    assert run["sweep_complete"] is True
    assert run["devices"][1] == {
        "rank": 1,
        "group": 0,
        "pid": 295203,
        "host": "node005",
        "device": 1,
        "busid": "0x6d",
        "name": "NVIDIA H100 80GB HBM3",
    }
    assert run["out_of_bounds"] == {"count": 0, "ok": True}
    first = run["rows"][0]
    assert (first["count"], first["type"], first["redop"], first["root"]) == (
        33554432,
        "float",
        "sum",
        -1,
    )
    assert first["in_place"] == {
        "time_us": 614.3,
        "algbw_gbps": 218.48,
        "busbw_gbps": 382.34,
        "wrong": 0,
    }
    assert run["collective_source"] == "inferred"


def test_mpi_warnings_command_line_and_prefixes_are_skipped():
    run = parse(TWO_NODES)
    assert run["collective"] == "all_reduce" and run["collective_source"] == "log"
    assert run["nccl_version"] == "2.26.2+cuda12.8"
    assert run["devices"][0]["busid"] == "0000:19:00"
    srun = parse(SRUN)
    assert srun["rows"][0]["size"] == 8 and srun["out_of_bounds"] is None
    mpijob = parse(MPIJOB)
    assert mpijob["elided"] and mpijob["rows"][0]["size"] == 0


def test_wrong_na_is_not_validated_not_zero():
    ring = parse(RING)
    assert {row["out_of_place"]["wrong"] for row in ring["rows"]} == {None}
    alltoall = parse(ALLTOALL)
    assert alltoall["rows"][0]["out_of_place"]["wrong"] == 0
    assert alltoall["rows"][0]["in_place"]["wrong"] is None


def test_nan_bandwidth_is_none():
    text = (DATA / ONE_NODE).read_text().replace("476.53", "  -nan")
    run = nccl_tests.parse(text)
    assert run["rows"][-1]["in_place"]["busbw_gbps"] is None


def test_a_row_cut_short_is_an_error_naming_the_line():
    lines = (DATA / ONE_NODE).read_text().splitlines()
    lines[17] = lines[17][:60]
    with pytest.raises(ParseError, match=r"line 18: result row has 6 columns, the header has 13"):
        nccl_tests.parse("\n".join(lines))


def test_a_log_without_results_is_an_error():
    with pytest.raises(ParseError, match="no nccl-tests result rows"):
        nccl_tests.parse("# nThread 1 nGpus 8\n# Using devices\n")


def test_an_nccl_warning_before_any_result_is_the_run_aborted():
    with pytest.raises(nccl_tests.Aborted, match="out of memory"):
        nccl_tests.parse("NCCL WARN Cuda failure 'out of memory'\n# nThread 1 nGpus 8\n")


def test_wrong_count_that_is_not_a_number_is_an_error():
    text = (DATA / ONE_NODE).read_text().replace("473.60      0", "473.60    abc")
    with pytest.raises(ParseError, match="#wrong 'abc' is not a count"):
        nccl_tests.parse(text)


# ---------------------------------------------------------------- checks on the real logs


def test_healthy_8x_h100_single_node_passes_the_h100_profile():
    result = judge("nccl_bandwidth", section(ONE_NODE))
    assert result.status == "PASS", result.text
    assert "476.5 GB/s" in result.text and ">= 460 GB/s" in result.text
    assert "single node over NVLink" in result.text
    assert judge("nccl_data_integrity", section(ONE_NODE)).status == "PASS"


def test_same_log_fails_a_stricter_single_node_threshold_with_an_action():
    result = judge("nccl_bandwidth", section(ONE_NODE), nccl_allreduce_min_busbw_gbps=480)
    assert result.status == "FAIL"
    assert "476.5 GB/s" in result.text and "< 480 GB/s expected" in result.text
    assert "NVLink" in result.advice


def test_two_node_ring_run_at_102_fails_the_internode_threshold():
    result = judge("nccl_bandwidth", section(RING))
    assert result.status == "FAIL", result.text
    assert "89.9 GB/s" in result.text and "< 420 GB/s expected" in result.text
    assert "2 nodes" in result.text and "nccl_internode_min_busbw_gbps[2]" in result.text
    assert "bisection" in result.advice


def test_fabric_keys_describe_the_network_in_the_message():
    result = judge("nccl_bandwidth", section(RING), fabric="infiniband", ib_ports_expected=8)
    assert "2 nodes over InfiniBand (8 ports, >= 400 Gb/s)" in result.text


def test_wrong_na_everywhere_skips_integrity_as_not_validated():
    result = judge("nccl_data_integrity", section(RING))
    assert result.status == "SKIP"
    assert "not validated" in result.text and "not the same as 0" in result.text


def test_in_place_na_of_alltoall_is_not_a_failure_and_alltoall_is_not_judged_for_bandwidth():
    assert judge("nccl_data_integrity", section(ALLTOALL)).status == "PASS"
    bandwidth = judge("nccl_bandwidth", section(ALLTOALL))
    assert bandwidth.status == "SKIP" and "alltoall_perf" in bandwidth.text


def test_healthy_multi_node_logs_pass_judged_at_large_sizes_not_on_the_average():
    two = judge("nccl_bandwidth", section(TWO_NODES))
    assert two.status == "PASS" and "469.2 GB/s" in two.text
    assert "average 139.56 GB/s is not judged" in two.text
    assert judge("nccl_bandwidth", section(FOUR_NODES)).status == "PASS"


def test_nonzero_wrong_is_data_corruption_whatever_the_bandwidth():
    nccl = section(ONE_NODE)
    nccl["run"]["rows"][4]["in_place"]["wrong"] = 12
    result = judge("nccl_data_integrity", nccl)
    assert result.status == "FAIL"
    assert "data corruption: #wrong 12 at 2 GiB in-place" in result.text
    assert "drain" in result.advice
    assert judge("nccl_bandwidth", nccl).status == "PASS"


def test_out_of_bounds_failed_footer_is_data_corruption():
    text = (DATA / ONE_NODE).read_text().replace("values : 0 OK", "values : 3 FAILED")
    nccl = evidence.evidence(text)["nccl"]
    result = judge("nccl_data_integrity", nccl)
    assert result.status == "FAIL" and "Out of bounds values: 3 FAILED" in result.text


# Each a false pass the parser once gave: the evidence of a fault cut, garbled or negative.
def rows_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"\s*\d+\s+\d+\s", line)]


def test_a_log_cut_before_its_corrupt_row_is_incomplete_not_a_pass():
    text = (DATA / ONE_NODE).read_text()
    rows = rows_of(text)
    cut = text[: text.index(rows[3])]  # 3 of 6 rows; the lost ones may hold the corruption
    nccl = evidence.evidence(cut)["nccl"]
    assert nccl["run"]["sweep_complete"] is False
    result = judge("nccl_data_integrity", nccl)
    assert (result.status, result.action) == ("FAIL", "RERUN")
    assert "the log stops at 512 MiB of a sweep to 4 GiB" in result.text


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("values : 0 OK", "values : O OK", "line 22: cannot read the footer line"),
        ("values : 0 OK", "values : 0 0K", "line 22: cannot read the footer line"),
        ("382.99      0", "382.99     -1", "line 16: #wrong '-1' is not a count"),
        ("   134217728", "   1342l7728", "size '1342l7728' is not an integer"),
    ],
    ids=["oob-count", "oob-verdict", "wrong-negative", "size"],
)
def test_garbled_verdicts_are_errors_never_a_pass(old, new, message):
    text = (DATA / ONE_NODE).read_text()
    assert old in text
    with pytest.raises(ParseError, match=re.escape(message)):
        nccl_tests.parse(text.replace(old, new, 1))


def test_legacy_output_is_read_and_its_out_of_bounds_verdict_judged():
    run = parse(LEGACY)
    assert run["rows"][0]["out_of_place"] == {
        "time_us": 29122.0,
        "algbw_gbps": 129.05,
        "busbw_gbps": 129.05,
        "wrong": None,
        "max_error": 1.0,
    }
    assert run["out_of_bounds"] == {"count": 2, "ok": False}
    nccl = section(LEGACY, nodes=1)
    result = judge("nccl_data_integrity", nccl)
    assert result.status == "FAIL" and "Out of bounds values: 2 FAILED" in result.text
    healthy = (DATA / LEGACY).read_text().replace(": 2 FAILED", ": 0 OK")
    nccl = evidence.evidence(healthy)["nccl"]
    result = judge("nccl_data_integrity", nccl)
    assert result.status == "PASS" and "before 2.10: no #wrong column" in result.text


def test_log_without_rank_lines_needs_the_node_count():
    skip = judge("nccl_bandwidth", section(SRUN))
    assert skip.status == "SKIP" and "--nodes" in skip.text
    assert judge("nccl_bandwidth", section(SRUN, nodes=2)).status == "PASS"


def test_partial_rank_list_does_not_count_nodes():
    nccl = section("coreweave_gb200_nvl72_2racks_all_reduce.txt")
    assert judge("nccl_bandwidth", nccl, "gb200").status == "SKIP"


def test_sweep_that_never_reaches_the_reference_size():
    mpijob = section(MPIJOB, nodes=2)
    assert judge("nccl_bandwidth", mpijob).status == "PASS"
    small = judge("nccl_bandwidth", mpijob, nccl_reference_size_bytes=4 << 30)
    assert small.status == "SKIP" and "not evaluated" in small.text
    live = copy.deepcopy(mpijob)
    facts = {"source": "active", "nccl": live}
    result = judge_facts("nccl_bandwidth", facts, nccl_reference_size_bytes=4 << 30)
    assert result.status == "FAIL" and "set nccl_sizes" in result.text


def test_no_threshold_reports_the_measurement_without_judging_it():
    result = judge("nccl_bandwidth", section(ONE_NODE), profile="default")
    assert result.status == "SKIP"
    assert "476.5 GB/s" in result.text and "set nccl_allreduce_min_busbw_gbps" in result.text


def test_a_run_that_produced_nothing_fails_both_checks_with_its_error():
    nccl = {"nodes": 1, "error": "timed out: killed after 600 s", "advice": "re-run", "run": None}
    for name in ("nccl_bandwidth", "nccl_data_integrity"):
        result = judge(name, nccl)
        assert result.status == "FAIL" and "killed after 600 s" in result.text


def test_profiles_carry_the_reference_thresholds():
    assert PROFILES.get("h100-sxm").values["nccl_allreduce_min_busbw_gbps"] == 460
    assert PROFILES.get("h200-sxm").values["nccl_allreduce_min_busbw_gbps"] == 431
    assert PROFILES.get("a100-sxm-80gb").values["nccl_allreduce_min_busbw_gbps"] == 228
    assert PROFILES.get("default").values["nccl_allreduce_min_busbw_gbps"] is None


# ---------------------------------------------------------------- floors by node count

COREWEAVE_64 = "coreweave_64xH100_ib_sharp_all_reduce_excerpt.txt"  # 386.6 GB/s, SHARP


def slowed(nccl: dict[str, Any], factor: float) -> dict[str, Any]:
    """The same run at `factor` of its bandwidth (a node with some of its NICs down)."""
    slow = copy.deepcopy(nccl)
    for row in slow["run"]["rows"]:
        for place in ("out_of_place", "in_place"):
            for column in ("algbw_gbps", "busbw_gbps"):
                if (row.get(place) or {}).get(column) is not None:
                    row[place][column] = round(row[place][column] * factor, 2)
    return slow


def test_aws_2_node_p4de_reference_run_passes_the_p4de_floor():
    result = judge("nccl_bandwidth", section(P4DE, nodes=2), "p4de.24xlarge")
    assert result.status == "PASS", result.text
    assert "78.3 GB/s" in result.text and ">= 70 GB/s, 2 nodes over EFA (4 devices)" in result.text
    for profile in ("p4d.24xlarge", "a100-sxm-80gb", "a100-sxm-40gb"):
        assert judge("nccl_bandwidth", section(P4DE, nodes=2), profile).status == "PASS"


def test_a_p4de_run_at_half_its_bandwidth_fails_with_the_key_it_broke():
    result = judge("nccl_bandwidth", slowed(section(P4DE, nodes=2), 0.5), "p4de.24xlarge")
    assert result.status == "FAIL", result.text
    assert "39.2 GB/s" in result.text and "< 70 GB/s expected, 2 nodes over EFA" in result.text
    assert "nccl_internode_min_busbw_gbps[2]" in result.text and result.action == "INSPECT"


def test_a_p4de_run_of_more_nodes_than_published_is_reported_not_judged():
    result = judge("nccl_bandwidth", section(P4DE, nodes=4), "p4de.24xlarge")
    assert result.status == "SKIP"
    assert "78.3 GB/s" in result.text
    assert "no floor for 4 nodes (nccl_internode_min_busbw_gbps lists up to 2)" in result.text


def test_h100_floors_follow_the_node_count():
    two = judge("nccl_bandwidth", section(TWO_NODES), "h100-sxm")
    assert two.status == "PASS" and ">= 420 GB/s, 2 nodes" in two.text
    four = judge("nccl_bandwidth", section(FOUR_NODES), "h100-sxm")
    assert four.status == "PASS" and ">= 330 GB/s, 4 nodes" in four.text
    sixty_four = judge("nccl_bandwidth", section(COREWEAVE_64, nodes=64), "h100-sxm")
    assert sixty_four.status == "PASS" and ">= 330 GB/s, 64 nodes" in sixty_four.text
    # The 4-node run's 366 would fail the 2-node floor: one floor for all counts is wrong.
    assert judge("nccl_bandwidth", section(FOUR_NODES, nodes=2), "h100-sxm").status == "FAIL"
    beyond = judge("nccl_bandwidth", section(COREWEAVE_64, nodes=65), "h100-sxm")
    assert beyond.status == "SKIP" and "no floor for 65 nodes" in beyond.text
    # A count between two listed ones takes the larger count's floor.
    three = judge("nccl_bandwidth", slowed(section(FOUR_NODES, nodes=3), 0.88), "h100-sxm")
    assert three.status == "FAIL" and "nccl_internode_min_busbw_gbps[64]" in three.text


def test_one_internode_floor_still_judges_any_node_count():
    result = judge(
        "nccl_bandwidth", section(COREWEAVE_64, nodes=500), nccl_internode_min_busbw_gbps=350
    )
    assert result.status == "PASS" and ">= 350 GB/s, 500 nodes" in result.text


def test_internode_floors_are_by_two_or_more_whole_nodes():
    assert validate("inventory host n1", {"nccl_internode_min_busbw_gbps": {"2": 420}})
    assert validate("inventory host n1", {"nccl_internode_min_busbw_gbps": 350})
    for bad in ({1: 460}, {"two": 420}, {2: -1}, {2.0: 420}, "350"):
        with pytest.raises(ConfigError, match="nccl_internode_min_busbw_gbps"):
            validate("inventory host n1", {"nccl_internode_min_busbw_gbps": bad})


PACKAGED = Path(gpuhealth.__file__).parent / "profiles"
FLOOR_KEYS = re.compile(r"^nccl_\w*min_busbw_gbps:", re.MULTILINE)
# A source a reader can open: owner/repo#issue, a repository path at a commit, the reference
# notes, or the profile whose comment holds the sources.
CITATION = re.compile(
    r"[\w.-]+/[\w.-]+#\d+|commit [0-9a-f]{8,}|nvml-and-tools\.md|integrations\.md"
    r"|\w+/nccl-tests README|sources are in [\w.-]+\.yml|their sources are there"
)


@pytest.mark.parametrize("path", sorted(PACKAGED.glob("*.yml")), ids=lambda p: p.stem)
def test_every_busbw_floor_cites_its_source(path):
    text = path.read_text()
    if not FLOOR_KEYS.search(text):
        return
    comments = "\n".join(line for line in text.splitlines() if line.lstrip().startswith("#"))
    assert CITATION.search(comments), f"{path.name}: a busbw floor without a cited source"


# ---------------------------------------------------------------- gpuhealth triage


def triage(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuhealth.cli", "triage", "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode in (0, 1), proc.stderr
    doc = json.loads(proc.stdout)
    doc["rc"] = proc.returncode
    return doc


def nccl_findings(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["check"]: f for f in doc["findings"] if f["check"].startswith("nccl")}


def test_triage_single_node_log_passes_and_ring_log_fails():
    good = triage(str(DATA / ONE_NODE), "--profile", "h100-sxm")
    assert good["rc"] == 0 and nccl_findings(good)["nccl_bandwidth"]["status"] == "PASS"
    bad = triage(str(DATA / RING), "--profile", "h100-sxm")
    assert bad["rc"] == 1 and bad["verdict"] == "FAIL"
    assert nccl_findings(bad)["nccl_bandwidth"]["status"] == "FAIL"


def test_triage_takes_nodes_from_the_option_when_the_log_has_no_rank_lines():
    doc = triage(str(DATA / SRUN), "--profile", "h100-sxm", "--nodes", "2")
    result = nccl_findings(doc)["nccl_bandwidth"]
    assert result["status"] == "PASS" and "2 nodes" in result["message"]
    # Complete rank lines win over --nodes: the ring log names node005 and node007.
    ring = triage(str(DATA / RING), "--profile", "h100-sxm", "--nodes", "1")
    assert "2 nodes" in nccl_findings(ring)["nccl_bandwidth"]["message"]


def test_triage_judges_aws_2_node_p4de_run_instead_of_leaving_it_unchecked():
    doc = triage(str(DATA / P4DE), "--profile", "p4de.24xlarge", "--nodes", "2")
    result = nccl_findings(doc)["nccl_bandwidth"]
    assert result["status"] == "PASS" and ">= 70 GB/s, 2 nodes" in result["message"]
    assert doc["rc"] == 0 and doc["verdict"] != "NOT_CHECKED"


def test_triage_of_garbage_names_the_line(tmp_path):
    broken = tmp_path / "cut.log"
    lines = (DATA / ONE_NODE).read_text().splitlines()
    broken.write_text("\n".join(lines[:17] + [lines[17][:60]]) + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "gpuhealth.cli", "triage", str(broken)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "cut.log: line 18: result row has 6 columns" in proc.stderr


def test_triage_reads_legacy_output_with_its_topology_matrix():
    doc = triage(str(DATA / LEGACY), "--nodes", "1")
    assert doc["rc"] == 1
    result = nccl_findings(doc)["nccl_data_integrity"]
    assert (result["status"], result["action"]) == ("FAIL", "DRAIN")


def test_a_log_with_neither_header_nor_footer_is_not_vouched_for():
    """awsome's srun excerpt: rows only, so a cut before a corrupt row could not be seen."""
    result = judge("nccl_data_integrity", section(SRUN, nodes=2))
    assert result.status == "SKIP" and "no 'Out of bounds values' line" in result.text


# ---------------------------------------------------------------- NVL72: floors by domains spanned

TWO_RACKS = "coreweave_gb200_nvl72_2racks_all_reduce.txt"  # 36 trays, 810.4/820.4 GB/s
TWENTY_RACKS = "coreweave_gb200_20racks_1440gpu_all_reduce.txt"  # 360 trays, 405.7 GB/s


def spanning(name: str, nodes: int, domains: int | None) -> dict[str, Any]:
    found = section(name, nodes)
    found["nvlink_domains"] = domains
    return found


def test_nvl72_runs_are_judged_by_the_floor_of_the_domains_they_span():
    two = judge("nccl_bandwidth", spanning(TWO_RACKS, 36, 2), "gb200")
    assert two.status == "PASS", two.text
    assert "820.4 GB/s" in two.text and ">= 730 GB/s, 36 nodes in 2 NVLink domains" in two.text
    twenty = judge("nccl_bandwidth", spanning(TWENTY_RACKS, 360, 20), "gb200")
    assert twenty.status == "PASS" and ">= 365 GB/s, 360 nodes in 20 NVLink domains" in twenty.text
    # The same scale-out run judged as if it stayed in one rack is the false FAIL to avoid.
    one = judge("nccl_bandwidth", spanning(TWENTY_RACKS, 360, 1), "gb200")
    assert one.status == "FAIL"
    assert "< 750 GB/s expected, 360 nodes in 1 NVLink domain (profile gb200, " in one.text
    assert "nccl_nvlink_domains_min_busbw_gbps[1])" in one.text


def test_a_span_between_measured_ones_takes_the_larger_span_s_floor():
    five = judge("nccl_bandwidth", spanning(TWENTY_RACKS, 90, 5), "gb200")
    assert five.status == "PASS" and ">= 365 GB/s, 90 nodes in 5 NVLink domains" in five.text
    tight = judge(
        "nccl_bandwidth",
        spanning(TWENTY_RACKS, 90, 5),
        "gb200",
        nccl_nvlink_domains_min_busbw_gbps={1: 750, 8: 420, 20: 365},
    )
    assert tight.status == "FAIL" and "nccl_nvlink_domains_min_busbw_gbps[8]" in tight.text


def test_an_unknown_or_unmeasured_span_is_reported_not_judged():
    beyond = judge("nccl_bandwidth", spanning(TWENTY_RACKS, 720, 40), "gb200")
    assert beyond.status == "SKIP"
    assert "405.7 GB/s" in beyond.text
    assert "no floor for a span of 40 NVLink domains (nccl_nvlink_domains_min_busbw_gbps " in (
        beyond.text
    )
    unknown = judge("nccl_bandwidth", spanning(TWO_RACKS, 36, None), "gb200")
    assert unknown.status == "SKIP" and "set nvlink_domain for every host" in unknown.text
    # Where the profile also has a network floor, a run of unknown span is judged by it.
    network = judge(
        "nccl_bandwidth",
        spanning(TWO_RACKS, 36, None),
        "gb200",
        nccl_internode_min_busbw_gbps=700,
    )
    assert network.status == "PASS" and ">= 700 GB/s, 36 nodes" in network.text


def test_domain_floors_are_whole_positive_counts():
    assert validate("inventory host r1", {"nccl_nvlink_domains_min_busbw_gbps": {"2": 730}})
    for bad in ({0: 750}, {"two": 730}, {2: -1}, {2.0: 730}):
        with pytest.raises(ConfigError, match="nccl_nvlink_domains_min_busbw_gbps"):
            validate("inventory host r1", {"nccl_nvlink_domains_min_busbw_gbps": bad})


def test_triage_takes_the_domain_count_from_the_option():
    doc = triage(
        str(DATA / TWENTY_RACKS), "--profile", "gb200", "--nodes", "360", "--nvlink-domains", "20"
    )
    result = nccl_findings(doc)["nccl_bandwidth"]
    assert result["status"] == "PASS" and "360 nodes in 20 NVLink domains" in result["message"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuhealth.cli",
            "triage",
            str(DATA / TWO_RACKS),
            "--nvlink-domains",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "--nvlink-domains must be >= 1" in proc.stderr
