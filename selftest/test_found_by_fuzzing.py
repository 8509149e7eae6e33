"""Every crash, hang and false pass the fuzz tests (test_fuzz.py) found, as a regular test.

Each case is the minimal input hypothesis reported (or a readable equivalent), with the clean
outcome the parser must give instead.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from typing import Any

import pytest

from gpuhealth import cli
from gpuhealth.documents import FactsError, load_facts, validated
from gpuhealth.families.dcgm import parse_dcgm
from gpuhealth.families.fabric import parse_fi_info, parse_rdma
from gpuhealth.families.gpu import parse_nvlink, parse_smi_text, parse_smi_xml
from gpuhealth.families.gpud import parse_gpud
from gpuhealth.families.kernel import parse_kernel_log
from gpuhealth.families.nccl import parse_nccl_tests
from gpuhealth.families.system import parse_proc
from gpuhealth.parsing import ParseError
from selftest.facts import DATA, healthy_h100, judge

NCCL_ONE_NODE = DATA / "nccl-tests" / "nccltests_issue290_1node_8xH100_nvls_all_reduce.txt"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"DCGM GPU Diagnostic": "N/A"}', "DCGM GPU Diagnostic: expected an object, got str"),
        ('{"DCGM Diagnostic": {"test_categories": 7}}', "test_categories: expected an array"),
        ('{"DCGM Diagnostic": {"test_categories": [[1]]}}', "a test category: expected an object"),
        ('{"DCGM Diagnostic": {"test_categories": [{"tests": [{"results": {}}]}]}}', "results:"),
        ('{"DCGM Diagnostic": {}, "metadata": []}', "metadata: expected an object, got list"),
    ],
)
def test_dcgm_diag_of_the_wrong_shape_is_a_parse_error(text, message):
    with pytest.raises(ParseError, match=message):
        parse_dcgm.parse_diag(text)


def test_dcgm_health_with_a_list_for_an_entity_is_a_parse_error():
    text = '{"body": {"Overall Health": {"value": "Healthy"}, "GPU": {"children": {"0": []}}}}'
    with pytest.raises(ParseError, match="expected an object, got list"):
        parse_dcgm.parse_health(text)


def test_dcgm_health_overflow_that_is_not_a_list_is_kept_as_text():
    text = (
        '{"body": {"Overall Health": {"value": "Warning"}, "GPU": {"children": {"0": '
        '{"children": {"Errors": {"children": {"PCIe system": {"value": "Warning", '
        '"overflow": 12}}}}}}}}}'
    )
    (incident,) = parse_dcgm.parse_health(text)["incidents"]
    assert incident["message"] == "12"


def test_nvidia_smi_text_nested_deeper_than_it_ever_is_is_refused():
    text = "".join(" " * depth + "x\n" for depth in range(0, 200, 2))
    with pytest.raises(ParseError, match="nested more than 32 levels deep"):
        parse_smi_text.parse(text)


def test_a_key_followed_by_a_long_run_of_spaces_is_a_title_not_a_key():
    """`\\S.*?\\s+:` spent 35 s on such a 120 KB line; the split is now linear."""
    line = "a" + " " * 120_000 + "b"
    assert parse_smi_text._key_value(line) == (line, None)
    assert parse_smi_text._key_value("Product Name  :  NVIDIA H100") == (
        "Product Name",
        "NVIDIA H100",
    )
    assert parse_smi_text._key_value("Reserved :") == ("Reserved", "")


@pytest.mark.parametrize("text", ["9" * 120_000, "²", "12 34", "-1"])
def test_a_counter_that_is_not_one_plain_number_is_refused(text):
    with pytest.raises(ParseError, match="not a counter value"):
        parse_rdma.parse_counter(text)


@pytest.mark.parametrize(
    "line",
    [
        "0024-11-15T05:39:15,491363+00:00 NVRM: Xid (PCI:0000:19:00): 79, pid=1, name=x, gone",
        "9999-12-31T23:59:59,000000-05:00 NVRM: Xid (PCI:0000:19:00): 79, pid=1, name=x, gone",
    ],
    ids=["year-24", "year-10000"],
)
def test_a_year_no_clock_shows_is_no_timestamp(line):
    with pytest.raises(ParseError, match="line 1: not a kernel log line"):
        parse_kernel_log.parse(line + "\n")


def test_an_xid_report_that_cannot_be_read_fails_the_kernel_log_check():
    facts = healthy_h100()
    # (no fault words in its text: a "fallen off the bus" there is a kernel fault of its own)
    log = "[ 12.5] NVRM: Xid (PCI:0000:19:00): , pid=1, name=x, Ch 00000008\n"
    parsed = parse_kernel_log.parse(log)
    assert [e["kind"] for e in parsed["events"]] == ["unreadable"]
    section = {
        "source": "dmesg",
        "window_h": None,
        "since": None,
        "until": None,
        "until_uptime_s": 12.5,
        "anchored_at": "newest_entry",
        "notes": [],
        **parse_kernel_log.summarise(parsed["events"]),
        "unavailable": {},
    }
    facts["kernel_log"] = section
    result = judge("kernel_log", facts)
    assert result.status.value == "FAIL"
    assert "XID/SXID reports that cannot be read x1" in result.result.message


def test_the_lines_after_an_sxid_are_not_unreadable_reports():
    text = (
        "[ 10.0] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up\n"
        "[ 10.0] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Severity 5 Engine instance 30\n"
    )
    assert [e["kind"] for e in parse_kernel_log.parse(text)["events"]] == ["sxid"]


def test_nccl_header_search_is_not_fooled_by_lines_of_spaces():
    """`^[ \\t]*(?:\\S+:)?#?[ \\t]*size` took 5 s on 2,000 lines of leading spaces."""
    spaces = "".join(" " * depth + "x\n" for depth in range(0, 4000, 2))
    assert not parse_nccl_tests.looks_like(spaces)
    assert parse_nccl_tests.looks_like(spaces + NCCL_ONE_NODE.read_text())


def nccl_without(size: str) -> str:
    lines = NCCL_ONE_NODE.read_text().splitlines(keepends=True)
    return "".join(line for line in lines if not line.lstrip().startswith(size))


def test_a_row_missing_from_the_middle_of_the_sweep_is_incomplete():
    run = parse_nccl_tests.parse(nccl_without("536870912 "))
    assert run["sweep_gap"] == (268435456, 1073741824)
    facts = {"source": "evidence-file", "nccl": {"nodes": 1, "run": run}}
    result = judge("nccl_data_integrity", facts)
    assert (result.status.value, result.action.value) == ("FAIL", "RERUN")
    assert "rows are missing from the sweep between 256 MiB and 1 GiB" in result.result.message


def test_rows_elided_with_dots_are_not_evaluated():
    excerpt = NCCL_ONE_NODE.read_text().replace("   536870912 ", "...\n   536870912 ", 1)
    run = parse_nccl_tests.parse(excerpt)
    assert run["rows_elided"] and run["sweep_gap"] is None
    facts = {"source": "evidence-file", "nccl": {"nodes": 1, "run": run}}
    result = judge("nccl_data_integrity", facts)
    assert result.status.value == "SKIP" and "elides rows" in result.result.message


# ---------------------------------------------------------------- from the fuzz campaign report
# (a helper's mutation campaign over every parser and triage: crashes, slow inputs, false passes)

H100_TEXT = (DATA / "nvidia-smi" / "gpud_h100x8_535.161.08_query.txt").read_text()
T4_XML = (DATA / "nvidia-smi" / "telegraf_tesla-t4_515.105.01_v11.xml").read_text()


def test_xml_nested_deeper_than_nvidia_smi_ever_is_refused():
    deep = "<a>" * 1000 + "x" + "</a>" * 1000
    text = T4_XML.replace("<product_name>", deep + "<product_name>", 1)
    with pytest.raises(ParseError, match="nested more than 32 levels deep"):
        parse_smi_xml.parse(text)


def test_a_driver_version_of_5000_digits_is_unreadable_not_a_crash():
    text = H100_TEXT.replace("535.161.08", "5" * 5000, 1)
    doc = parse_smi_text.parse(text)
    assert doc["driver"]["version"] is None
    assert doc["driver"]["unavailable"]["version"]["kind"] == "error"
    assert judge("driver_version", {**doc, "source": "evidence-file"}).status.value == "FAIL"


def test_an_attached_count_no_node_has_is_refused():
    with pytest.raises(ParseError, match="Attached GPUs 100000 is more than a node holds"):
        parse_smi_text.parse(
            H100_TEXT.replace(
                "Attached GPUs                             : 8",
                "Attached GPUs                             : 100000",
            )
        )


def test_fi_getinfo_error_of_5000_digits_is_no_error_code():
    with pytest.raises(ParseError, match="no fi_info provider block"):
        parse_fi_info.parse("fi_getinfo: -" + "9" * 5000 + "\n")


def test_nccl_columns_out_of_order_are_an_unknown_header():
    text = (
        "#  size count type redop root algbw time busbw #wrong\n  8 2 float sum -1 1.0 2.0 3.0 0\n"
    )
    with pytest.raises(ParseError, match="unknown nccl-tests column header"):
        parse_nccl_tests.parse(text)


def test_long_lines_in_nvlink_status_and_fi_info_are_read_linearly():
    links = parse_nvlink.parse_status("GPU 0: X\n\t Link 0: x" + " " * 100_000 + "y\n")
    assert links == {0: [{"link": 0, "up": False, "speed_gbps": None}]}
    block = (DATA / "efa" / "awesome-networking_p4de_fi_info_efa_rdm_4dev.txt").read_text()
    spaced = block.replace("    fabric:", "    fabric: x" + " " * 100_000 + "y\n    fabric:", 1)
    assert parse_fi_info.parse(spaced)["entries"]


def test_many_peermem_mentions_without_error_are_no_event():
    line = "[    1.000000] " + "nvidia-peermem " * 20_000
    assert parse_kernel_log.parse(line + "\n")["events"] == []
    assert parse_kernel_log.parse(line + "ERROR x\n")["events"][0]["kind"] == "peermem"


def test_a_cpu_range_beyond_any_machine_is_refused():
    with pytest.raises(ParseError, match="beyond any machine"):
        parse_proc.cpulist("0-99999999999")


def test_triage_refuses_a_fifo_instead_of_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert cli.main(["triage", str(fifo)]) == 2


def test_temperature_headroom_is_not_claimed_without_the_slowdown_point():
    facts = healthy_h100()
    gpu = facts["gpus"][0]
    gpu["temp_slowdown_c"] = None
    gpu["unavailable"]["temp_slowdown_c"] = {"kind": "error", "detail": "cannot read 'x'"}
    result = judge("temperature", facts, 0)
    assert result.status.value == "FAIL" and "the GPU's slowdown temperature" in result.text
    gpu["unavailable"]["temp_slowdown_c"] = {"kind": "not_supported", "detail": "N/A"}
    assert "this GPU has no slowdown point" in judge("temperature", facts, 0).text


def test_an_unknown_retired_page_count_is_not_zero():
    facts = healthy_h100()
    facts["gpus"][0]["retired_pages"] = {"single_bit": 0, "double_bit": None, "pending": False}
    result = judge("retired_pages", facts, 0)
    assert (result.status.value, result.result.message) == (
        "FAIL",
        "retired pages not reported: double_bit",
    )


def test_a_link_width_that_is_unknown_is_not_vouched_for():
    facts = healthy_h100()
    facts["gpus"][0]["pcie"]["width_max"] = None
    result = judge("pcie_link", facts, 0, profile="default")
    assert result.status.value == "FAIL" and "PCIe link width not reported" in result.text


def test_an_xid_whose_timestamp_is_garbled_is_kept_without_a_time():
    log = (
        "2024-11-15T12:00:00,000000+00:00 usb 1-1: reset\n"
        "2024-11-15T12:00:0O,000000+00:00 NVRM: Xid (PCI:0000:19:00): 79, pid=1, name=x, "
        "GPU has fallen off the bus.\n"
        "2024-11-15T12:00:01,000000+00:00 usb 1-1: reset\n"
    )
    (event,) = parse_kernel_log.parse(log)["events"]
    assert (event["code"], event["time"], event["uptime_s"]) == (79, None, None)


def fm_log(level: str = "ERROR", month: str = "Feb") -> str:
    return (
        "[Feb 25 2025 13:59:45] [INFO] [tid 1] Fabric Manager started\n"
        f"[{month} 25 2025 14:00:00] [{level}] [tid 2] detected NVSwitch fatal error 12028 on "
        "fid 0 on NVSwitch pci bus id 00000000:05:00.0 physical id 0 port 3\n"
    )


@pytest.mark.parametrize(
    ("level", "month", "kind", "fatal"),
    [
        ("ERROR", "Feb", "fabric_manager", True),
        ("CRITICAL", "Feb", "fabric_manager", True),
        ("EROR", "Feb", "unreadable", None),
        ("ERROR", "Fbe", "fabric_manager", True),
    ],
    ids=["error", "critical", "garbled-level", "garbled-month"],
)
def test_fabric_manager_entries_are_never_dropped_for_a_garbled_field(level, month, kind, fatal):
    (event,) = parse_kernel_log.parse_fabric_manager(fm_log(level, month))["events"]
    assert event["kind"] == kind and event.get("fatal") is fatal


def test_an_absurd_uptime_at_the_end_does_not_end_the_log():
    log = (
        "[171160.000000] NVRM: Xid (PCI:0000:19:00): 79, pid=1, name=x, gone\n"
        "[171167.000000] usb 1-1: reset\n"
        "[99999999999.000000] usb 1-1: reset\n"
    )
    parsed = parse_kernel_log.parse(log)
    assert (parsed["newest_uptime_s"], parsed["future_lines"]) == (171167.0, 1)


def nccl_section(text: str) -> dict[str, Any]:
    return {"nodes": 1, "run": parse_nccl_tests.parse(text)}


def test_a_lone_wrong_na_among_validated_rows_is_not_a_pass():
    text = NCCL_ONE_NODE.read_text().replace("382.99      0", "382.99    N/A", 1)
    facts = {"source": "evidence-file", "nccl": nccl_section(text)}
    result = judge("nccl_data_integrity", facts)
    assert result.status.value == "FAIL" and "#wrong N/A at 128 MiB out-of-place" in result.text


def test_a_footer_that_says_failed_but_cannot_be_read_is_not_a_pass():
    text = NCCL_ONE_NODE.read_text().replace(
        "# Out of bounds values : 0 OK", "# Out of bounds va1ues : 5 FAILED"
    )
    facts = {"source": "evidence-file", "nccl": nccl_section(text)}
    result = judge("nccl_data_integrity", facts)
    assert result.status.value == "FAIL" and "the log says FAILED" in result.text


def test_a_gpud_component_with_no_state_is_unknown_not_healthy():
    doc = [
        {"component": "xid", "states": []},
        {"component": "cpu", "states": [{"name": "cpu", "health": "Healthy"}]},
    ]
    states = parse_gpud.states(doc)
    assert [s["health"] for s in states] == [None, "Healthy"]


@pytest.mark.parametrize(
    ("printed", "status"),
    [("critical", "FAIL"), ("FATAL", "FAIL"), (None, "WARN"), ("N/A", "WARN"), ("", "WARN")],
)
def test_gpud_event_types_in_any_case_and_unknown_ones_are_never_ignored(printed, status):
    event = {"component": "xid", "name": "error_xid", "message": "XID 79", "type": printed}
    section = {
        "since": None,
        "events": parse_gpud.events([{"component": "xid", "events": [event]}]),
    }
    result = judge("gpud_events", {"source": "evidence-file", "gpud_events": section})
    assert result.status.value == status


def test_a_dcgm_failure_on_a_gpu_the_evidence_does_not_list_is_judged_node_wide():
    diag = parse_dcgm.parse_diag(
        '{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [{"name": '
        '"memory", "results": [{"entity_group": "GPU", "entity_id": 0, "status": "Pass"}, '
        '{"entity_group": "GPU", "entity_id": 1, "status": "Fail", "warnings": ["bad"]}]}]}]}}'
    )
    facts = {
        "source": "evidence-file",
        "gpus": [{"index": 0, "unavailable": {}}],
        "dcgm": {"level": 3, "diag": diag, "error": None},
    }
    # Judged per GPU is only what the evidence holds slots for: here one GPU (no profile count).
    result = judge("dcgm_diag", facts, profile="default")
    assert result.status.value == "FAIL" and "GPU 1 memory" in result.text


def test_dcgm_health_is_the_worst_of_overall_and_its_entities():
    text = (
        '{"body": {"Overall Health": {"value": "Healthy"}, "GPU": {"children": {"0": '
        '{"value": "Warning", "children": {"Errors": {"children": {"PCIe system": '
        '{"value": "Warning", "overflow": ["replays"]}}}}}}}}}'
    )
    facts = {"source": "evidence-file", "dcgm_health": {"health": parse_dcgm.parse_health(text)}}
    result = judge("dcgm_health", facts)
    assert result.status.value == "WARN" and "(overall says Healthy)" in result.text


def test_a_dcgm_category_without_its_tests_is_refused():
    with pytest.raises(ParseError, match="an entry without 'tests'"):
        parse_dcgm.parse_diag('{"DCGM Diagnostic": {"test_categories": [{"xests": []}]}}')


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("GPU 00000000:19:00.0", "xPU 00000000:19:00.0", "holds an indented block but is not"),
        ("GPU 00000000:3B:00.0\n", "", "a second 'Product Name' in the GPU section of line 9"),
    ],
    ids=["header-garbled", "header-deleted"],
)
def test_a_lost_gpu_header_is_an_error_not_a_renumbered_fleet(old, new, message):
    with pytest.raises(ParseError, match=re.escape(message)):
        parse_smi_text.parse(H100_TEXT.replace(old, new, 1))


def test_a_slowdown_point_printed_as_an_offset_is_never_declared_absent():
    """T.Limit N/A beside a printed slowdown offset: the GPU has the point, it is unknown."""
    line = "        GPU T.Limit Temp                  : 56 C\n"
    assert line in H100_TEXT
    doc = parse_smi_text.parse(H100_TEXT.replace(line, line.replace("56 C", "N/A"), 1))
    gpu = doc["gpus"][0]
    assert gpu["temp_slowdown_c"] is None
    assert gpu["unavailable"]["temp_slowdown_c"]["kind"] == "error"
    result = judge("temperature", {**doc, "source": "evidence-file"}, 0)
    assert result.status.value == "FAIL" and "the GPU's slowdown temperature" in result.text


def test_a_label_no_nvidia_smi_prints_is_refused_before_paths_repeat_it():
    text = H100_TEXT.replace(
        "    Product Name", "    " + "L" * 100_000 + "\n        x : 1\n    Product Name", 1
    )
    with pytest.raises(ParseError, match="a label of 100000 characters"):
        parse_smi_text.parse(text)


# Found by reviewing the change: verdicts on data that is missing, unknown or impossible.


def test_a_legacy_log_whose_error_column_is_all_na_is_not_validated():
    text = (DATA / "nccl-tests" / "nccltests_issue37_8xV100_all_gather_legacy.txt").read_text()
    text = text.replace("1e+00", "N/A")  # the error column: nothing validated
    text = text.replace(": 2 FAILED", ": 0 OK")
    facts = {"source": "evidence-file", "nccl": nccl_section(text)}
    assert all(row["out_of_place"]["max_error"] is None for row in facts["nccl"]["run"]["rows"])
    result = judge("nccl_data_integrity", facts)
    assert result.status.value == "SKIP" and "not validated" in result.text


def test_a_lone_wrong_na_is_a_log_to_read_again_not_a_gpu_to_drain():
    text = NCCL_ONE_NODE.read_text().replace("382.99      0", "382.99    N/A", 1)
    result = judge("nccl_data_integrity", {"source": "evidence-file", "nccl": nccl_section(text)})
    assert (result.status.value, result.action.value) == ("FAIL", "RERUN")
    assert "data corruption" not in result.text


def test_a_narrow_link_is_judged_even_while_an_idle_gpu_lowers_its_speed():
    facts = healthy_h100()
    gpu = facts["gpus"][0]
    gpu["pcie"].update(gen_current=1, width_current=8)
    gpu["clock_event_reasons"]["active"] = ["gpu_idle"]
    result = judge("pcie_link", facts, 0, profile="default")
    assert result.status.value == "WARN" and "PCIe link x8 of x16" in result.text


def test_an_unreported_link_generation_is_not_passed():
    facts = healthy_h100()
    facts["gpus"][0]["pcie"]["gen_current"] = None
    result = judge("pcie_link", facts, 0, profile="default")
    assert result.status.value == "FAIL" and "PCIe link generation not reported" in result.text


def test_an_ecc_group_that_is_unsupported_as_a_whole_skips_or_fails_the_requirement():
    facts = healthy_h100()
    gpu = facts["gpus"][0]
    gpu["ecc"]["aggregate"] = None
    gpu["ecc"]["unavailable"] = {"aggregate": {"kind": "not_supported", "detail": "N/A"}}
    assert judge("ecc_errors", facts, 0, require_ecc=False).status.value == "SKIP"
    result = judge("ecc_errors", facts, 0)  # h100-sxm requires ECC
    assert (result.status.value, result.action.value) == ("FAIL", "FIX_CONFIG")


def test_an_unreadable_clock_reason_is_not_hidden_by_an_unsupported_one():
    facts = healthy_h100()
    reasons = facts["gpus"][0]["clock_event_reasons"]
    reasons["unavailable"] = {
        "hw_thermal_slowdown": {"kind": "not_supported", "detail": "N/A"},
        "hw_power_brake_slowdown": {"kind": "error", "detail": "cannot read it"},
    }
    result = judge("throttle", facts, 0)
    assert (result.status.value, result.action.value) == ("FAIL", "RERUN")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("retired_pages", {"single_bit": -100, "double_bit": 5, "pending": False}),
        ("pcie", {"gen_current": 5, "gen_max": 5, "width_current": -16, "width_max": 16}),
        ("performance_state", "fast"),
    ],
)
def test_impossible_gpu_values_are_refused_not_judged(field, value):
    doc = healthy_h100()
    doc["gpus"][0][field] = value
    with pytest.raises(FactsError, match=field):
        validated(doc, "a test document")


def test_a_saved_facts_file_that_is_a_fifo_is_refused_instead_of_blocking(tmp_path):
    fifo = tmp_path / "n1.json"
    os.mkfifo(fifo)
    with pytest.raises(FactsError, match="not a regular file"):
        load_facts(fifo)


# Found by reviewing the node-side parsers.


def test_a_sweep_whose_sizes_are_rounded_down_per_rank_has_no_gap():
    """nccl-tests prints each size rounded down to whole elements per rank (24 ranks of
    floats: multiples of 96 B), and steps from the unrounded one."""
    header = {"min_bytes": 8, "step": 2, "step_kind": "factor"}
    sizes = [8 << k for k in range(20)]
    rows = [{"type": "float", "redop": "none", "size": s // 96 * 96} for s in sizes]
    assert parse_nccl_tests._sweep_gap(header, rows) is None
    del rows[12]  # 32 KiB missing
    assert parse_nccl_tests._sweep_gap(header, rows) == (16320, 65472)


def test_a_row_missing_from_a_second_root_or_cycle_is_a_gap():
    """broadcast with `-r -1` sweeps again for every root, and repeated cycles sweep again:
    a row missing from the second sweep is found there."""
    mib = 1 << 20
    header = {"min_bytes": mib, "step": 2, "step_kind": "factor"}

    def sweep(root, sizes):
        return [{"type": "float", "redop": "none", "root": root, "size": s * mib} for s in sizes]

    rows = sweep(0, [1, 2, 4, 8]) + sweep(1, [1, 4, 8])
    assert parse_nccl_tests._sweep_gap(header, rows) == (mib, 4 * mib)
    again = sweep(0, [1, 2, 4, 8]) + sweep(0, [1, 4, 8])
    assert parse_nccl_tests._sweep_gap(header, again) == (mib, 4 * mib)
    assert parse_nccl_tests._sweep_gap(header, sweep(0, [1, 2, 4]) * 2) is None


def test_an_ecc_total_with_an_unknown_part_fails_on_the_parts_it_knows():
    facts = healthy_h100()
    group = facts["gpus"][0]["ecc"]["aggregate"]
    group.update(uncorrected=None, dram_uncorrected=7, sram_uncorrected=None)
    group["unavailable"] = {"uncorrected": {"kind": "not_supported", "detail": "N/A"}}
    result = judge("ecc_errors", facts, 0, profile="default")
    assert (result.status.value, result.action.value) == ("FAIL", "RESET_GPU")
    assert "aggregate uncorrected ECC errors at least 7 > 0" in result.text


def test_a_vgpu_capability_block_is_not_a_lost_gpu_header():
    block = "vGPU Driver Capability\n        Heterogenous Multi-vGPU           : Supported\n"
    text = H100_TEXT.replace("Attached GPUs", block + "Attached GPUs", 1)
    assert len(parse_smi_text.parse(text)["gpus"]) == 8
    cuda = parse_smi_text.parse(text.replace(": 12.2", ": Not Found", 1))["driver"]
    assert cuda["unavailable"]["cuda_driver_version"]["kind"] == "not_supported"


def test_a_footer_with_a_long_run_of_spaces_is_read_linearly():
    """`\\s*(OK|FAILED)?\\s*$` backtracked quadratically: ~90 s on a 200 KB line."""
    text = NCCL_ONE_NODE.read_text() + "# Out of bounds values : 0" + " " * 200_000 + "x\n"
    with pytest.raises(ParseError, match="cannot read the footer line"):
        parse_nccl_tests.parse(text)


def test_dcgm_messages_nested_without_end_are_a_parse_error():
    messages = "[" * 40 + '"x"' + "]" * 40
    text = (
        '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "m", "results": '
        '[{"entity_group": "GPU", "entity_id": 0, "status": "Fail", "warnings": '
        f"{messages}}}]}}]}}]}}}}"
    )
    with pytest.raises(ParseError, match="nested more than 8 levels"):
        parse_dcgm.parse_diag(text)


def test_a_dcgm_test_list_that_is_null_is_refused_not_empty():
    with pytest.raises(ParseError, match="an entry without 'tests'"):
        parse_dcgm.parse_diag('{"DCGM Diagnostic": {"test_categories": [{"tests": null}]}}')


def test_an_xid_code_longer_than_any_is_unreadable_not_cut():
    line = "[ 12.0] NVRM: Xid (PCI:0000:19:00): " + "9" * 19 + ", pid=1, name=x, msg\n"
    (event,) = parse_kernel_log.parse(line)["events"]
    assert event["kind"] == "unreadable"


def test_nvidia_smi_xml_with_a_huge_tag_is_refused_before_it_costs_memory():
    tag = "a" * 400_000
    leaves = "".join(f"<b{i}>1</b{i}>" for i in range(20_000))
    xml = (
        '<?xml version="1.0"?><nvidia_smi_log><driver_version>570.1</driver_version>'
        f'<attached_gpus>1</attached_gpus><gpu id="00000000:19:00.0"><{tag}>{leaves}</{tag}>'
        "</gpu></nvidia_smi_log>"
    )
    with pytest.raises(ParseError, match="a field path of 400003 characters"):
        parse_smi_xml.parse(xml)


def test_a_gpu_section_whose_first_field_lost_its_indent_is_refused_not_emptied():
    """`    Product Name : X` -> ` #?!   Product Name : X`: every line after it fell under that
    line, the GPU's section came out empty, and triage passed a node with HW Slowdown."""
    start = H100_TEXT.index("\nGPU 00000000:4C:00.0\n") + len("\nGPU 00000000:4C:00.0\n")
    text = H100_TEXT[:start] + " #?!" + H100_TEXT[start + 1 :]
    with pytest.raises(ParseError, match="has a value and holds an indented block"):
        parse_smi_text.parse(text)


