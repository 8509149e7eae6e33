"""The GPU part of the facts document: the GPU and driver records every source fills.

NVML, `nvidia-smi -q -x`, `nvidia-smi -q` and /proc all start from these records, so a field a
source forgot is visibly null rather than missing. Node side: Python 3.6, standard library.
"""

from typing import Any, Dict

from gpuhealth import schema as s
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


# The families this one builds on, and the profile keys its node side reads.
NEEDS = ()
# Sections of later families its checks consult when present, without building on them: the
# idle-processes check takes the processes still there after memory_reclaim's wait.
READS = ("memory_reclaim",)
PROFILE_KEYS = ("nvml_call_timeout_s", "nvlink_error_window_s", "nvidia_smi_timeout_s")

ECC_GROUP = s.Record(
    "EccGroup",
    "volatile (since the driver loaded) or aggregate (lifetime) ECC error counts",
    (
        s.Field("corrected", s.COUNT, "corrected errors in all memories"),
        s.Field("uncorrected", s.COUNT, "uncorrected errors: null unless every part is known"),
        s.Field("sram_corrected", s.COUNT, "corrected SRAM errors"),
        s.Field("sram_uncorrected", s.COUNT, "uncorrected SRAM errors (parity + SEC-DED)"),
        s.Field("dram_corrected", s.COUNT, "corrected DRAM errors"),
        s.Field("dram_uncorrected", s.COUNT, "uncorrected DRAM errors"),
        s.unavailable(),
    ),
)
LOST_CALL = s.Record(
    "LostCall",
    "the call NVML answered NVML_ERROR_GPU_IS_LOST",
    (
        s.Field("call", s.TEXT, "the NVML call, with its GPU", required=True, nullable=False),
        s.Field("error", s.TEXT, "NVML's error text", required=True, nullable=False),
    ),
)
COUNTER_READS = s.Record(
    "CounterReads",
    "one NVLink error counter read twice, `window_s` apart",
    (
        s.Field("first", s.COUNT, "the first read"),
        s.Field("second", s.COUNT, "the second read (null + absent with a window of 0)"),
        s.unavailable(),
    ),
)
LINK_COUNTERS = s.Record(
    "LinkCounters",
    "one active link's error counters: every other key is a counter (NVLINK_COUNTER_SOURCES)",
    (
        s.Field("link", s.INT, "the link's number", required=True, nullable=False),
        s.unavailable(),
    ),
    extra=s.one_of(COUNTER_READS, s.NULL),
)
GPU_FIELDS = (
    s.Field("index", s.scalar("integer", ge=0), "NVML's index", required=True, nullable=False),
    s.Field("name", s.scalar("text", max_length=128), "the product name"),
    s.Field("uuid", s.ID64, "GPU-<uuid>"),
    s.Field("serial", s.ID64, "the board serial number"),
    s.Field("pci_bus_id", s.TEXT, "NVML's bus id, `00000000:19:00.0`"),
    s.Field("pci_device_id", s.ANY, "device and vendor id, `0x233010DE`"),
    s.Field("architecture", s.TEXT, "Hopper, Blackwell, ..."),
    s.Field("vbios_version", s.ID64, "the VBIOS version"),
    s.Field("persistence_mode", s.FLAG, "persistence mode on"),
    s.Field("memory_total_mib", s.NUMBER, "framebuffer memory"),
    s.Field("memory_used_mib", s.NUMBER, "framebuffer memory in use"),
    s.Field("temperature_c", s.NUMBER, "GPU core temperature"),
    s.Field("temp_tlimit_margin_c", s.ANY, "degrees left before T.Limit", unit="°C"),
    s.Field("temp_slowdown_c", s.NUMBER, "slowdown threshold (absolute)"),
    s.Field("temp_shutdown_c", s.ANY, "shutdown threshold (absolute)", unit="°C"),
    s.Field("temp_max_operating_c", s.ANY, "maximum operating temperature", unit="°C"),
    s.Field("ecc_mode", s.ANY, "`enabled` or `disabled`"),
    s.Field("ecc", s.map_of(s.one_of(ECC_GROUP, s.NULL)), "`volatile` and `aggregate` groups"),
    s.Field(
        "retired_pages",
        s.map_of(s.one_of(s.COUNT, s.FLAG, s.NULL)),
        "page retirement (Kepler..Turing): `single_bit`, `double_bit` counts, `pending`",
    ),
    s.Field(
        "remapped_rows",
        s.map_of(s.one_of(s.COUNT, s.FLAG, s.NULL)),
        "row remapping (Ampere+): `correctable`, `uncorrectable` counts, `pending`, `failure`",
    ),
    s.Field(
        "clock_event_reasons",
        s.Record(
            "ClockReasons",
            "the clock event (throttle) reasons active on the GPU",
            (
                s.Field("active", s.list_of(s.TEXT), "names of the active reasons"),
                s.Field("mask", s.INT, "NVML's bit mask (null from nvidia-smi)"),
                s.unavailable(),
            ),
        ),
        "clock event (throttle) reasons",
    ),
    s.Field("power_draw_w", s.NUMBER, "power draw"),
    s.Field("power_limit_w", s.NUMBER, "enforced power limit"),
    s.Field(
        "performance_state",
        s.scalar("text", pattern=r"^P([0-9]|1[0-5])$"),
        "P-state, P0 (full performance) .. P15",
    ),
    s.Field("utilization_gpu_pct", s.scalar("integer", ge=0, le=100), "GPU utilisation"),
    s.Field(
        "pcie",
        s.map_of(s.one_of(s.COUNT, s.NULL)),
        "`gen_current`, `gen_max`, `width_current`, `width_max`, `replay_count`",
    ),
    s.Field("nvlink", s.list_of(s.map_of(s.ANY)), "one `{link, up}` per link the GPU has"),
    s.Field(
        "nvlink_errors",
        s.Record(
            "NvlinkErrors",
            "NVLink error counters of every active link, read twice (NVML only)",
            (
                s.Field("source", s.ANY, "`error_counter` or `field_values`: which counters"),
                s.Field("window_s", s.NUMBER, "time between the two reads"),
                s.Field("links", s.list_of(LINK_COUNTERS), "one record per active link"),
                s.unavailable(),
            ),
        ),
        "NVLink error counters (NVML only)",
    ),
    s.Field(
        "fabric",
        s.Record(
            "GpuFabric",
            "the GPU's NVLink fabric: clique, cluster and health",
            (
                s.Field("state", s.TEXT, "`Completed`, `In Progress`, `Not Started`"),
                s.Field("status", s.TEXT, "`Success` or NVML's error in words"),
                s.Field("clique_id", s.INT, "the clique the GPU belongs to"),
                s.Field("cluster_uuid", s.TEXT, "the NVLink domain (zeros outside one)"),
                s.Field(
                    "health",
                    s.map_of(s.one_of(s.TEXT, s.FLAG, s.REASONS, s.NULL)),
                    "`summary`, `bandwidth`, `route_recovery_in_progress`, `route_unhealthy`, "
                    "`access_timeout_recovery`, `incorrect_configuration`",
                ),
                s.unavailable(),
            ),
        ),
        "the GPU's NVLink fabric (judged by the nvfabric family)",
    ),
    s.Field("platform", s.ANY, "rack position: " + ", ".join(f"`{k}`" for k in PLATFORM_KEYS)),
    s.Field("recovery_action", s.INT, "NVML's recovery action: 0 NONE .. 7 SYSTEM_REBOOT"),
    s.Field("processes", s.list_of(s.map_of(s.ANY)), "compute processes: `[]` is none"),
    s.Field(
        "lost",
        s.one_of(s.literal(False), LOST_CALL),
        "false, or the first call NVML answered NVML_ERROR_GPU_IS_LOST",
    ),
    s.unavailable(),
)
if tuple(f.name for f in GPU_FIELDS[:-1]) != GPU_KEYS:
    raise RuntimeError("GPU_FIELDS and GPU_KEYS name different keys")
GPU = s.Record("GPU", "one GPU the driver lists", GPU_FIELDS)

SECTIONS = (
    s.Section(
        s.Field(
            "source",
            s.TEXT,
            "where the GPU data came from: nvml, nvidia-smi, none, evidence-file",
            required=True,
            nullable=False,
        )
    ),
    s.Section(
        s.Field(
            "driver",
            s.Record(
                "Driver",
                "whether the driver is loaded, and its versions",
                (
                    s.Field("loaded", s.FLAG, "NVML, nvidia-smi or /proc saw the driver"),
                    s.Field("version", s.ID64, "the driver version, `570.86.15`"),
                    s.Field("cuda_driver_version", s.TEXT, "the CUDA version it supports"),
                    s.Field("nvml_version", s.TEXT, "the NVML library version"),
                    s.unavailable(),
                ),
            ),
            "the NVIDIA driver",
        )
    ),
    s.Section(s.Field("gpu_count", s.COUNT, "GPUs the driver reports")),
    s.Section(s.Field("gpus", s.list_of(GPU), "one record per GPU the driver lists, by index")),
)
