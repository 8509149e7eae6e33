#!/usr/bin/python3
"""Stand-in `nvidia-smi` for the test bed: `-q -x`, `-L` and `nvlink --status` from the installed
libnvidia-ml.so.1.

The real nvidia-smi is a client of NVML; so is this one (through ctypes), so on a test bed node
it prints whatever the fake NVML serves and the scenario stays the single source of truth. The
XML follows the DTD v12 layout of the real samples in selftest/data/nvidia-smi (the 535.54.03
A100 file for the element names, the 570.124.04 file for `gpu_recovery_action`, which only r570
and later print) and holds the elements whose values come from an NVML call; anything the real
tool prints from calls the fake does not serve is left out rather than made up.

Stdlib only: it is installed as /usr/bin/nvidia-smi on the nodes and runs on their python3.
"""

from __future__ import annotations

import ctypes
import sys
import time
from xml.sax.saxutils import escape

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_INSUFFICIENT_SIZE = 7
RECOVERY_ACTION_FIELD = 230
RECOVERY_ACTION_MIN_BRANCH = 570
# Exit codes documented in nvidia-smi(1).
EXIT_INVALID_ARGUMENT, EXIT_DRIVER_NOT_LOADED, EXIT_NO_LIBRARY = 2, 9, 12

ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
}
# Bits of nvmlDeviceGetCurrentClocksEventReasons, in the order nvidia-smi prints them.
CLOCK_EVENT_REASONS = (
    ("gpu_idle", 0x1),
    ("applications_clocks_setting", 0x2),
    ("sw_power_cap", 0x4),
    ("hw_slowdown", 0x8),
    ("hw_thermal_slowdown", 0x40),
    ("hw_power_brake_slowdown", 0x80),
    ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20),
    ("display_clocks_setting", 0x100),
)
RECOVERY_ACTIONS = {0: "None", 1: "Reset", 2: "Reboot", 3: "Drain P2P", 4: "Drain and Reset"}
# NVML's GPU fabric info in nvidia-smi's words (nvmlGpuFabricState_t, the health summary, the
# health mask's 2-bit conditions at their shifts and its 4-bit incorrect configuration at 8).
FABRIC_STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}
FABRIC_STATUSES = {0: "Success", 23: "Insufficient Resources"}
FABRIC_SUMMARIES = {1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}
FABRIC_CONDITIONS = (
    ("bandwidth", 0, "Degraded", "Full"),
    ("route_recovery_in_progress", 2, "True", "False"),
    ("route_unhealthy", 4, "True", "False"),
    ("access_timeout_recovery", 6, "True", "False"),
)
FABRIC_CONFIGURATIONS = {
    1: "None",
    2: "Incorrect SysGUID",
    3: "Incorrect Chassis SN",
    4: "No Partition",
    5: "Insufficient NVLinks",
    6: "Incompatible GPU Firmware",
    7: "Invalid Location",
    8: "GPU State Invalid",
}
SRAM, DRAM = 7, 2  # nvmlMemoryLocation_t
CORRECTED, UNCORRECTED = 0, 1  # nvmlMemoryErrorType_t
COUNTERS = (("volatile", 0), ("aggregate", 1))  # nvmlEccCounterType_t


class PciInfo(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * 16),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * 32),
    ]


class Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class MarginTemperature(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("marginTemperature", ctypes.c_int)]


class ProcessInfo(ctypes.Structure):
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class FieldValue(ctypes.Structure):
    _fields_ = [
        ("fieldId", ctypes.c_uint),
        ("scopeId", ctypes.c_uint),
        ("timestamp", ctypes.c_longlong),
        ("latencyUsec", ctypes.c_longlong),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_int),
        ("value", ctypes.c_ulonglong),
    ]


class FabricInfo(ctypes.Structure):  # nvmlGpuFabricInfo_v3_t
    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_ubyte * 16),
        ("status", ctypes.c_uint),
        ("cliqueId", ctypes.c_uint),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint),
        ("healthSummary", ctypes.c_ubyte),
    ]