def test_a_whole_nvidia_smi_q_without_its_banner_is_not_taken_for_fabric_lines(tmp_path):
    """Found by test_destroying_the_evidence_of_a_fault_never_gives_pass: an H100 `nvidia-smi
    -q` with uncorrected ECC on gpu2 whose banner and Driver Version lines were deleted was
    read as pasted `grep -A8 Fabric` lines, whose parser keeps the fabric only: PASS."""
    text = H100_TEXT
    gpu2 = [m.start() for m in re.finditer(r"^GPU ", text, re.M)][2]
    at = text.index("DRAM Uncorrectable            : 0", gpu2)
    text = text[:at] + text[at:].replace(": 0", ": 2", 1)
    kept = [
        line
        for line in text.splitlines(keepends=True)
        if "NVSMI LOG" not in line and not line.startswith("Driver Version")
    ]
    path = tmp_path / "pasted.txt"
    path.write_text("".join(kept))
    assert cli.main(["triage", str(path), "--profile", "h100-sxm", "--json"]) == 1
    # Without "Attached GPUs" too, it is no output triage can read, and never fabric lines.
    headless = "".join(line for line in kept if "Attached GPUs" not in line)
    with pytest.raises(ParseError, match="not `grep -A8 Fabric` output"):
        parse_smi_text.parse_fabric_fragment(headless)


