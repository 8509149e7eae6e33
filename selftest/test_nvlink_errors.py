"""NVLink error counters over a window (issue 14 item 5) and the NVML platform info: the NVML
reader under the fake library (the legacy counters, and on Blackwell the NVLink5 field values),
the nvlink_errors check on hand-built records, and the history metric that compares the
counters run over run."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from gpuhealth import registry
from gpuhealth.checks import Check, evaluate
from gpuhealth.families.gpu import metrics
from gpuhealth.families.gpu.schema import (
    NVLINK_ERROR_COUNTERS,
    NVLINK_FIELD_COUNTERS,
    PLATFORM_KEYS,
)
from gpuhealth.families.history.checks import Judgement, judge_values
from gpuhealth.families.history.limits import HistoryLimits
from gpuhealth.registry import checks
from gpuhealth.results import Status
from selftest.facts import view
from selftest.fakenvml import write_scenario
from selftest.test_probe_nvml import run_probe, unexplained_nulls

NAMES = [name for name, _, _ in NVLINK_ERROR_COUNTERS]
FIELDS = [name for name, _, _ in NVLINK_FIELD_COUNTERS]
WINDOW_S = 0.5

# ---------------------------------------------------------------- the check, on hand-built facts


def record(
    window_s: float | None = 2.0, links: int = 18, base: int = 7, **grow: int
) -> dict[str, Any]:
    """A GPU's nvlink_errors from the legacy counters (as facts before `source` existed):
    every counter `base` on `links` active links, read twice `window_s` apart; `grow` adds
    `link<N>_<counter>=delta` to one counter's second read."""
    entries = []
    for link in range(links):
        entry: dict[str, Any] = {"link": link, "unavailable": {}}
        for name in NAMES:
            delta = grow.get(f"link{link}_{name}", 0)
            entry[name] = {"first": base, "second": base + delta, "unavailable": {}}
        entries.append(entry)
    return {"window_s": window_s, "links": entries, "unavailable": {}}


def fields(links: int = 18, **values: int) -> dict[str, Any]:
    """A Blackwell GPU's nvlink_errors from the NVLink5 field values: every counter 0 on
    `links` links, read 2 s apart; `link<N>_<counter>=first` sets a counter that does not grow,
    and `link<N>_<counter>_grow=delta` makes one grow."""
    entries = []
    for link in range(links):
        entry: dict[str, Any] = {"link": link, "unavailable": {}}
        for name in FIELDS:
            first = values.get(f"link{link}_{name}", 0)
            second = first + values.get(f"link{link}_{name}_grow", 0)
            entry[name] = {"first": first, "second": second, "unavailable": {}}
        entries.append(entry)
    return {"source": "field_values", "window_s": 2.0, "links": entries, "unavailable": {}}


def judged(gpu_record: Any, profile: str = "gb200", **overrides: Any) -> Any:
    """The nvlink_errors finding on GPU 0 of a node whose only GPU has this record."""
    gpu: dict[str, Any] = {"index": 0, "uuid": "GPU-1", "unavailable": {}}
    if gpu_record is not ...:
        gpu["nvlink_errors"] = gpu_record
    if isinstance(gpu_record, dict) and "kind" in gpu_record:  # a reason: the record is null
        gpu["nvlink_errors"] = None
        gpu["unavailable"]["nvlink_errors"] = gpu_record
    facts = {"source": "nvml", "gpus": [gpu], "gpu_count": 1}
    check: Check = checks()["nvlink_errors"]
    return evaluate(check, view(facts, profile, **overrides), 0)


def test_no_growth_passes_naming_what_was_watched():
    finding = judged(record())
    assert finding.status is Status.PASS, finding.text
    assert finding.result.message == (
        "no NVLink error counter grew on 18 active link(s) over 2 s "
        "(replay, recovery, crc_flit, crc_data, ecc_data)"
    )