class NvmlError(Exception):
    """An NVML call failed; `text` is what nvidia-smi prints in place of the value."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code
        self.text = "N/A" if code == NVML_ERROR_NOT_SUPPORTED else f"[{text}]"


class Nvml:
    """The few NVML calls nvidia-smi -q -x needs, each raising NvmlError on failure."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        lib.nvmlErrorString.restype = ctypes.c_char_p

    def call(self, name: str, *args: object) -> None:
        code = getattr(self.lib, name)(*args)
        if code != NVML_SUCCESS:
            raise NvmlError(code, self.lib.nvmlErrorString(code).decode())

    def text(self, name: str, *args: object, size: int = 96) -> str:
        buf = ctypes.create_string_buffer(size)
        self.call(name, *args, buf, ctypes.c_uint(size))
        return buf.value.decode()

    def uint(self, name: str, *args: object) -> int:
        value = ctypes.c_uint()
        self.call(name, *args, ctypes.byref(value))
        return value.value


def value(fn, fmt: str = "{}") -> str:
    """fn() formatted as nvidia-smi prints it, or what it prints in its place."""
    try:
        return fmt.format(fn())
    except NvmlError as exc:
        return exc.text


def element(tag: str, content: str | list[str], depth: int) -> list[str]:
    pad = "\t" * depth
    if isinstance(content, str):
        return [f"{pad}<{tag}>{escape(content)}</{tag}>"]
    return [f"{pad}<{tag}>", *content, f"{pad}</{tag}>"]