def test_fabric_lines_pasted_with_their_command_are_still_read():
    text = "$ nvidia-smi -q | grep -A8 Fabric\n    Fabric\n        State : Completed\n"
    text += "        Status : Success\n"
    (gpu,) = parse_smi_text.parse_fabric_fragment(text)["gpus"]
    assert (gpu["fabric"]["state"], gpu["fabric"]["status"]) == ("Completed", "Success")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0" * 5000, "GPU NUMA ID '00000000000000000000' is no NUMA node"),
        ("2x", "GPU NUMA ID '2x' is no NUMA node"),
    ],
    ids=["5000-digits", "garbled"],
)
def test_a_gpu_numa_id_that_is_no_number_is_refused(value, message):
    """Found by a review's fuzzing: a 5,000-digit GPU NUMA ID raised ValueError (the int()
    digit limit of Python 3.8+, where 3.6 took it), and a garbled one was read as N/A, which
    would let a Grace GPU's printed SYS pass for a distance."""
    from gpuhealth.families.fabric import parse_topo

    text = (DATA / "topology" / "sglang30401_h100x8_topo_m.txt").read_text()
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("GPU0 "))
    lines[row] = lines[row].rstrip().rsplit(None, 1)[0] + "     " + value
    with pytest.raises(ParseError, match=re.escape(message)):
        parse_topo.parse("\n".join(lines) + "\n")