@pytest.mark.parametrize("counter", ["replay", "recovery"])
def test_any_replay_or_recovery_during_the_window_fails(counter):
    finding = judged(record(**{f"link11_{counter}": 2}))
    assert (finding.status, finding.action) == (Status.FAIL, "INSPECT")
    assert f"link 11 {counter} errors +2" in finding.text
    assert "during the 2 s window" in finding.text
    assert "nvidia-smi nvlink -e -i 0" in finding.result.advice


def test_crc_growth_warns_below_the_rate_and_fails_above_it():
    slow = judged(record(link7_crc_data=3))
    assert (slow.status, slow.action) == (Status.WARN, "INSPECT")
    assert "link 7 data CRC errors +3" in slow.text
    fast = judged(record(link7_crc_flit=200))  # 100 per second over 2 s
    assert (fast.status, fast.action) == (Status.FAIL, "INSPECT")
    assert "link 7 flow-control CRC errors +200" in fast.text
    lenient = judged(record(link7_crc_flit=200), nvlink_crc_errors_fail_per_s=1000)
    assert lenient.status is Status.WARN


def test_counters_not_supported_skip_with_the_reason():
    why = {"kind": "not_supported", "detail": "nvmlDeviceGetNvLinkErrorCounter: Not Supported"}
    finding = judged(why)
    assert finding.status is Status.SKIP
    assert "Not Supported" in finding.text


def test_counters_that_could_not_be_read_fail_rerun():
    broken = judged({"kind": "timeout", "detail": "nvmlDeviceGetNvLinkErrorCounter: hung"})
    assert (broken.status, broken.action) == (Status.FAIL, "RERUN")
    second = record()
    counter = second["links"][4]["ecc_data"]
    counter["second"] = None
    counter["unavailable"]["second"] = {"kind": "error", "detail": "Unknown Error"}
    finding = judged(second)
    assert (finding.status, finding.action) == (Status.FAIL, "RERUN")
    assert "link 4 ecc_data second read: Unknown Error" in finding.text


def test_a_counter_that_went_down_is_never_a_pass():
    reset = record()
    reset["links"][2]["replay"]["second"] = 0  # someone ran nvidia-smi nvlink -re meanwhile
    finding = judged(reset)
    assert (finding.status, finding.action) == (Status.FAIL, "RERUN")
    assert "link 2 replay went from 7 to 0" in finding.text


def test_some_counters_unsupported_pass_on_the_rest_and_say_so():
    partial = record(links=2)
    for entry in partial["links"]:
        entry["ecc_data"] = None
        entry["unavailable"]["ecc_data"] = {"kind": "not_supported", "detail": "Not Supported"}
    finding = judged(partial)
    assert finding.status is Status.PASS
    assert finding.result.message.endswith(
        "(replay, recovery, crc_flit, crc_data) (ecc_data not supported)"
    )


def test_where_it_does_not_apply_it_skips():
    pcie = judged(record(), "h100-sxm", nvlink_links_expected=0)
    assert pcie.status is Status.SKIP and "nvlink_links_expected: 0" in pcie.text
    old = judged(...)
    assert old.status is Status.SKIP and "predate the NVLink error counters" in old.text
    once = record(window_s=None)
    once["unavailable"]["window_s"] = {"kind": "absent", "detail": "read once"}
    finding = judged(once)
    assert finding.status is Status.SKIP and "read once" in finding.text
    smi = judged({"kind": "absent", "detail": "only NVML reads the NVLink error counters"})
    assert smi.status is Status.SKIP


def test_blackwell_field_values_without_growth_pass_naming_them():
    finding = judged(fields(links=18))
    assert finding.status is Status.PASS, finding.text
    assert finding.result.message == (
        "no NVLink error counter grew on 18 active link(s) over 2 s (NVLink5 field values: "
        + ", ".join(FIELDS)
        + ")"
    )
    old = judged(fields(link3_effective=40, link5_symbol=2))  # old errors that do not grow
    assert old.status is Status.PASS, old.text