def gpu_lines(nv: Nvml, dev: ctypes.c_void_p, driver_major: int) -> list[str]:
    """The <gpu> element of one device, as nvidia-smi -q -x (DTD v12) prints it."""
    out: list[str] = []

    def leaf(tag: str, text: str, depth: int = 2) -> None:
        out.extend(element(tag, text, depth))

    def uint(name: str, fmt: str = "{}") -> str:
        return value(lambda: nv.uint(name, dev), fmt)

    pci = PciInfo()
    try:
        nv.call("nvmlDeviceGetPciInfo_v3", dev, ctypes.byref(pci))
        bus_id = pci.busId.decode()
    except NvmlError as exc:
        bus_id = exc.text
    leaf("product_name", value(lambda: nv.text("nvmlDeviceGetName", dev)))
    leaf(
        "product_architecture",
        value(lambda: ARCHITECTURES.get(nv.uint("nvmlDeviceGetArchitecture", dev), "Unknown")),
    )
    mode = uint("nvmlDeviceGetPersistenceMode")
    leaf("persistence_mode", {"1": "Enabled", "0": "Disabled"}.get(mode, mode))
    leaf("serial", value(lambda: nv.text("nvmlDeviceGetSerial", dev)))
    leaf("uuid", value(lambda: nv.text("nvmlDeviceGetUUID", dev)))
    leaf("vbios_version", value(lambda: nv.text("nvmlDeviceGetVbiosVersion", dev, size=32)))
    if driver_major >= RECOVERY_ACTION_MIN_BRANCH:
        leaf("gpu_recovery_action", value(lambda: recovery_action(nv, dev)))

    gens = [
        *element("max_link_gen", uint("nvmlDeviceGetMaxPcieLinkGeneration"), 5),
        *element("current_link_gen", uint("nvmlDeviceGetCurrPcieLinkGeneration"), 5),
    ]
    widths = [
        *element("max_link_width", uint("nvmlDeviceGetMaxPcieLinkWidth", "{}x"), 5),
        *element("current_link_width", uint("nvmlDeviceGetCurrPcieLinkWidth", "{}x"), 5),
    ]
    link = [*element("pcie_gen", gens, 4), *element("link_widths", widths, 4)]
    out.extend(
        element(
            "pci",
            [
                *element("pci_bus", f"{pci.bus:02X}", 3),
                *element("pci_device", f"{pci.device:02X}", 3),
                *element("pci_domain", f"{pci.domain:04X}", 3),
                *element("pci_device_id", f"{pci.pciDeviceId:08X}", 3),
                *element("pci_bus_id", bus_id, 3),
                *element("pci_sub_system_id", f"{pci.pciSubSystemId:08X}", 3),
                *element("pci_gpu_link_info", link, 3),
                *element("replay_counter", uint("nvmlDeviceGetPcieReplayCounter"), 3),
            ],
            2,
        )
    )

    pstate = uint("nvmlDeviceGetPerformanceState")
    if pstate.isdigit():  # else what nvidia-smi prints for an error (N/A, ...)
        pstate = f"P{pstate}" if int(pstate) <= 15 else "Unknown"
    leaf("performance_state", pstate)

    try:
        reasons = ctypes.c_ulonglong()
        nv.call("nvmlDeviceGetCurrentClocksEventReasons", dev, ctypes.byref(reasons))
        states = {
            name: "Active" if reasons.value & bit else "Not Active"
            for name, bit in CLOCK_EVENT_REASONS
        }
    except NvmlError as exc:
        states = {name: exc.text for name, _ in CLOCK_EVENT_REASONS}
    reason_lines = [
        line
        for name, state in states.items()
        for line in element(f"clocks_event_reason_{name}", state, 3)
    ]
    out.extend(element("clocks_event_reasons", reason_lines, 2))

    try:
        memory = Memory()
        nv.call("nvmlDeviceGetMemoryInfo", dev, ctypes.byref(memory))
        usage = {"total": memory.total, "used": memory.used, "free": memory.free}
        mib = {key: f"{amount >> 20} MiB" for key, amount in usage.items()}
    except NvmlError as exc:
        mib = dict.fromkeys(("total", "used", "free"), exc.text)
    out.extend(
        element("fb_memory_usage", [line for k, v in mib.items() for line in element(k, v, 3)], 2)
    )

    try:
        rates = Utilization()
        nv.call("nvmlDeviceGetUtilizationRates", dev, ctypes.byref(rates))
        utilization = {"gpu_util": f"{rates.gpu} %", "memory_util": f"{rates.memory} %"}
    except NvmlError as exc:
        utilization = dict.fromkeys(("gpu_util", "memory_util"), exc.text)
    out.extend(
        element(
            "utilization",
            [line for k, v in utilization.items() for line in element(k, v, 3)],
            2,
        )
    )

    try:
        current, pending = ctypes.c_uint(), ctypes.c_uint()
        nv.call("nvmlDeviceGetEccMode", dev, ctypes.byref(current), ctypes.byref(pending))
        ecc_on = bool(current.value)
        modes = ["Enabled" if m.value else "Disabled" for m in (current, pending)]
    except NvmlError as exc:
        ecc_on, modes = False, [exc.text, exc.text]
    out.extend(
        element(
            "ecc_mode",
            [*element("current_ecc", modes[0], 3), *element("pending_ecc", modes[1], 3)],
            2,
        )
    )
    out.extend(element("ecc_errors", ecc_lines(nv, dev, ecc_on), 2))
    out.extend(element("retired_pages", retired_lines(nv, dev), 2))
    out.extend(remapped_lines(nv, dev))
    out.extend(element("temperature", temperature_lines(nv, dev), 2))

    draw = value(lambda: nv.uint("nvmlDeviceGetPowerUsage", dev) / 1000, "{:.2f} W")
    limit = value(lambda: nv.uint("nvmlDeviceGetEnforcedPowerLimit", dev) / 1000, "{:.2f} W")
    power = [*element("power_draw", draw, 3), *element("current_power_limit", limit, 3)]
    out.extend(element("gpu_power_readings", power, 2))
    out.extend(element("fabric", fabric_lines(nv, dev), 2))
    out.extend(process_lines(nv, dev))
    return [f'\t<gpu id="{escape(bus_id)}">', *out, "\t</gpu>"]


