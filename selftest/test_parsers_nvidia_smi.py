"""nvidia-smi parsers against real saved output (see selftest/data/nvidia-smi/SOURCE.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import defusedxml.ElementTree
import pytest

from gpuhealth.facts import UNAVAILABLE_KINDS
from gpuhealth.families.gpu import parse_nvlink as nvidia_smi_nvlink
from gpuhealth.families.gpu import parse_smi_text as nvidia_smi_text
from gpuhealth.families.gpu import parse_smi_xml as nvidia_smi_xml
from gpuhealth.families.gpu.parse_smi import (
    convert,
    recovery_action_value,
    tlimit_offset_to_absolute,
    to_celsius,
    to_link_width,
    to_mib,
    to_watts,
)
from gpuhealth.families.gpu.schema import GPU_KEYS
from gpuhealth.parsing import ParseError
from selftest.facts import judge

DATA = Path(__file__).parent / "data" / "nvidia-smi"

H100X8 = "gpud_h100x8_535.161.08_query.txt"
TITANV = "gpud_titanv_560.35.03_query.txt"
TRUNCATED = "gpud_h100_535.183.01_query_truncated.txt"
A100_MIG = "telegraf_a100-sxm4-80gb_535.54.03_mig_v12.xml"
T4 = "telegraf_tesla-t4_515.105.01_v11.xml"
RTX3060 = "telegraf_rtx3060_570.124.04_v12.xml"
ADA = "telegraf_rtx4000-sff-ada_595.84_v13.xml"

TEXT_SAMPLES = (H100X8, TITANV, TRUNCATED)
XML_SAMPLES = (A100_MIG, T4, RTX3060, ADA)

ZERO_ECC = {
    "corrected": 0,
    "uncorrected": 0,
    "sram_corrected": 0,
    "sram_uncorrected": 0,
    "dram_corrected": 0,
    "dram_uncorrected": 0,
    "unavailable": {},
}


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def parse(name: str) -> dict:
    text = read(name)
    return nvidia_smi_xml.parse(text) if name.endswith(".xml") else nvidia_smi_text.parse(text)


def kind(gpu: dict, key: str) -> str:
    assert gpu[key] is None, f"{key} = {gpu[key]!r}"
    return gpu["unavailable"][key]["kind"]


# --------------------------------------------------------------------------- text samples


def test_h100x8_text_535():
    doc = parse(H100X8)
    assert doc["driver"]["loaded"] is True
    assert doc["driver"]["version"] == "535.161.08"
    assert doc["driver"]["cuda_driver_version"] == "12.2"
    assert doc["driver"]["nvml_version"] is None
    assert doc["driver"]["unavailable"]["nvml_version"]["kind"] == "absent"
    assert doc["gpu_count"] == 8
    assert doc["errors"] == []
    gpus = doc["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert [g["pci_bus_id"] for g in gpus] == [
        "00000000:19:00.0",
        "00000000:3B:00.0",
        "00000000:4C:00.0",
        "00000000:5D:00.0",
        "00000000:9B:00.0",
        "00000000:BB:00.0",
        "00000000:CB:00.0",
        "00000000:DB:00.0",
    ]
    assert [g["pcie"]["replay_count"] for g in gpus] == [67, 63, 52, 43, 49, 53, 82, 67]
    for gpu in gpus:
        # the throttling fault this sample was kept for
        assert gpu["clock_event_reasons"] == {
            "active": ["hw_slowdown", "hw_power_brake_slowdown"],
            "mask": None,
            "unavailable": {},
        }
        assert gpu["remapped_rows"] == {
            "correctable": 0,
            "uncorrectable": 0,
            "pending": False,
            "failure": False,
        }
        assert kind(gpu, "retired_pages") == "not_supported"
        assert gpu["ecc_mode"] == "enabled"
        assert gpu["ecc"] == {"volatile": ZERO_ECC, "aggregate": ZERO_ECC}
        assert kind(gpu, "recovery_action") == "not_supported"
        assert "535.161.08 predates" in gpu["unavailable"]["recovery_action"]["detail"]
        assert gpu["pcie"]["gen_current"] == 5 and gpu["pcie"]["gen_max"] == 5
        assert gpu["pcie"]["width_current"] == 16 and gpu["pcie"]["width_max"] == 16
        assert kind(gpu, "nvlink") == "absent"
        assert gpu["processes"] == []
        assert gpu["name"] == "NVIDIA H100 80GB HBM3"
        assert gpu["power_limit_w"] == 700.0

    gpu0 = gpus[0]
    assert gpu0["serial"] == "1650124031592"
    assert gpu0["uuid"] == "GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa"
    assert gpu0["pci_device_id"] == "0x233010DE"
    assert gpu0["architecture"] == "Hopper"
    assert gpu0["vbios_version"] == "96.00.74.00.0D"
    assert gpu0["persistence_mode"] is True
    assert gpu0["memory_total_mib"] == 81559
    assert gpu0["memory_used_mib"] == 0
    assert gpu0["power_draw_w"] == 67.74
    # 29 C now, T.Limit margin 56 C; offsets slowdown -2, shutdown -8, max operating 0
    assert gpu0["temperature_c"] == 29
    assert gpu0["temp_tlimit_margin_c"] == 56
    assert gpu0["temp_slowdown_c"] == 87
    assert gpu0["temp_shutdown_c"] == 93
    assert gpu0["temp_max_operating_c"] == 85
    # GPU 1: 29 C, margin 57 C
    assert (gpus[1]["temp_slowdown_c"], gpus[1]["temp_shutdown_c"]) == (88, 94)


def test_titanv_text_560():
    doc = parse(TITANV)
    assert doc["driver"]["version"] == "560.35.03"
    assert doc["driver"]["cuda_driver_version"] == "12.6"
    assert doc["gpu_count"] == 1 and len(doc["gpus"]) == 1
    gpu = doc["gpus"][0]
    assert gpu["name"] == "NVIDIA TITAN V"
    assert gpu["serial"] == "0334517001520"
    assert gpu["pci_bus_id"] == "00000000:01:00.0"
    # absolute thresholds, no T.Limit on Volta
    assert gpu["temperature_c"] == 44
    assert kind(gpu, "temp_tlimit_margin_c") == "not_supported"
    assert gpu["temp_shutdown_c"] == 100
    assert gpu["temp_slowdown_c"] == 97
    assert gpu["temp_max_operating_c"] == 91
    assert kind(gpu, "remapped_rows") == "not_supported"
    assert kind(gpu, "retired_pages") == "not_supported"
    assert kind(gpu, "ecc_mode") == "not_supported"
    assert kind(gpu, "ecc") == "not_supported"
    assert kind(gpu, "recovery_action") == "not_supported"
    assert gpu["persistence_mode"] is False
    assert gpu["clock_event_reasons"] == {"active": ["gpu_idle"], "mask": None, "unavailable": {}}
    assert gpu["power_draw_w"] == 29.02 and gpu["power_limit_w"] == 250.0
    assert gpu["pcie"] == {
        "gen_current": 1,
        "gen_max": 3,
        "width_current": 16,
        "width_max": 16,
        "replay_count": 0,
    }
    # Xorg, gnome-shell and /opt/test are all type G: not compute processes
    assert gpu["processes"] == []


def test_truncated_h100_text():
    doc = parse(TRUNCATED)
    assert doc["driver"]["version"] == "535.183.01"
    assert doc["gpu_count"] == 8
    assert len(doc["gpus"]) == 1
    assert doc["errors"], "truncation must be reported"
    assert doc["errors"][0]["probe"] == "nvidia-smi-text"
    assert "truncated" in doc["errors"][0]["error"]
    assert "attached 8, parsed 1" in doc["errors"][0]["error"]
    gpu = doc["gpus"][0]
    # what was printed before the cut is read
    assert gpu["uuid"] == "GPU-566e6f65-c38e-b12f-4824-6944218668b9"
    assert gpu["serial"] == "1655022005478"
    assert gpu["pci_bus_id"] == "00000000:53:00.0"
    assert gpu["pcie"]["replay_count"] == 120
    # the garbled "Invalid HW Slowdown" lines must not read as "no HW slowdown"
    assert kind(gpu, "clock_event_reasons") == "error"
    # what was cut off is an error (data expected but missing), not "absent"
    assert kind(gpu, "temperature_c") == "error"
    assert kind(gpu, "ecc") == "error"
    assert kind(gpu, "remapped_rows") == "error"
    assert kind(gpu, "processes") == "error"
    assert kind(gpu, "fabric") == "error"  # parse_fabric.attach: the same cut as assemble's
    assert kind(gpu, "recovery_action") == "not_supported"


# --------------------------------------------------------------------------- XML samples


def test_t4_xml_v11_515():
    doc = parse(T4)
    assert doc["driver"]["version"] == "515.105.01"
    assert doc["driver"]["cuda_driver_version"] == "11.7"
    assert doc["gpu_count"] == 1 and doc["errors"] == []
    gpu = doc["gpus"][0]
    assert gpu["name"] == "Tesla T4"
    assert gpu["pci_bus_id"] == "00000000:00:1E.0"
    assert gpu["pci_device_id"] == "0x1EB810DE"
    assert gpu["ecc_mode"] == "enabled"
    assert gpu["ecc"] == {"volatile": ZERO_ECC, "aggregate": ZERO_ECC}
    assert gpu["retired_pages"] == {"single_bit": 0, "double_bit": 0, "pending": False}
    assert kind(gpu, "remapped_rows") == "not_supported"
    assert gpu["pcie"] == {
        "gen_current": 3,
        "gen_max": 3,
        "width_current": 8,
        "width_max": 16,
        "replay_count": 0,
    }
    # v11 `clocks_throttle_reasons`, all Not Active, read rather than missing
    assert gpu["clock_event_reasons"] == {"active": [], "mask": None, "unavailable": {}}
    assert gpu["temperature_c"] == 40
    assert (gpu["temp_shutdown_c"], gpu["temp_slowdown_c"], gpu["temp_max_operating_c"]) == (
        96,
        93,
        85,
    )
    assert kind(gpu, "temp_tlimit_margin_c") == "absent"
    assert gpu["power_draw_w"] == 26.78
    assert gpu["power_limit_w"] == 70.0
    assert gpu["memory_total_mib"] == 15360 and gpu["memory_used_mib"] == 1032
    assert kind(gpu, "recovery_action") == "not_supported"
    # Xorg (G) is dropped, python (C) kept
    assert gpu["processes"] == [{"pid": 5762, "name": "python", "used_memory_mib": 1005}]


def test_t4_throttle_reason_names_are_read():
    text = (
        read(T4)
        .replace(
            "<clocks_throttle_reason_hw_slowdown>Not Active",
            "<clocks_throttle_reason_hw_slowdown>Active",
        )
        .replace(
            "<clocks_throttle_reason_sw_power_cap>Not Active",
            "<clocks_throttle_reason_sw_power_cap>Active",
        )
    )
    gpu = nvidia_smi_xml.parse(text)["gpus"][0]
    assert gpu["clock_event_reasons"] == {
        "active": ["sw_power_cap", "hw_slowdown"],
        "mask": None,
        "unavailable": {},
    }


def test_rtx3060_xml_v12_570():
    text = read(RTX3060)
    assert "Requested functionality has been deprecated" in text
    doc = nvidia_smi_xml.parse(text)
    assert doc["driver"]["version"] == "570.124.04"
    gpu = doc["gpus"][0]
    assert gpu["recovery_action"] == 0
    assert "recovery_action" not in gpu["unavailable"]
    assert kind(gpu, "ecc_mode") == "not_supported"
    assert kind(gpu, "ecc") == "not_supported"
    assert kind(gpu, "serial") == "not_supported"
    assert kind(gpu, "remapped_rows") == "not_supported"
    assert gpu["pcie"]["gen_current"] == 1 and gpu["pcie"]["gen_max"] == 4
    assert gpu["power_draw_w"] == 11.60  # average_power_draw
    assert gpu["temp_slowdown_c"] == 95 and gpu["temp_shutdown_c"] == 98
    assert gpu["processes"] == []
    # reset_required / drain_and_reset_recommended are deprecated: they must leak nowhere
    assert "deprecated" not in json.dumps(doc).lower()


def test_rtx4000_ada_xml_v13_595():
    doc = parse(ADA)
    assert doc["driver"]["version"] == "595.84"
    assert doc["driver"]["cuda_driver_version"] == "13.2"
    gpu = doc["gpus"][0]
    # 38 C now, T.Limit margin 49 C; offsets max -7, slow -2, max_gpu 0
    assert gpu["temperature_c"] == 38
    assert gpu["temp_tlimit_margin_c"] == 49
    assert gpu["temp_shutdown_c"] == 38 + 49 + 7
    assert gpu["temp_slowdown_c"] == 38 + 49 + 2
    assert gpu["temp_max_operating_c"] == 38 + 49
    assert gpu["recovery_action"] == 0
    assert gpu["power_draw_w"] == 8.81  # average_power_draw (instant is 8.44)
    assert gpu["power_limit_w"] == 70.0
    assert gpu["ecc_mode"] == "disabled"
    assert gpu["unavailable"]["ecc"] == {"kind": "not_supported", "detail": "ECC mode is disabled"}
    assert gpu["remapped_rows"] == {
        "correctable": 0,
        "uncorrectable": 0,
        "pending": False,
        "failure": False,
    }
    assert kind(gpu, "retired_pages") == "not_supported"
    assert gpu["serial"] == "REDACTED"
    assert gpu["architecture"] == "Ada Lovelace"
    assert gpu["clock_event_reasons"] == {"active": ["gpu_idle"], "mask": None, "unavailable": {}}
    assert [p["pid"] for p in gpu["processes"]] == [4937, 34626]  # C and C+G


def test_a100_mig_xml_v12_535():
    doc = parse(A100_MIG)
    assert doc["driver"]["version"] == "535.54.03"
    # the sample says 4 attached but holds one <gpu> (trimmed upstream): reported
    assert doc["gpu_count"] == 4
    assert len(doc["gpus"]) == 1
    assert "attached 4, parsed 1" in doc["errors"][0]["error"]
    gpu = doc["gpus"][0]
    assert gpu["index"] == 0  # position in the document, not minor_number 1
    assert gpu["pci_bus_id"] == "00000000:01:00.0"
    assert kind(gpu, "remapped_rows") == "not_supported"
    assert kind(gpu, "retired_pages") == "not_supported"
    # gpu_temp_max_threshold 92 = shutdown, gpu_temp_slow_threshold 89 = slowdown,
    # gpu_temp_max_gpu_threshold 85 = max operating
    assert gpu["temp_shutdown_c"] == 92
    assert gpu["temp_slowdown_c"] == 89
    assert gpu["temp_max_operating_c"] == 85
    assert gpu["ecc"] == {"volatile": ZERO_ECC, "aggregate": ZERO_ECC}
    assert gpu["memory_total_mib"] == 81920
    assert gpu["power_draw_w"] == 67.03 and gpu["power_limit_w"] == 500.0
    assert kind(gpu, "recovery_action") == "not_supported"
    assert gpu["processes"] == []


def test_xml_accepts_defusedxml_fromstring():
    doc = nvidia_smi_xml.parse(read(ADA), fromstring=defusedxml.ElementTree.fromstring)
    assert doc["gpus"][0]["uuid"] == "GPU-37037c3f-65c8-ec4d-24a9-420204ad8026"


def test_xml_defusedxml_refusal_is_parse_error():
    bomb = (
        '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><nvidia_smi_log>&a;</nvidia_smi_log>'
    )
    with pytest.raises(ParseError):
        nvidia_smi_xml.parse(bomb, fromstring=defusedxml.ElementTree.fromstring)


# --------------------------------------------------------------------------- derived cases


@pytest.mark.parametrize(
    ("printed", "value"),
    [
        ("None", 0),
        ("Reset", 1),
        ("Reboot", 2),
        ("Drain P2P", 3),
        ("Drain and Reset", 4),
        ("GPU_RESET", 1),
        ("NODE_REBOOT", 2),
    ],
)
def test_recovery_action_strings_xml_and_text(printed, value):
    xml = read(RTX3060).replace("<gpu_recovery_action>None<", f"<gpu_recovery_action>{printed}<")
    assert nvidia_smi_xml.parse(xml)["gpus"][0]["recovery_action"] == value
    text = read(H100X8).replace(
        "    GSP Firmware Version                  : 535.161.08\n",
        f"    GPU Recovery Action                   : {printed}\n"
        "    GSP Firmware Version                  : 535.161.08\n",
        1,
    )
    assert nvidia_smi_text.parse(text)["gpus"][0]["recovery_action"] == value


def test_unknown_recovery_action_is_error():
    xml = read(ADA).replace(
        "<gpu_recovery_action>None<", "<gpu_recovery_action>Recalibrate Flux Capacitor<"
    )
    gpu = nvidia_smi_xml.parse(xml)["gpus"][0]
    assert gpu["unavailable"]["recovery_action"]["kind"] == "error"
    assert "Recalibrate Flux Capacitor" in gpu["unavailable"]["recovery_action"]["detail"]
    with pytest.raises(ValueError):
        recovery_action_value("Recalibrate Flux Capacitor")
    # the newer values nvidia-ml-py names are read by their names
    assert recovery_action_value("Recover IMEX Domain") == 5
    assert recovery_action_value("Bus Reset") == 6


def test_ecc_parity_and_secded_are_summed():
    text = read(H100X8)
    volatile = (
        "        Volatile\n"
        "            SRAM Correctable              : 0\n"
        "            SRAM Uncorrectable Parity     : 0\n"
        "            SRAM Uncorrectable SEC-DED    : 0\n"
        "            DRAM Correctable              : 0\n"
        "            DRAM Uncorrectable            : 0\n"
    )
    assert volatile in text
    text = text.replace(
        volatile,
        volatile.replace("Correctable              : 0", "Correctable              : 7")
        .replace("Parity     : 0", "Parity     : 2")
        .replace("SEC-DED    : 0", "SEC-DED    : 3")
        .replace("DRAM Uncorrectable            : 0", "DRAM Uncorrectable            : 1"),
        1,
    )
    ecc = nvidia_smi_text.parse(text)["gpus"][0]["ecc"]
    assert ecc["volatile"] == {
        "corrected": 14,
        "uncorrected": 6,
        "sram_corrected": 7,
        "sram_uncorrected": 5,
        "dram_corrected": 7,
        "dram_uncorrected": 1,
        "unavailable": {},
    }
    assert ecc["aggregate"] == ZERO_ECC


def test_unreadable_value_is_error_with_raw_text():
    text = read(T4).replace("<gpu_temp>40 C</gpu_temp>", "<gpu_temp>forty</gpu_temp>")
    gpu = nvidia_smi_xml.parse(text)["gpus"][0]
    assert gpu["unavailable"]["temperature_c"]["kind"] == "error"
    assert "forty" in gpu["unavailable"]["temperature_c"]["detail"]


def test_value_conversions():
    assert convert("81559 MiB", to_mib) == (81559, None)
    assert convert("67.74 W", to_watts) == (67.74, None)
    assert convert("29 C", to_celsius) == (29, None)
    assert convert("-2 C", to_celsius) == (-2, None)
    assert convert("16x", to_link_width) == (16, None)
    value, reason = convert("N/A", to_mib)
    assert value is None and reason.kind == "not_supported"
    value, reason = convert("Requested functionality has been deprecated", to_mib)
    assert value is None and reason.kind == "not_supported"
    assert reason.detail.endswith("Requested functionality has been deprecated")
    value, reason = convert("[Unknown Error]", to_mib)
    assert value is None and reason.kind == "error"
    value, reason = convert("12 KiB", to_mib)
    assert value is None and reason.kind == "error" and "12 KiB" in reason.detail
    assert tlimit_offset_to_absolute(29, 56, -2) == 87
    assert tlimit_offset_to_absolute(29, 56, -8) == 93
    assert tlimit_offset_to_absolute(29, 56, 0) == 85


# --------------------------------------------------------------------------- garbage


@pytest.mark.parametrize("text", ["hello", "<html>", "", "   \n\n"])
def test_garbage_raises_parse_error(text):
    with pytest.raises(ParseError, match="line 1"):
        nvidia_smi_text.parse(text)
    with pytest.raises(ParseError, match="line 1"):
        nvidia_smi_xml.parse(text)


def test_xml_parse_error_names_position():
    with pytest.raises(ParseError, match=r"line 3, column \d+"):
        nvidia_smi_xml.parse("<nvidia_smi_log>\n<gpu>\n</nvidia_smi_log>")
    with pytest.raises(ParseError, match="line 2.*<html>"):
        nvidia_smi_xml.parse("\n<html><body/></html>")


def test_text_parser_rejects_xml_and_xml_parser_rejects_text():
    with pytest.raises(ParseError):
        nvidia_smi_text.parse(read(T4))
    with pytest.raises(ParseError):
        nvidia_smi_xml.parse(read(TITANV))


# --------------------------------------------------------------------------- properties


def _strings(value, path=""):
    """Every string in the document except the explanations in `unavailable` maps."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key != "unavailable":
                yield from _strings(item, f"{path}/{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}/{i}")