@pytest.mark.parametrize(
    ("counter", "words"),
    [
        ("symbol", "symbol errors"),
        ("effective", "effective errors"),
        ("malformed_packet", "malformed packets"),
        ("buffer_overrun", "receive buffer overruns"),
        ("rcv", "receive errors"),
        ("local_link_integrity", "local link integrity errors"),
        ("link_recovery", "link recovery events"),
        ("recovery_successful", "successful link recoveries"),
    ],
)
def test_any_growth_of_a_field_value_counter_fails(counter, words):
    """DCGM's NVLink5 rule: one more error in the window fails, whatever the rate."""
    finding = judged(fields(**{f"link4_{counter}_grow": 1}))
    assert (finding.status, finding.action) == (Status.FAIL, "INSPECT"), finding.text
    assert f"grew during the 2 s window: link 4 {words} +1;" in finding.text
    assert "expected no NVLink5 error counter to grow and no failed link recovery" in finding.text
    lenient = judged(fields(**{f"link4_{counter}_grow": 1}), nvlink_crc_errors_fail_per_s=1e6)
    assert lenient.status is Status.FAIL  # the legacy CRC rate limit does not apply


def test_a_failed_link_recovery_fails_even_before_the_window():
    finding = judged(fields(link2_recovery_failed=1))
    assert (finding.status, finding.action) == (Status.FAIL, "INSPECT")
    assert "since the counters were reset: link 2 failed link recoveries 1;" in finding.text
    both = judged(fields(link2_recovery_failed=1, link9_symbol_grow=4))
    assert "link 9 symbol errors +4; since the counters were reset: link 2" in both.text


def test_an_earlier_successful_link_recovery_warns():
    finding = judged(fields(link6_recovery_successful=3, link6_link_recovery=3))
    assert (finding.status, finding.action) == (Status.WARN, "INSPECT"), finding.text
    assert finding.result.message == (
        "NVLink links recovered before the 2 s window: link 6 successful link recoveries 3; "
        "none during it"
    )


def test_a_field_value_that_could_not_be_read_is_no_zero():
    broken = fields(links=4)
    broken["links"][1]["rcv"] = None
    broken["links"][1]["unavailable"]["rcv"] = {
        "kind": "error",
        "detail": "nvmlDeviceGetFieldValues(gpu=0, link=1, field=208 RCV_ERRORS): "
        "nvmlReturn=999 (NVMLError_Unknown)",
    }
    finding = judged(broken)
    assert (finding.status, finding.action) == (Status.FAIL, "RERUN")
    assert "link 1 rcv: nvmlDeviceGetFieldValues(gpu=0, link=1, field=208" in finding.text
    unknown = judged(dict(fields(links=1), source="nvlink_magic"))
    assert (unknown.status, unknown.action) == (Status.FAIL, "RERUN")
    assert "source 'nvlink_magic'" in unknown.text


# ---------------------------------------------------------------- history, run over run


def test_history_sums_each_counter_over_the_links_and_judges_its_rate():
    gpu = {"nvlink_errors": record(links=4, link1_replay=3, link2_replay=1)}
    values = metrics.gpu_values(gpu)
    assert values["nvlink_replay_errors"] == 4 * 7 + 4
    assert values["nvlink_crc_flit_errors"] == 4 * 7
    assert registry.metric("nvlink_replay_errors").key == "regression_nvlink_errors_per_day"
    day = 86400.0
    out = Judgement("node17 gpu0", 0, "gpu_regression")
    past = [(0.0, {"nvlink_replay_errors": 2.0, "nvlink_crc_flit_errors": 28.0}, True)]
    judge_values(values, past, HistoryLimits(), day, out)
    assert [r["metric"] for r in out.regressions] == ["nvlink_replay_errors"]  # +30 > 10/day
    assert "NVLink replays +30" in out.regressions[0]["message"]