def recovery_action(nv: Nvml, dev: ctypes.c_void_p) -> str:
    field = FieldValue(fieldId=RECOVERY_ACTION_FIELD)
    nv.call("nvmlDeviceGetFieldValues", dev, ctypes.c_int(1), ctypes.byref(field))
    if field.nvmlReturn != NVML_SUCCESS:
        raise NvmlError(field.nvmlReturn, nv.lib.nvmlErrorString(field.nvmlReturn).decode())
    action = field.value & 0xFFFFFFFF  # an unsigned int field
    return RECOVERY_ACTIONS.get(action, str(action))


def fabric_lines(nv: Nvml, dev: ctypes.c_void_p) -> list[str]:
    """The <fabric> block from nvmlDeviceGetGpuFabricInfoV (v3), N/A where NVML has no value."""
    info = FabricInfo(version=0x3000028)
    try:
        nv.call("nvmlDeviceGetGpuFabricInfoV", dev, ctypes.byref(info))
        failed = None if info.state else "N/A"  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    except NvmlError as exc:
        failed = exc.text
    uuid = bytes(info.clusterUuid).hex()
    fields = {
        "state": FABRIC_STATES.get(info.state, str(info.state)),
        "status": FABRIC_STATUSES.get(info.status) or nv.lib.nvmlErrorString(info.status).decode(),
        "cliqueId": str(info.cliqueId),
        "clusterUuid": f"{uuid[:8]}-{uuid[8:12]}-{uuid[12:16]}-{uuid[16:20]}-{uuid[20:]}",
    }
    mask = info.healthMask
    health = {"summary": FABRIC_SUMMARIES.get(info.healthSummary, "N/A")}
    for tag, shift, true, false in FABRIC_CONDITIONS:
        health[tag] = {1: true, 2: false}.get(mask >> shift & 0x3, "N/A")
    health["incorrect_configuration"] = FABRIC_CONFIGURATIONS.get(mask >> 8 & 0xF, "N/A")
    if failed is not None:
        fields, health = dict.fromkeys(fields, failed), dict.fromkeys(health, failed)
    return [
        *(line for tag, text in fields.items() for line in element(tag, text, 3)),
        *element("health", [line for t, v in health.items() for line in element(t, v, 4)], 3),
    ]


def ecc_lines(nv: Nvml, dev: ctypes.c_void_p, ecc_on: bool) -> list[str]:
    lines = []
    for counter_name, counter in COUNTERS:
        parts = []
        for tag, error_type, location in (
            ("sram_correctable", CORRECTED, SRAM),
            ("sram_uncorrectable", UNCORRECTED, SRAM),
            ("dram_correctable", CORRECTED, DRAM),
            ("dram_uncorrectable", UNCORRECTED, DRAM),
        ):

            def count(e: int = error_type, c: int = counter, loc: int = location) -> int:
                number = ctypes.c_ulonglong()
                nv.call("nvmlDeviceGetMemoryErrorCounter", dev, e, c, loc, ctypes.byref(number))
                return number.value

            parts += element(tag, value(count) if ecc_on else "N/A", 4)
        lines += element(counter_name, parts, 3)
    return lines


def retired_lines(nv: Nvml, dev: ctypes.c_void_p) -> list[str]:
    def pages(cause: int) -> int:
        count = ctypes.c_uint(0)
        try:
            nv.call("nvmlDeviceGetRetiredPages", dev, cause, ctypes.byref(count), None)
        except NvmlError as exc:
            if exc.code != NVML_ERROR_INSUFFICIENT_SIZE:
                raise
        return count.value

    pending = value(
        lambda: "Yes" if nv.uint("nvmlDeviceGetRetiredPagesPendingStatus", dev) else "No"
    )
    single = element("retired_count", value(lambda: pages(0)), 4)
    double = element("retired_count", value(lambda: pages(1)), 4)
    return [
        *element("multiple_single_bit_retirement", single, 3),
        *element("double_bit_retirement", double, 3),
        *element("pending_blacklist", pending, 3),
        *element("pending_retirement", pending, 3),
    ]