@pytest.mark.parametrize("name", TEXT_SAMPLES + XML_SAMPLES)
def test_every_sample_is_complete_and_clean(name):
    doc = parse(name)
    assert set(doc) == {"driver", "gpu_count", "gpus", "errors"}
    assert doc["gpus"], name
    probe = "nvidia-smi-xml" if name.endswith(".xml") else "nvidia-smi-text"
    assert all(e["probe"] == probe and e["error"] for e in doc["errors"])
    for key, value in doc["driver"].items():
        if value is None:
            assert doc["driver"]["unavailable"][key]["kind"] in UNAVAILABLE_KINDS
    for position, gpu in enumerate(doc["gpus"]):
        assert gpu["index"] == position
        assert set(GPU_KEYS) <= set(gpu)
        assert set(gpu) - set(GPU_KEYS) == {"unavailable"}
        for key in GPU_KEYS:
            if gpu[key] is None:
                entry = gpu["unavailable"].get(key)
                assert entry is not None, f"{name} GPU {position}: {key} null without reason"
                assert entry["kind"] in UNAVAILABLE_KINDS
                assert entry["detail"]
        for key in gpu["unavailable"]:
            assert gpu[key] is None, f"{name}: {key} has a value and an unavailable entry"
        if gpu["clock_event_reasons"] is not None:
            assert gpu["clock_event_reasons"]["mask"] is None
    for path, text in _strings(doc):
        assert text != "N/A", f"{name}{path}"
        assert "deprecated" not in text.lower(), f"{name}{path}"
    json.dumps(doc)  # the fragment must be JSON as-is