def test_history_sums_the_blackwell_counters_and_leaves_the_legacy_ones_out():
    values = metrics.gpu_values({"nvlink_errors": fields(links=4, link1_symbol=5, link2_symbol=1)})
    assert values["nvlink_symbol_errors"] == 6
    assert values["nvlink_recovery_failed_errors"] == 0
    assert "nvlink_replay_errors" not in values  # not read: unknown, not 0
    assert "nvlink_recovery_successful_errors" not in values  # link_recovery counts it
    assert registry.metric("nvlink_link_recovery_errors").rule == "rate"


def test_history_leaves_a_partly_read_counter_unknown():
    partial = record(links=2)
    partial["links"][1]["recovery"] = None
    partial["links"][1]["unavailable"]["recovery"] = {"kind": "error", "detail": "x"}
    values = metrics.gpu_values({"nvlink_errors": partial})
    assert "nvlink_recovery_errors" not in values
    assert values["nvlink_replay_errors"] == 14
    assert not any(name.startswith("nvlink_") for name in metrics.gpu_values({}))


# ---------------------------------------------------------------- the NVML reader, fake library

# nvidia-ml-py before (field id, scopeId) pairs: nvmlDeviceGetFieldValues takes ids only.
BARE_IDS = """
import ctypes
def bare(handle, ids):
    values = (pynvml.c_nvmlFieldValue_t * len(ids))()
    for i, field in enumerate(ids):
        values[i].fieldId = field
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    pynvml._nvmlCheckReturn(fn(handle, ctypes.c_int32(len(ids)), ctypes.byref(values)))
    return values
pynvml.nvmlDeviceGetFieldValues = bare
"""
NEITHER = {name: "NOT_SUPPORTED" for name in FIELDS}
RUNS: dict[str, Any] = {
    "gb200": "gb200-tray-healthy",
    "gb200-errors": "gb200-nvlink-errors-gpu1",
    "h100-replay": "h100-nvlink-replay-gpu5",
    "unsupported": {"extends": "gb200-tray-healthy", "gpu": {"all": {"nvlink_count": NEITHER}}},
    "entry-error": {
        "extends": "gb200-tray-healthy",
        "gpu": {2: {"nvlink_count": {5: {"rcv": "ERROR:999"}}}},
    },
    "bare-ids": "gb200-tray-healthy",
    "h100-counted": "healthy-h100x8",
    "v1-platform": {"extends": "gb200-tray-healthy", "platform_info_version": 1},
    "mixed": {
        "extends": "healthy-h100x8",
        "gpu": {
            "all": {"module_id": 0},
            0: {"nvlink": {"count": 0}},  # a PCIe board
            1: {"nvlink_errors": {"ecc_data": "NOT_SUPPORTED", "3": {"crc_flit": "ERROR:999"}}},
            2: {"module_id": 6},
        },
    },
}


@pytest.fixture(scope="module")
def nvml(fake_nvml_lib, tmp_path_factory) -> dict[str, dict[str, Any]]:
    """nvml.collect() of every run above with a WINDOW_S window, each in a fresh interpreter,
    side by side."""
    folder = tmp_path_factory.mktemp("nvlink-errors")

    def run(name: str) -> dict[str, Any]:
        calls = {  # each call of these symbols appends the GPU's index to its file
            symbol: str(folder / f"{name}.{symbol}")
            for symbol in ("nvmlDeviceGetFieldValues", "nvmlDeviceGetNvLinkErrorCounter")
        }
        scenario = write_scenario(
            {"extends": RUNS[name], "calls": calls}
            if isinstance(RUNS[name], str)
            else dict(RUNS[name], calls=calls),
            folder / f"{name}.txt",
        )
        prelude = BARE_IDS if name == "bare-ids" else ""
        result = run_probe(fake_nvml_lib, scenario, prelude, WINDOW_S)
        result["facts"] = result.pop("r")
        result["calls"] = {}
        for symbol, path in calls.items():
            lines = Path(path).read_text().split() if Path(path).exists() else []
            result["calls"][symbol] = [lines.count(str(i)) for i in range(8)]
        return result

    with ThreadPoolExecutor(len(RUNS)) as pool:
        return dict(zip(RUNS, pool.map(run, RUNS), strict=True))


