"""The GPU part of the facts document: the GPU and driver records every source fills.

NVML, `nvidia-smi -q -x`, `nvidia-smi -q` and /proc all start from these records, so a field a
source forgot is visibly null rather than missing. Node side: Python 3.6, standard library.
"""

from typing import Any, Dict

from gpuhealth.facts import mark_unavailable

# NVML clocks event reason bits -> facts names (nvmlClocksEventReason*).
CLOCK_REASON_BITS = {
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
RECOVERY_ACTIONS = {
    0: "NONE",
    1: "GPU_RESET",
    2: "NODE_REBOOT",
    3: "DRAIN_P2P",
    4: "DRAIN_AND_RESET",
    5: "RECOVER_IMEX_DOMAIN",
    6: "BUS_RESET",
    7: "SYSTEM_REBOOT",
}

# nvmlNvLinkErrorCounter_t (pynvml's NVML_NVLINK_ERROR_DL_*) -> facts name, NVML's name.
NVLINK_ERROR_COUNTERS = (
    ("replay", 0, "DL_REPLAY"),
    ("recovery", 1, "DL_RECOVERY"),
    ("crc_flit", 2, "DL_CRC_FLIT"),
    ("crc_data", 3, "DL_CRC_DATA"),
    ("ecc_data", 4, "DL_ECC_DATA"),
)

# NVLink5 (Blackwell and later) per-link error counters, read with nvmlDeviceGetFieldValues
# (scopeId = link) where the driver does not support nvmlDeviceGetNvLinkErrorCounter: facts
# name, NVML field id (NVML_FI_DEV_NVLINK_COUNT_*), NVML's name. Exactly the counters DCGM's
# NVLink health watch judges on Blackwell (NVIDIA/DCGM@72fa3fea,
# modules/health/DcgmHealthWatch.cpp: MonitorNVLink5Fields, MonitorNVLinkErrorFields), which
# reads them per link the same way (dcgmlib/src/DcgmCacheManager.cpp, scopeId = linkIndex).
NVLINK_FIELD_COUNTERS = (
    ("malformed_packet", 206, "MALFORMED_PACKET_ERRORS"),
    ("buffer_overrun", 207, "BUFFER_OVERRUN_ERRORS"),
    ("rcv", 208, "RCV_ERRORS"),
    ("rcv_remote", 209, "RCV_REMOTE_ERRORS"),
    ("rcv_general", 210, "RCV_GENERAL_ERRORS"),
    ("local_link_integrity", 211, "LOCAL_LINK_INTEGRITY_ERRORS"),
    ("recovery_successful", 213, "LINK_RECOVERY_SUCCESSFUL_EVENTS"),
    ("recovery_failed", 214, "LINK_RECOVERY_FAILED_EVENTS"),
    ("link_recovery", 215, "LINK_RECOVERY_EVENTS"),
    ("effective", 219, "EFFECTIVE_ERRORS"),
    ("symbol", 221, "SYMBOL_ERRORS"),
)

# A GPU's nvlink_errors `source` -> the counters its links carry.
NVLINK_COUNTER_SOURCES = {
    "error_counter": NVLINK_ERROR_COUNTERS,
    "field_values": NVLINK_FIELD_COUNTERS,
}

# Where a GPU sits in its rack (nvmlDeviceGetPlatformInfo, GB200/GB300 trays; module id also
# from nvmlDeviceGetModuleId): the keys of a GPU record's `platform`.
PLATFORM_KEYS = ("module_id", "tray_index", "slot_number", "host_id", "peer_type", "chassis_serial")

# Keys only NVML reads: every other source (nvidia-smi -q/-q -x, /proc) leaves them null for
# this reason, which the NVML reader replaces with a value or its own reason.
NVML_ONLY = {
    "nvlink_errors": "only NVML reads the NVLink error counters (nvidia-smi -q has none)",
    "platform": "only NVML reads the platform info and module id here",
    "lost": "only NVML tells a lost GPU (NVML_ERROR_GPU_IS_LOST) here",
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
    "performance_state",
    "utilization_gpu_pct",
    "pcie",
    "nvlink",
    "nvlink_errors",
    "fabric",
    "platform",
    "recovery_action",
    "processes",
    # false, or the first call NVML answered NVML_ERROR_GPU_IS_LOST: {"call", "error"}
    "lost",
)


def new_gpu(index: int) -> Dict[str, Any]:
    """A GPU record with every key present and null, so a forgotten field is visible; the
    keys only NVML reads already say so (NVML_ONLY)."""
    gpu: Dict[str, Any] = dict.fromkeys(GPU_KEYS)
    gpu["index"] = index
    gpu["unavailable"] = {}
    for key, detail in NVML_ONLY.items():
        mark_unavailable(gpu, key, "absent", detail)
    return gpu


def new_driver(loaded: Any) -> Dict[str, Any]:
    """The driver record (`loaded`: True, False, or None when a saved log does not say)."""
    return {
        "loaded": loaded,
        "version": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "unavailable": {},
    }


def recovery_action_name(value: int) -> str:
    """Name a recovery action integer, including ones newer than this table."""
    return RECOVERY_ACTIONS.get(value, f"UNKNOWN({value})")