def test_nvlink_status_of_8x_a100():
    links = nvidia_smi_nvlink.parse_status((DATA / "gpud_a100_nvlink_status.txt").read_text())
    assert sorted(links) == list(range(8))
    assert all(len(gpu) == 12 and all(link["up"] for link in gpu) for gpu in links.values())
    assert links[0][11] == {"link": 11, "up": True, "speed_gbps": 25.0}
    down = nvidia_smi_nvlink.parse_status(
        "GPU 0: NVIDIA H100 (UUID: GPU-x)\n\t Link 0: <inactive>\n"
    )
    assert down == {0: [{"link": 0, "up": False, "speed_gbps": None}]}
    with pytest.raises(ParseError, match="line 1"):
        nvidia_smi_nvlink.parse_status("Link 0: 25 GB/s\n")


# ---------------------------------------------------------------- never a false pass


def healthy_text() -> str:
    """The 8x H100 sample with its real HW slowdown cleared: every GPU passes `throttle`."""
    return (
        read(H100X8)
        .replace(
            "HW Slowdown                       : Active",
            "HW Slowdown                       : Not Active",
        )
        .replace(
            "HW Power Brake Slowdown       : Active", "HW Power Brake Slowdown       : Not Active"
        )
    )


def judged_gpu0(text: str, check: str) -> Any:
    doc = nvidia_smi_text.parse(text)
    doc["source"] = "evidence-file"
    return judge(check, doc, 0)