def node_findings(facts: dict[str, Any], profile: str) -> dict[int, Any]:
    """nvlink_errors on every GPU of an NVML facts fragment."""
    node = view(dict(facts, source="nvml"), profile)
    check = checks()["nvlink_errors"]
    return {gpu["index"]: evaluate(check, node, gpu["index"]) for gpu in facts["gpus"]}


def test_one_wait_for_all_gpus_and_each_gpu_its_own_window(nvml):
    result = nvml["h100-replay"]
    windows = [gpu["nvlink_errors"]["window_s"] for gpu in result["facts"]["gpus"]]
    assert len(windows) == 8 and all(WINDOW_S <= w < WINDOW_S + 1.5 for w in windows)
    assert result["took_s"] < 2 * WINDOW_S + 1.5  # one wait, not one per GPU
    assert result["errors"] == []


def test_a_replaying_h100_link_fails_its_gpu_only(nvml):
    facts = nvml["h100-replay"]["facts"]
    assert facts["gpus"][5]["nvlink_errors"]["links"][2]["replay"] == {
        "first": 120,
        "second": 121,
        "unavailable": {},
    }
    assert unexplained_nulls(facts["gpus"]) == []
    found = node_findings(facts, "h100-sxm")
    assert {i for i, f in found.items() if f.status is not Status.PASS} == {5}
    assert (found[5].status, found[5].action) == (Status.FAIL, "INSPECT")
    assert "link 2 replay errors +1" in found[5].text


def test_a_gb200_tray_reads_the_nvlink5_field_values_where_the_legacy_call_is_refused(nvml):
    result = nvml["gb200"]
    assert result["errors"] == []
    for gpu in result["facts"]["gpus"]:
        record = gpu["nvlink_errors"]
        assert (record["source"], record["unavailable"]) == ("field_values", {})
        assert [entry["link"] for entry in record["links"]] == list(range(18))
        assert set(record["links"][17]) == {"link", "unavailable", *FIELDS}
        assert record["links"][17]["symbol"] == {"first": 0, "second": 0, "unavailable": {}}
    found = node_findings(result["facts"], "gb200")
    assert {f.status for f in found.values()} == {Status.PASS}
    assert "(NVLink5 field values: malformed_packet," in found[0].result.message


def test_one_field_values_call_per_gpu_per_read(nvml):
    """The legacy call is tried on the first active link only (5 calls, not 5 per link);
    then each read is one nvmlDeviceGetFieldValues call for all links and fields (plus the
    GPU's one for its recovery action)."""
    calls = nvml["gb200"]["calls"]
    assert calls["nvmlDeviceGetNvLinkErrorCounter"][:4] == [5, 5, 5, 5]
    assert calls["nvmlDeviceGetFieldValues"][:4] == [1 + 2] * 4
    h100 = nvml["h100-counted"]["calls"]  # the legacy counters: every link, twice
    assert h100["nvmlDeviceGetNvLinkErrorCounter"] == [5 * 18 * 2] * 8
    assert h100["nvmlDeviceGetFieldValues"] == [1] * 8


def test_a_gb200_link_with_growing_field_value_counters_fails_its_gpu_only(nvml):
    facts = nvml["gb200-errors"]["facts"]
    links = facts["gpus"][1]["nvlink_errors"]["links"]
    assert (links[3]["effective"]["first"], links[3]["effective"]["second"]) == (40, 40)
    assert (links[7]["symbol"]["first"], links[7]["symbol"]["second"]) == (5, 8)
    found = node_findings(facts, "gb200")
    assert {i for i, f in found.items() if f.status is not Status.PASS} == {1}
    assert (found[1].status, found[1].action) == (Status.FAIL, "INSPECT")
    assert (
        "link 7 symbol errors +3; link 11 successful link recoveries +1; "
        "link 11 link recovery events +1"
    ) in found[1].text


