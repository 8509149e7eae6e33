"""Every crash, hang and false pass the fuzz tests (test_fuzz.py) found, as a regular test.

Each case is the minimal input hypothesis reported (or a readable equivalent), with the clean
outcome the parser must give instead.
"""

from __future__ import annotations

import pytest

from gpuhealth.families.dcgm import parse_dcgm
from gpuhealth.families.fabric import parse_rdma
from gpuhealth.families.gpu import parse_smi_text
from gpuhealth.families.kernel import parse_kernel_log
from gpuhealth.families.nccl import parse_nccl_tests
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


@pytest.mark.parametrize(
    ("printed", "kept"),
    [
        ("0000:3b:00.1", "00000000:3B:00.1"),
        ("19:00", "00000000:19:00.0"),
        (".", "."),
        ("1:2:3:4", "1:2:3:4"),
    ],
)
def test_a_bus_id_that_is_none_is_kept_as_printed(printed, kept):
    assert parse_kernel_log.bus_id(printed) == kept


def test_an_xid_report_that_cannot_be_read_fails_the_kernel_log_check():
    facts = healthy_h100()
    log = "[ 12.5] NVRM: Xid (PCI:0000:19:00): , pid=1, name=x, GPU has fallen off the bus\n"
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