def test_cleared_sample_passes_throttle_and_ecc():
    assert judged_gpu0(healthy_text(), "throttle").status.value == "PASS"
    assert judged_gpu0(healthy_text(), "ecc_errors").status.value == "PASS"


@pytest.mark.parametrize(
    ("line", "replacement", "status", "message"),
    [
        # A missing reason line is not "Not Active".
        (
            "        HW Slowdown                       : Not Active\n",
            "",
            "FAIL",
            "could not read clock event reason hw_slowdown: nvidia-smi: no line for hw_slowdown",
        ),
        # Every GPU has HW Slowdown: N/A for it among readings is garbled, not unsupported.
        (
            "        HW Slowdown                       : Not Active\n",
            "        HW Slowdown                       : N/A\n",
            "FAIL",
            "could not read clock event reason hw_slowdown: nvidia-smi: N/A for hw_slowdown",
        ),
        # Boards without the power brake signal print N/A for it.
        (
            "            HW Power Brake Slowdown       : Not Active\n",
            "            HW Power Brake Slowdown       : N/A\n",
            "SKIP",
            "clock event reason hw_power_brake_slowdown not supported here (nvidia-smi: N/A for "
            "hw_power_brake_slowdown)",
        ),
    ],
    ids=["line-missing", "n/a-hw-slowdown", "n/a-power-brake"],
)
def test_unknown_clock_reason_is_never_not_active(line, replacement, status, message):
    text = healthy_text()
    assert line in text
    result = judged_gpu0(text.replace(line, replacement, 1), "throttle")
    assert (result.status.value, result.result.message) == (status, message)