def test_a_field_entry_error_is_an_error_reason_not_zero(nvml):
    result = nvml["entry-error"]
    label = "nvmlDeviceGetFieldValues(gpu=2, link=5, field=208 RCV_ERRORS)"
    link5 = result["facts"]["gpus"][2]["nvlink_errors"]["links"][5]
    assert link5["rcv"] is None
    assert link5["unavailable"]["rcv"] == {
        "kind": "error",
        "detail": f"{label}: nvmlReturn=999 (NVMLError_Unknown)",
    }
    assert [e["call"] for e in result["errors"]] == [label]  # the first read; not read again
    found = node_findings(result["facts"], "gb200")
    assert (found[2].status, found[2].action) == (Status.FAIL, "RERUN")
    assert {found[i].status for i in (0, 1, 3)} == {Status.PASS}


def test_bindings_that_cannot_name_a_link_are_not_supported_not_zero(nvml):
    result = nvml["bare-ids"]
    gpu = result["facts"]["gpus"][0]
    assert gpu["nvlink_errors"] is None
    why = gpu["unavailable"]["nvlink_errors"]
    assert why["kind"] == "not_supported"
    assert "the installed nvidia-ml-py cannot name a link (scopeId)" in why["detail"]
    assert gpu["recovery_action"] == 0  # bare field ids still work
    assert {f.status for f in node_findings(result["facts"], "gb200").values()} == {Status.SKIP}


def test_the_gb200_tray_reports_where_each_gpu_sits(nvml):
    gpus = nvml["gb200"]["facts"]["gpus"]
    assert [gpu["platform"]["module_id"] for gpu in gpus] == [2, 1, 4, 3]  # out of PCI order
    assert gpus[0]["platform"] == {
        "module_id": 2,
        "tray_index": 4,
        "slot_number": 14,
        "host_id": 1,
        "peer_type": 0,
        "chassis_serial": "1820000000001",
        "unavailable": {},
    }
    assert set(PLATFORM_KEYS) | {"unavailable"} == set(gpus[0]["platform"])
    assert {f.status for f in node_findings(nvml["gb200"]["facts"], "gb200").values()} == {
        Status.PASS
    }


def test_a_driver_with_only_the_v1_platform_struct_has_no_chassis_serial(nvml):
    platform = nvml["v1-platform"]["facts"]["gpus"][3]["platform"]
    assert (platform["module_id"], platform["tray_index"], platform["slot_number"]) == (3, 4, 14)
    assert platform["chassis_serial"] is None
    assert platform["unavailable"]["chassis_serial"] == {
        "kind": "not_supported",
        "detail": "nvmlDeviceGetPlatformInfo(gpu=3, v1): the v1 struct has no chassis_serial "
        "(the driver refused v2)",
    }


def test_counters_a_driver_does_not_support_are_unknown_not_zero(nvml):
    """Neither the legacy call nor the NVLink5 field values: the check skips, saying both."""
    result = nvml["unsupported"]
    assert result["errors"] == []
    gpu = result["facts"]["gpus"][2]
    assert gpu["nvlink_errors"] is None
    assert gpu["unavailable"]["nvlink_errors"] == {
        "kind": "not_supported",
        "detail": "nvmlDeviceGetNvLinkErrorCounter(gpu=2, link=0, DL_REPLAY): Not Supported "
        "(every counter of link 0); nvmlDeviceGetFieldValues(gpu=2, link=0, field=206 "
        "MALFORMED_PACKET_ERRORS): Not Supported (every NVLink5 field of the 18 active links)",
    }
    assert result["took_s"] < WINDOW_S  # nothing to read again: no wait
    found = node_findings(result["facts"], "gb200")
    assert {f.status for f in found.values()} == {Status.SKIP}
    assert "NVLink error counters not supported here" in found[2].text