def _unhealthy_fabric_lines() -> str:
    from selftest.test_nvfabric import GPU_TEXT, TRAY_BUSES, grep_after

    text = GPU_TEXT.format(bus=TRAY_BUSES[0], guid=1, summary="Unhealthy", route_unhealthy="True")
    return grep_after(text, "Fabric", 12)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("        Health\n", ""),
        ("            Summary", "\x1b[0m            Summary"),
    ],
    ids=["health-title-lost", "escape-code"],
)
def test_pasted_fabric_lines_that_still_say_unhealthy_fail(tmp_path, old, new):
    """Found by a mutation campaign: a GB200 Fabric paste whose `Health` title line was lost
    (its lines then sit under ClusterUUID), or with a terminal escape code before `Summary`
    (the line then leaves the block), came out PASS: health "not evaluated" although
    `Summary : Unhealthy` and `Route Unhealthy : True` were still there."""
    text = _unhealthy_fabric_lines()
    assert old in text
    path = tmp_path / "fabric.txt"
    path.write_text(text.replace(old, new, 1))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(["triage", str(path), "--profile", "gb200", "--json"])
    found = json.loads(out.getvalue())["findings"]
    (health,) = [f for f in found if f["check"] == "nvlink_fabric_health" and f["gpu"] == 0]
    assert rc == 1 and health["status"] == "FAIL", health
    assert "route unhealthy" in health["message"]


