"""nvidia-smi output as people paste it (selftest/data/nvidia-smi/SOURCE.md, issue 22): the
default table, sections of `-q` without their GPU header, `nvlink -s`/`-e` with elisions.
What the paste shows is judged; what it lacks is "not evaluated", never healthy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.evidence import recognise
from gpuhealth.families.gpu import parse_nvlink, parse_smi_table, parse_smi_text
from gpuhealth.parsing import ParseError

DATA = Path(__file__).parent / "data" / "nvidia-smi"
HEALTHY_TABLE = DATA / "table_h100x8_550.90.07_gpud.txt"
LOST_GPU_TABLE = DATA / "table_rtx-pro-6000x4_610.57.04_gpu1-lost_dfch-llmops.txt"
ERR_TABLE = DATA / "table_a40x8_525.60.13_gpu4-err_open-gpu-kernel-modules-446.txt"
FAN_ERR_TABLE = DATA / "table_geforce_525.125.06_fan-err_gpud.txt"
THROTTLED = DATA / "q-fragment_v100_throttle-reasons-and-clocks_l4rz.txt"
GREP_A8 = DATA / "q-fragment_throttle-reasons_grep-A8_kubeflow-68.txt"
LINKS_DOWN = DATA / "nvlink-s_v100_links-inactive_azhpc-diagnostics-73.txt"
ALL_INACTIVE = DATA / "nvlink-s_b200_all-links-inactive_gpud-1085.txt"
STATUS_ELIDED = DATA / "nvlink-s_h100_elided_stas00-ml-engineering.txt"
ERRORS_ELIDED = DATA / "nvlink-e_h100_elided_stas00-ml-engineering.txt"

KINDS = {
    HEALTHY_TABLE: "nvidia-smi",
    LOST_GPU_TABLE: "nvidia-smi",
    ERR_TABLE: "nvidia-smi",
    FAN_ERR_TABLE: "nvidia-smi",
    THROTTLED: "nvidia-smi -q sections",
    GREP_A8: "nvidia-smi -q sections",
    LINKS_DOWN: "nvidia-smi nvlink -s / -e",
    ALL_INACTIVE: "nvidia-smi nvlink -s / -e",
    STATUS_ELIDED: "nvidia-smi nvlink -s / -e",
    ERRORS_ELIDED: "nvidia-smi nvlink -s / -e",
    DATA / "gpud_a100_nvlink_status.txt": "nvidia-smi nvlink -s / -e",
}


def triage(path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuhealth.cli", "triage", str(path), "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def statuses(doc: dict[str, Any], check: str) -> dict[Any, str]:
    return {f["gpu"]: f["status"] for f in doc["findings"] if f["check"] == check}


def test_every_pasted_sample_is_recognised_as_its_kind():
    assert {path.name: recognise(path, path.read_text()).name for path in KINDS} == {
        path.name: kind for path, kind in KINDS.items()
    }


def test_every_sample_of_the_directory_is_read():
    """No sample is left without a test: each is one of the kinds above or of the -q tests."""
    known = set(KINDS) | set(DATA.glob("gpud_h100*_query*.txt")) | set(DATA.glob("*.xml"))
    known |= {DATA / "gpud_titanv_560.35.03_query.txt", DATA / "SOURCE.md"}
    assert sorted(p.name for p in DATA.iterdir() if p not in known) == []


# ---------------------------------------------------------------- the default table


def test_the_healthy_table_gives_what_it_shows_and_leaves_the_rest_absent():
    doc = parse_smi_table.parse(HEALTHY_TABLE.read_text())
    assert (
        doc["driver"]["version"] == "550.90.07" and doc["driver"]["cuda_driver_version"] == "12.4"
    )
    assert len(doc["gpus"]) == 8 and doc["gpu_count"] is None and doc["errors"] == []
    gpu = doc["gpus"][2]
    shown = {key: gpu[key] for key in ("name", "pci_bus_id", "persistence_mode", "temperature_c")}
    assert shown == {
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:4C:00.0",
        "persistence_mode": True,
        "temperature_c": 23,
    }
    assert (gpu["power_draw_w"], gpu["power_limit_w"]) == (70.0, 700.0)
    assert (gpu["memory_used_mib"], gpu["memory_total_mib"]) == (1, 81559)
    assert (gpu["utilization_gpu_pct"], gpu["performance_state"], gpu["ecc_mode"]) == (
        0,
        "P0",
        "enabled",
    )
    assert gpu["ecc"]["volatile"]["uncorrected"] == 0 and gpu["processes"] == []
    assert gpu["ecc"]["volatile"]["corrected"] is None
    for key in ("uuid", "retired_pages", "remapped_rows", "clock_event_reasons", "pcie", "fabric"):
        assert gpu[key] is None and gpu["unavailable"][key]["kind"] == "absent", key


def test_triage_of_the_healthy_table_passes_what_it_shows_and_evaluates_nothing_else():
    _, doc = triage(HEALTHY_TABLE, "--profile", "h100-sxm")
    assert set(statuses(doc, "idle_processes").values()) == {"PASS"}
    assert set(statuses(doc, "power").values()) == {"PASS"}
    assert set(statuses(doc, "persistence_mode").values()) == {"PASS"}
    # The temperature too: the table does not show the GPU's own slowdown point.
    for check in ("throttle", "row_remapping", "pcie_link", "ecc_errors", "nvlink", "temperature"):
        found = [f for f in doc["findings"] if f["check"] == check]
        assert {f["status"] for f in found} == {"SKIP"}, check
        assert all("not evaluated" in f["message"] for f in found), check
    failed = {f["check"] for f in doc["findings"] if f["status"] == "FAIL"}
    assert failed == {"driver_version", "recovery_action"}  # r550 predates r570's recovery action


def test_a_gpu_the_driver_cannot_open_is_a_failing_record_never_a_shorter_list():
    doc = parse_smi_table.parse(LOST_GPU_TABLE.read_text())
    assert (doc["driver"]["version"], doc["driver"]["cuda_driver_version"]) == ("610.57.04", "13.3")
    assert [g["index"] for g in doc["gpus"]] == [0, 1, 2, 3]
    lost = doc["gpus"][1]
    assert lost["pci_bus_id"] == "00000000:34:00.0"
    assert lost["temperature_c"] is None and lost["unavailable"]["temperature_c"] == {
        "kind": "error",
        "detail": "nvidia-smi: Unable to determine the device handle for GPU1: 0000:34:00.0: "
        "Unknown Error",
    }
    assert doc["gpus"][0]["name"] is None  # "NVIDIA RTX PRO 6000 Blac...": cut short
    assert "cuts the name short" in doc["gpus"][0]["unavailable"]["name"]["detail"]
    assert doc["gpus"][0]["ecc_mode"] == "disabled"
    rc, found = triage(LOST_GPU_TABLE)
    assert rc == 1
    assert {statuses(found, c).get(1) for c in ("ecc_errors", "row_remapping", "power")} == {"FAIL"}
    assert statuses(found, "temperature")[0] == "FAIL"  # 87 C


def test_a_lost_gpu_printed_without_its_index_takes_the_index_the_table_skips():
    text = LOST_GPU_TABLE.read_text().replace("for GPU1: 0000:34:00.0", "for GPU 0000:34:00.0")
    doc = parse_smi_table.parse(text)
    assert [g["index"] for g in doc["gpus"]] == [0, 1, 2, 3]
    assert doc["gpus"][1]["pci_bus_id"] == "00000000:34:00.0"
    assert "taken for GPU 1" in doc["errors"][0]["error"]


def test_only_the_lost_gpu_line_is_evidence_too():
    text = "Unable to determine the device handle for GPU 0000:0B:00.0: Unknown Error\n"
    (gpu,) = parse_smi_table.parse(text)["gpus"]
    assert gpu["index"] == 0 and gpu["unavailable"]["ecc"]["kind"] == "error"


def test_err_in_the_table_is_an_unreadable_value_not_zero():
    doc = parse_smi_table.parse(ERR_TABLE.read_text())
    gpu = doc["gpus"][4]
    for key in ("temperature_c", "power_draw_w", "utilization_gpu_pct", "ecc", "name"):
        assert gpu[key] is None and gpu["unavailable"][key]["kind"] == "error", key
    assert doc["gpus"][2]["processes"][0]["pid"] == 2111354
    assert doc["errors"] == [
        {"probe": "nvidia-smi-text", "error": "GPU 4: nvidia-smi printed ERR! for the fan speed"}
    ]
    _, found = triage(ERR_TABLE, "--profile", "default")
    assert statuses(found, "ecc_errors")[4] == "FAIL" and statuses(found, "ecc_errors")[0] == "SKIP"
    fan = parse_smi_table.parse(FAN_ERR_TABLE.read_text())
    assert fan["gpus"][0]["temperature_c"] == 38 and "fan speed" in fan["errors"][0]["error"]
    assert fan["gpus"][0]["unavailable"]["processes"]["kind"] == "absent"  # no process table


def test_uncorrected_ecc_in_the_table_fails(tmp_path):
    text = HEALTHY_TABLE.read_text()
    row = "|   2  NVIDIA H100 80GB HBM3          On  |   00000000:4C:00.0 Off |"
    row += "                    0 |"
    assert row in text
    path = tmp_path / "table.txt"
    path.write_text(text.replace(row, row[:-3] + "2 |"))
    rc, found = triage(path, "--profile", "h100-sxm")
    assert rc == 1 and statuses(found, "ecc_errors")[2] == "FAIL"


def test_a_table_cut_in_a_gpus_rows_leaves_that_gpu_unread_not_healthy():
    lines = HEALTHY_TABLE.read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if "00000000:DB:00.0" in line) + 1
    doc = parse_smi_table.parse("\n".join(lines[:cut]) + "\n")
    last = doc["gpus"][-1]
    assert last["unavailable"]["temperature_c"]["kind"] == "error"
    assert "cut off" in doc["errors"][0]["error"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("hello\n", "no '| NVIDIA-SMI ...' banner"),
        (
            "| NVIDIA-SMI 550.90.07   Driver Version: 550.90.07   CUDA Version: 12.4 |\n| GPU |\n",
            "ends in its column titles",
        ),
    ],
)
def test_text_that_is_no_table_is_refused(text, message):
    with pytest.raises(ParseError, match=message):
        parse_smi_table.parse(text)


def test_a_gpu_row_of_the_wrong_shape_is_refused():
    text = HEALTHY_TABLE.read_text().replace(
        "| N/A   23C    P0             70W /  700W |", "| N/A   23C |", 1
    )
    with pytest.raises(ParseError, match="is not fan, temp, perf, power"):
        parse_smi_table.parse(text)


# ---------------------------------------------------------------- -q sections, no header


def test_throttle_reasons_pasted_without_a_header_fail_on_hw_slowdown():
    (gpu,) = parse_smi_text.parse_fragment(THROTTLED.read_text())["gpus"]
    assert gpu["index"] == 0 and gpu["pci_bus_id"] is None
    assert gpu["clock_event_reasons"]["active"] == ["hw_slowdown", "hw_power_brake_slowdown"]
    rc, found = triage(THROTTLED)
    assert rc == 1 and statuses(found, "throttle") == {0: "FAIL"}
    assert statuses(found, "ecc_errors") == {0: "SKIP"}


def test_grep_output_with_its_command_line_passes_throttle_and_evaluates_nothing_else():
    rc, found = triage(GREP_A8)
    assert rc == 0 and statuses(found, "throttle") == {0: "PASS"}
    assert {f["status"] for f in found["findings"] if f["check"] != "throttle"} <= {"SKIP"}


def test_grep_output_of_several_gpus_gives_one_gpu_per_block():
    block = GREP_A8.read_text().split("\n", 1)[1]
    text = (
        block
        + "--\n"
        + block.replace(
            "HW Slowdown                 : Not Active", "HW Slowdown                 : Active"
        )
    )
    doc = parse_smi_text.parse_fragment(text)
    assert [g["clock_event_reasons"]["active"] for g in doc["gpus"]] == [
        ["gpu_idle"],
        ["gpu_idle", "hw_slowdown"],
    ]


def test_a_fragment_that_keeps_its_gpu_header_is_read_as_nvidia_smi_q():
    text = "GPU 00000000:19:00.0\n" + "".join(
        "    " + line + "\n" for line in THROTTLED.read_text().splitlines()
    )
    assert recognise(Path("x.txt"), text).name == "nvidia-smi -q sections"
    (gpu,) = parse_smi_text.parse_fragment(text)["gpus"]
    assert (
        gpu["pci_bus_id"] == "00000000:19:00.0"
        and "hw_slowdown" in gpu["clock_event_reasons"]["active"]
    )


def test_a_line_that_is_no_section_of_a_gpu_is_refused():
    with pytest.raises(ParseError, match="is not a section of a GPU"):
        parse_smi_text.parse_fragment(THROTTLED.read_text() + "Driver Model\n    Current : N/A\n")


# ---------------------------------------------------------------- nvlink -s / -e


def test_inactive_links_fail_the_gpu_shown_and_the_gpus_elided_are_not_evaluated():
    doc = parse_nvlink.parse_pasted(LINKS_DOWN.read_text())
    (gpu,) = doc["gpus"]
    assert (gpu["index"], gpu["name"], gpu["uuid"]) == (3, "Tesla V100-SXM2-32GB", None)
    assert [link["link"] for link in gpu["nvlink"] if not link["up"]] == [3, 5]
    assert doc["gpu_count"] == 4  # GPUs 0-2 elided: counted, unknown
    rc, found = triage(LINKS_DOWN, "--profile", "default")
    assert rc == 1 and statuses(found, "nvlink") == {0: "SKIP", 1: "SKIP", 2: "SKIP", 3: "FAIL"}


def test_all_links_inactive_fails_where_the_profile_expects_nvlink():
    (gpu,) = parse_nvlink.parse_pasted(ALL_INACTIVE.read_text())["gpus"]
    assert gpu["unavailable"]["nvlink"]["kind"] == "not_supported"
    _, found = triage(ALL_INACTIVE, "--profile", "b200")
    assert statuses(found, "nvlink")[2] == "FAIL"


def test_links_left_out_of_the_paste_are_not_evaluated_unless_one_shown_is_down():
    (gpu,) = parse_nvlink.parse_pasted(STATUS_ELIDED.read_text())["gpus"]
    assert gpu["nvlink"] is None and gpu["unavailable"]["nvlink"]["kind"] == "absent"
    down = STATUS_ELIDED.read_text().replace("Link 17: 26.562 GB/s", "Link 17: <inactive>")
    (gpu,) = parse_nvlink.parse_pasted(down)["gpus"]
    assert [link["up"] for link in gpu["nvlink"]] == [True, False]


def test_nvlink_e_is_one_reading_of_the_counters():
    (gpu,) = parse_nvlink.parse_pasted(ERRORS_ELIDED.read_text())["gpus"]
    record = gpu["nvlink_errors"]
    assert [link["link"] for link in record["links"]] == [0, 1, 17]
    assert record["links"][0]["replay"]["first"] == 0
    assert record["unavailable"]["window_s"]["kind"] == "absent"
    assert "CRC Errors: 0" in record["links"][0]["unavailable"]["crc_flit"]["detail"]
    _, found = triage(ERRORS_ELIDED, "--profile", "default")
    (finding,) = [f for f in found["findings"] if f["check"] == "nvlink_errors"]
    assert finding["status"] == "SKIP" and "read once" in finding["message"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("GPU 0: X\n\t Link 0: 25 GB/s\n\t Link 1: Replay Errors: 0\n", "mixed"),
        ("GPU 0: X\n\t Link 0: fast\n", "neither a speed nor <inactive>"),
        ("GPU 0: X\n\t Link 0: Replay Errors: -1\n", "not a counter value"),
        ("\t Link 0: 25 GB/s\n", "before any 'GPU N: ...' line"),
        ("GPU 0: X\nGPU 0: X\n", "GPU 0 again"),
    ],
)
def test_garbled_nvlink_pastes_are_refused(text, message):
    with pytest.raises(ParseError, match=message):
        parse_nvlink.parse_pasted(text)
