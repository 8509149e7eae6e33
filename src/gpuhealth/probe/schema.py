"""Shared vocabulary of the facts document (see docs/facts-schema.md).

Lives in the probe package because the probe, the parsers and the checks all need it and the
probe may only import what is shipped with it.
"""

from __future__ import annotations

from typing import Any

# 1: GPUs only; 2: + system, storage, fabric, kernel_log, fabric_manager, memory_reclaim,
# dcgm_health, gpud, gpud_events sections (and nccl, dcgm from load tests).
SCHEMA_VERSION = 2
PROBE_VERSION = "0.1.0"

UNAVAILABLE_KINDS = ("not_supported", "error", "timeout", "absent")

# NVML clocks event reason bits -> facts names (nvmlClocksEventReason*).
CLOCK_REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

# NVML_GPU_RECOVERY_ACTION_* values; compare integers, the names of 5+ changed between releases.
RECOVERY_ACTIONS: dict[int, str] = {
    0: "NONE",
    1: "GPU_RESET",
    2: "NODE_REBOOT",
    3: "DRAIN_P2P",
    4: "DRAIN_AND_RESET",
}

GPU_KEYS = (
    "index",
    "name",
    "uuid",
    "serial",
    "pci_bus_id",
    "pci_device_id",
    "architecture",
    "vbios_version",
    "persistence_mode",
    "memory_total_mib",
    "memory_used_mib",
    "temperature_c",
    "temp_tlimit_margin_c",
    "temp_slowdown_c",
    "temp_shutdown_c",
    "temp_max_operating_c",
    "ecc_mode",
    "ecc",
    "retired_pages",
    "remapped_rows",
    "clock_event_reasons",
    "power_draw_w",
    "power_limit_w",
    "pcie",
    "nvlink",
    "recovery_action",
    "processes",
)


def new_gpu(index: int) -> dict[str, Any]:
    """A GPU record with every key present and null, so a forgotten field is visible."""
    gpu: dict[str, Any] = dict.fromkeys(GPU_KEYS)
    gpu["index"] = index
    gpu["unavailable"] = {}
    return gpu


def mark_unavailable(record: dict[str, Any], key: str, kind: str, detail: str) -> None:
    """Set record[key] to null and say why, so checks can tell unsupported from broken."""
    if kind not in UNAVAILABLE_KINDS:
        raise ValueError(f"unknown unavailable kind {kind!r}")
    record[key] = None
    record.setdefault("unavailable", {})[key] = {"kind": kind, "detail": detail}


def recovery_action_name(value: int) -> str:
    """Name a recovery action integer, including ones newer than this table."""
    return RECOVERY_ACTIONS.get(value, f"UNKNOWN({value})")