def test_fi_info_counts_an_efa_device_listed_under_two_fabrics_once():
    """libfabric 2.x lists each EFA device's RDM domain under the fabrics `efa` and
    `efa-direct`: counted as entries, one device was two and its count came out wrong."""
    text = (DATA / "efa" / "hyperpod_fi_info_efa_libfabric2_efa_direct_1dev.txt").read_text()
    summary = parse_fi_info.summary(parse_fi_info.parse(text))
    assert summary["domains"] == ["rdmap49s0-rdm"]
    fabric = {"devices": None, "fi_info": {"rc": 0, **summary}}
    facts = {"source": "evidence-file", "fabric": fabric}
    finding = judge("efa_fi_info", facts, None, "p5.48xlarge", fabric="efa", efa_devices_expected=1)
    assert finding.status.name == "PASS", finding.result.message
    assert "lists 1 EFA RDM domains as expected" in finding.result.message


def test_a_sweep_repeated_1030_times_is_read_not_overflowed():
    """`-b 8 -e 8 -N 1030` prints 1,030 rows of one size: the size the sweep meant doubled on
    every row, past what a float holds (OverflowError, triage exit 3)."""
    head = (
        "# nThread 1 nGpus 8 minBytes 8 maxBytes 8 step: 2(factor) warmup iters: 5 iters: 20 "
        "agg iters: 1 validation: 1 graph: 0\n#\n"
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
        "     time   algbw   busbw  #wrong\n"
    )
    row = (
        "           8             2     float     sum      -1    21.09    0.00    0.00      0"
        "    20.27    0.00    0.00      0\n"
    )
    run = parse_nccl_tests.parse(head + row * 1030 + "# Out of bounds values : 0 OK\n")
    assert (len(run["rows"]), run["sweep_gap"], run["sweep_complete"]) == (1030, None, True)