def remapped_lines(nv: Nvml, dev: ctypes.c_void_p) -> list[str]:
    counts = [ctypes.c_uint() for _ in range(4)]
    try:
        nv.call("nvmlDeviceGetRemappedRows", dev, *map(ctypes.byref, counts))
    except NvmlError as exc:
        return element("remapped_rows", exc.text, 2)
    corr, unc, pending, failure = (c.value for c in counts)
    return element(
        "remapped_rows",
        [
            *element("remapped_row_corr", str(corr), 3),
            *element("remapped_row_unc", str(unc), 3),
            *element("remapped_row_pending", "Yes" if pending else "No", 3),
            *element("remapped_row_failure", "Yes" if failure else "No", 3),
        ],
        2,
    )


def temperature_lines(nv: Nvml, dev: ctypes.c_void_p) -> list[str]:
    def margin() -> int:
        reading = MarginTemperature(version=0x1000008)  # nvmlMarginTemperature_v1
        nv.call("nvmlDeviceGetMarginTemperature", dev, ctypes.byref(reading))
        return reading.marginTemperature

    def threshold(kind: int) -> int:
        return nv.uint("nvmlDeviceGetTemperatureThreshold", dev, kind)

    return [
        *element("gpu_temp", value(lambda: nv.uint("nvmlDeviceGetTemperature", dev, 0), "{} C"), 3),
        *element("gpu_temp_tlimit", value(margin, "{} C"), 3),
        *element("gpu_temp_max_threshold", value(lambda: threshold(0), "{} C"), 3),
        *element("gpu_temp_slow_threshold", value(lambda: threshold(1), "{} C"), 3),
        *element("gpu_temp_max_gpu_threshold", value(lambda: threshold(3), "{} C"), 3),
    ]


def process_lines(nv: Nvml, dev: ctypes.c_void_p) -> list[str]:
    count = ctypes.c_uint(0)
    try:
        nv.call("nvmlDeviceGetComputeRunningProcesses_v3", dev, ctypes.byref(count), None)
        infos = (ProcessInfo * 0)()
    except NvmlError as exc:
        if exc.code != NVML_ERROR_INSUFFICIENT_SIZE:
            return element("processes", exc.text, 2)
        infos = (ProcessInfo * count.value)()
        try:
            nv.call("nvmlDeviceGetComputeRunningProcesses_v3", dev, ctypes.byref(count), infos)
        except NvmlError as again:
            return element("processes", again.text, 2)
    lines = []
    for info in infos[: count.value]:
        try:
            with open(f"/proc/{info.pid}/comm", encoding="utf-8", errors="replace") as comm:
                name = comm.read().strip()
        except OSError:
            name = "N/A"
        lines += element(
            "process_info",
            [
                *element("pid", str(info.pid), 4),
                *element("type", "C", 4),
                *element("process_name", name, 4),
                *element("used_memory", f"{info.usedGpuMemory >> 20} MiB", 4),
            ],
            3,
        )
    return element("processes", lines, 2) if lines else ["\t\t<processes>", "\t\t</processes>"]