@pytest.mark.parametrize(
    ("replacement", "require_ecc", "status", "message"),
    [
        ("", False, "FAIL", "volatile uncorrected count unknown (nvidia-smi printed no dram_"),
        (
            "            DRAM Uncorrectable            : N/A\n",
            True,
            "FAIL",
            "volatile uncorrected count unknown (Volatile/DRAM Uncorrectable: nvidia-smi: N/A)",
        ),
        (
            "            DRAM Uncorrectable            : N/A\n",
            False,
            "SKIP",
            "not evaluated: volatile uncorrected count unknown (Volatile/DRAM Uncorrectable: ",
        ),
    ],
    ids=["line-missing", "n/a-required", "n/a"],
)
def test_ecc_total_of_a_missing_part_is_unknown_not_zero(replacement, require_ecc, status, message):
    line = "            DRAM Uncorrectable            : 0\n"
    text = healthy_text()
    assert line in text
    doc = nvidia_smi_text.parse(text.replace(line, replacement, 1))
    gpu = doc["gpus"][0]
    assert gpu["ecc"]["volatile"]["uncorrected"] is None
    assert gpu["ecc"]["volatile"]["sram_uncorrected"] == 0  # the part that is there stays
    result = judge("ecc_errors", doc, 0, require_ecc=require_ecc)
    assert result.status.value == status and result.result.message.startswith(message)


def test_a_negative_count_is_an_error_not_a_count():
    line = "            DRAM Uncorrectable            : 0\n"
    text = healthy_text().replace(line, line.replace(": 0", ": -2"), 1)
    gpu = nvidia_smi_text.parse(text)["gpus"][0]
    assert gpu["ecc"] is None and gpu["unavailable"]["ecc"]["kind"] == "error"
    assert "-2" in gpu["unavailable"]["ecc"]["detail"]