def test_an_older_table_inserted_in_a_log_does_not_hide_its_rows(tmp_path, capsys):
    """A 2-node all_reduce of low bandwidth with a pre-2.10 column header and one row of that
    layout inserted came out PASS: the row without a root column made the collective unknown
    (bandwidth skipped), and its `error` column stood in for the real rows' unvalidated N/A."""
    text = (DATA / "nccl-tests" / "nccltests_issue290_2node_16xH100_ring_low_bw.txt").read_text()
    lines = text.splitlines(keepends=True)
    inserted = [
        "0:        size         count      type     time   algbw   busbw  error     time   algbw"
        "   busbw  error\n",
        "0:           8             2     float    10.93    0.00    0.00  0e+00    10.90    0.00"
        "    0.00  0e+00\n",
    ]
    path = tmp_path / "all_reduce.log"
    path.write_text("".join(lines[:18] + inserted + lines[18:]))
    assert parse_nccl_tests.parse(path.read_text())["collective"] == "all_reduce"
    assert cli.main(["triage", str(path), "--profile", "h100-sxm", "--json"]) == 1
    found = {f["check"]: f["status"] for f in json.loads(capsys.readouterr().out)["findings"]}
    assert (found["nccl_bandwidth"], found["nccl_data_integrity"]) == ("FAIL", "SKIP")


def test_a_reasons_map_that_is_not_one_is_an_unread_value_not_a_crash():
    """Found by the facts-document campaign: a GB200 fabric health record whose `unavailable`
    was `true` crashed nvlink_fabric_health; an unexplained null is a failed read."""
    from gpuhealth.facts import reason

    for broken in (True, [], "x", 3):
        assert reason({"unavailable": broken}, "summary") == {"kind": "error", "detail": "no value"}
    assert reason(["not", "a", "record"], "summary")["kind"] == "error"  # type: ignore[arg-type]


def test_the_reclaim_wait_s_bookkeeping_of_saved_facts_may_be_null():
    """Found by review: validated saved facts with a null wait_s, poll_s or waited_s crashed
    memory_reclaim while it wrote its message; the memory is still judged."""
    for key in ("wait_s", "poll_s", "waited_s"):
        facts = healthy_h100()
        facts["memory_reclaim"].update({key: None, "wait_capped": True})
        facts["memory_reclaim"]["gpus"][0]["used_mib"] = 20480
        result = judge("memory_reclaim", facts, 0)
        assert result.status.value == "FAIL" and "? s" in result.result.message, key