def load() -> Nvml:
    """NVML loaded and initialised, or exit as nvidia-smi does when it cannot be."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        print(
            "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure "
            "that the NVIDIA Display Driver is properly installed and present in your system.",
            file=sys.stderr,
        )
        sys.exit(EXIT_NO_LIBRARY)
    nv = Nvml(lib)
    try:
        nv.call("nvmlInitWithFlags", ctypes.c_uint(0))
    except NvmlError:
        print(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.",
            file=sys.stderr,
        )
        sys.exit(EXIT_DRIVER_NOT_LOADED)
    return nv


def handles(nv: Nvml) -> tuple[int, list[tuple[int, ctypes.c_void_p]]]:
    """The attached GPU count and the handles NVML gives (a lost GPU has none)."""
    count = nv.uint("nvmlDeviceGetCount_v2")
    found = []
    for index in range(count):
        handle = ctypes.c_void_p()
        try:
            nv.call("nvmlDeviceGetHandleByIndex_v2", ctypes.c_uint(index), ctypes.byref(handle))
        except NvmlError as exc:
            print(f"Unable to determine the device handle for GPU{index}: {exc}", file=sys.stderr)
            continue
        found.append((index, handle))
    return count, found


def query_xml(nv: Nvml) -> str:
    driver = nv.text("nvmlSystemGetDriverVersion", size=80)
    cuda = ctypes.c_int()
    nv.call("nvmlSystemGetCudaDriverVersion", ctypes.byref(cuda))
    count, devices = handles(nv)
    major = int(driver.split(".")[0]) if driver.split(".")[0].isdigit() else 0
    lines = [
        '<?xml version="1.0" ?>',
        '<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">',
        "<nvidia_smi_log>",
        *element("timestamp", time.strftime("%a %b %d %H:%M:%S %Y"), 1),
        *element("driver_version", driver, 1),
        *element("cuda_version", f"{cuda.value // 1000}.{cuda.value % 1000 // 10}", 1),
        *element("attached_gpus", str(count), 1),
    ]
    for _, handle in devices:
        lines += gpu_lines(nv, handle, major)
    lines.append("</nvidia_smi_log>")
    return "\n".join(lines) + "\n"


def list_gpus(nv: Nvml) -> str:
    lines = []
    for index, handle in handles(nv)[1]:
        name, uuid = nv.text("nvmlDeviceGetName", handle), nv.text("nvmlDeviceGetUUID", handle)
        lines.append(f"GPU {index}: {name} (UUID: {uuid})\n")
    return "".join(lines)


NVLINK_MAX_LINKS = 18  # NVML_NVLINK_MAX_LINKS before pynvml 13.610


def nvlink_status(nv: Nvml) -> str:
    """`nvidia-smi nvlink --status`: per GPU, each link's speed or <inactive>, as NVML says."""
    lines = []
    for index, handle in handles(nv)[1]:
        name, uuid = nv.text("nvmlDeviceGetName", handle), nv.text("nvmlDeviceGetUUID", handle)
        lines.append(f"GPU {index}: {name} (UUID: {uuid})")
        for link in range(NVLINK_MAX_LINKS):
            active = ctypes.c_uint()
            try:
                nv.call(
                    "nvmlDeviceGetNvLinkState", handle, ctypes.c_uint(link), ctypes.byref(active)
                )
            except NvmlError:
                break  # NotSupported / InvalidArgument: no (more) links
            state = "26.562 GB/s" if active.value else "<inactive>"
            lines.append(f"\t Link {link}: {state}")
    return "\n".join(lines) + "\n" if lines else ""


def main(argv: list[str]) -> int:
    args = sorted(argv)
    if argv == ["nvlink", "--status"]:
        nv = load()
        try:
            sys.stdout.write(nvlink_status(nv))
        finally:
            nv.lib.nvmlShutdown()
        return 0
    if args not in (["-q", "-x"], ["-L"]):
        print(
            f"nvidia-smi (gpuhealth test bed stand-in): only `-q -x` and `-L` are implemented, "
            f"not {' '.join(argv) or '(no arguments)'}",
            file=sys.stderr,
        )
        return EXIT_INVALID_ARGUMENT
    nv = load()
    try:
        sys.stdout.write(query_xml(nv) if args == ["-q", "-x"] else list_gpus(nv))
    finally:
        nv.lib.nvmlShutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