def test_a_pcie_board_a_failing_counter_and_a_module_id(nvml):
    result = nvml["mixed"]
    gpus = result["facts"]["gpus"]
    assert gpus[0]["unavailable"]["nvlink_errors"]["kind"] == "not_supported"
    link3 = gpus[1]["nvlink_errors"]["links"][3]
    assert link3["unavailable"]["crc_flit"]["kind"] == "error"
    assert link3["unavailable"]["ecc_data"]["kind"] == "not_supported"
    assert [e["call"] for e in result["errors"]] == [
        "nvmlDeviceGetNvLinkErrorCounter(gpu=1, link=3, DL_CRC_FLIT)"
    ]
    assert gpus[2]["platform"]["module_id"] == 6
    assert gpus[2]["platform"]["unavailable"]["tray_index"]["detail"] == (
        "nvmlDeviceGetPlatformInfo(gpu=2, v2): Not Supported"
    )
    assert gpus[3]["platform"]["module_id"] == 0
    assert unexplained_nulls(gpus) == []
    found = node_findings(result["facts"], "h100-sxm")
    assert found[0].status is Status.SKIP  # no NVLink on a PCIe board
    assert (found[1].status, found[1].action) == (Status.FAIL, "RERUN")
    assert "link 3 crc_flit: nvmlDeviceGetNvLinkErrorCounter(gpu=1, link=3" in found[1].text
    assert found[2].status is Status.PASS


def test_scenario_records_are_not_shared_between_gpus(nvml):
    """The fake counts reads per GPU, link and counter: GPU 1's growth is its own."""
    gpus = nvml["gb200-errors"]["facts"]["gpus"]
    for gpu in (gpus[0], gpus[2], gpus[3]):
        assert gpu["nvlink_errors"]["links"][11]["link_recovery"] == {
            "first": 0,
            "second": 0,
            "unavailable": {},
        }


def test_the_scenarios_exist():
    folder = Path(__file__).parent / "fakenvml" / "scenarios"
    for name in ("gb200-nvlink-errors-gpu1", "h100-nvlink-replay-gpu5"):
        assert (folder / f"{name}.yml").is_file()


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"links": [{"link": 0, "replay": 5}]}, "link 0 replay: 5, no reads"),
        ({"links": ["x"]}, "a link record that is not an object: 'x'"),
        ({"window_s": "2"}, "window is '2', not a time"),
        ({"window_s": 0.0}, "window is 0.0, not a time"),
    ],
    ids=["counter-not-an-object", "link-not-an-object", "window-text", "window-zero"],
)
def test_malformed_counter_records_fail_to_be_read_again_never_pass_or_crash(record, message):
    """Review find: these crashed the check (AttributeError, ValueError) or passed over 0 s."""
    from gpuhealth.checks import NodeView
    from gpuhealth.families.nvfabric.checks import nvlink_errors
    from selftest.facts import limits

    reads = {"first": 0, "second": 0, "unavailable": {}}
    link = {
        "link": 0,
        "unavailable": {},
        **{n: dict(reads) for n in ("replay", "recovery", "crc_flit", "crc_data", "ecc_data")},
    }
    gpu = {
        "index": 0,
        "nvlink_errors": {"window_s": 2.0, "links": [link], "unavailable": {}, **record},
    }
    result = nvlink_errors(
        NodeView("n1", {"source": "nvml", "gpus": [gpu]}, limits("h100-sxm")), gpu
    )
    assert result.status.value == "FAIL" and result.action.value == "RERUN", result
    assert message in result.message


def test_every_counter_the_probe_reads_has_its_words_and_its_history_metric():
    """The counters are named in the schema (what the probe reads), in the check's words and
    in history's metrics: a counter added to one and not the others would go unjudged (or
    raise in the check's message), so the three are held together here."""
    from gpuhealth.families.gpu.schema import NVLINK_COUNTER_SOURCES
    from gpuhealth.families.nvfabric import checks as nvfabric

    read = {name for counters in NVLINK_COUNTER_SOURCES.values() for name, _, _ in counters}
    assert set(nvfabric._COUNTER_WORDS) == read
    # history leaves out successful recoveries only: link_recovery counts every recovery
    assert {name for name, _ in metrics.NVLINK_COUNTERS} == read - {"recovery_successful"}
