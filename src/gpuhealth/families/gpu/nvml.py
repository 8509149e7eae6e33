"""The GPU family's NVML reader: every GPU fact of the facts document, through nvidia-ml-py.

Each NVML call runs on the session's worker with its timeout (gpuhealth.probe.nvml); a call
that fails nulls only its own keys, with the reason. Node side: Python 3.6, the standard
library and, when importable, `pynvml`.
"""

import ctypes
import re
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from gpuhealth.facts import mark_unavailable
from gpuhealth.families.gpu import parse_fabric
from gpuhealth.families.gpu.schema import CLOCK_REASON_BITS, GPU_KEYS, new_driver, new_gpu
from gpuhealth.probe.nvml import (
    MIB,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_SUCCESS,
    Keys,
    Session,
    Unavailable,
    close_session,
    open_session,
    process_record,
)

RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (r570+)
_THRESHOLD_SHUTDOWN, _THRESHOLD_SLOWDOWN, _THRESHOLD_GPU_MAX = 0, 1, 3
_ERROR_TYPES = {"corrected": 0, "uncorrected": 1}  # nvmlMemoryErrorType_t
_COUNTERS = {"volatile": 0, "aggregate": 1}  # nvmlEccCounterType_t
_LOCATIONS = {"sram": 7, "dram": 2}  # nvmlMemoryLocation_t
_RETIREMENT_CAUSES = {"single_bit": 0, "double_bit": 1}  # nvmlPageRetirementCause_t
_DEFAULT_MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS before nvidia-ml-py 13.610
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25  # a driver older than the struct version passed
# nvmlDeviceGetGpuFabricInfoV structs, newest first: v3 adds the health summary to v2's mask.
_FABRIC_STRUCTS = (("v3", "c_nvmlGpuFabricInfo_v3_t"), ("v2", "c_nvmlGpuFabricInfo_v2_t"))
# nvmlValueType_t -> c_nvmlValue_t member: a field value is read as the type NVML says it has.
_VALUE_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}
# nvmlDeviceArchitecture_t -> the names nvidia-smi prints as product_architecture.
_ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
    13: "Rubin",
}


def _text(value: Union[str, bytes]) -> str:
    """pynvml returns str on Python 3 since 11.x, bytes before."""
    return value.decode() if isinstance(value, bytes) else value


def _cuda_version(value: int) -> str:
    """12080 -> "12.8", as nvidia-smi prints it."""
    return f"{value // 1000}.{value % 1000 // 10}"


def _attach(obj: dict, key: str, group: dict) -> None:
    """Store a group of values, or null the group when all its parts are missing for one reason."""
    missing = group.get("unavailable", {})
    kinds = {why["kind"] for why in missing.values()}
    if missing and len(missing) == len(group) - 1 and len(kinds) == 1:
        first = next(iter(missing.values()))
        mark_unavailable(obj, key, first["kind"], first["detail"])
    else:
        obj[key] = group


def _watts(milliwatts: int) -> float:
    return round(milliwatts / 1000, 2)


def _pstate(value: int) -> str:
    """NVML_PSTATE_0..15 as "P0".."P15"; NVML_PSTATE_UNKNOWN (32) is no reading."""
    if not 0 <= value <= 15:
        raise ValueError(f"performance state {value}")
    return f"P{value}"


def _percent(value: int) -> int:
    if not 0 <= value <= 100:
        raise ValueError(f"utilisation {value} %")
    return value


def _clock_reasons(mask: int) -> dict:
    """Every reason is known from the bitmask: none is unavailable."""
    active = [name for name, bit in CLOCK_REASON_BITS.items() if mask & bit]
    return {"active": active, "mask": mask, "unavailable": {}}


class _GpuReader:
    """Reads one GPU record; every failing call nulls only its own keys."""

    def __init__(self, session: Session, index: int) -> None:
        self.s, self.index = session, index
        self.gpu = new_gpu(index)
        self.handle: Any = None

    def at(self, name: str, *extra: str) -> str:
        """The call as it appears in details and errors: nvmlDeviceGetX(gpu=2, ...)."""
        return f"{name}({', '.join((f'gpu={self.index}', *extra))})"

    def read(
        self,
        obj: dict,
        keys: Keys,
        name: str,
        *args: Any,
        extra: Tuple[str, ...] = (),
        convert: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        self.s.read(obj, keys, self.at(name, *extra), name, self.handle, *args, convert=convert)

    def collect(self) -> dict:
        try:
            self.handle = self.s.call(
                self.at("nvmlDeviceGetHandleByIndex"), "nvmlDeviceGetHandleByIndex", self.index
            )
        except Unavailable as why:  # e.g. GPU is lost: keep the record, every field says why
            self.s.note(self.gpu, GPU_KEYS[1:], why)
            return self.gpu
        self._identity()
        self._temperatures()
        self._ecc()
        self._memory_health()
        self._clocks_and_power()
        self._pcie()
        self._nvlink()
        self._fabric()
        self.read(
            self.gpu,
            "processes",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            convert=lambda infos: [process_record(info) for info in infos],
        )
        self._recovery_action()
        return self.gpu

    def _identity(self) -> None:
        gpu = self.gpu
        self.read(gpu, "name", "nvmlDeviceGetName", convert=_text)
        self.read(gpu, "uuid", "nvmlDeviceGetUUID", convert=_text)
        self.read(gpu, "serial", "nvmlDeviceGetSerial", convert=_text)
        self.read(
            gpu,
            ("pci_bus_id", "pci_device_id"),
            "nvmlDeviceGetPciInfo",
            convert=lambda pci: (_text(pci.busId).upper(), f"0x{pci.pciDeviceId:08X}"),
        )
        self.read(
            gpu,
            "architecture",
            "nvmlDeviceGetArchitecture",
            convert=lambda arch: _ARCHITECTURES.get(arch, f"Unknown({arch})"),
        )
        self.read(gpu, "vbios_version", "nvmlDeviceGetVbiosVersion", convert=_text)
        self.read(gpu, "persistence_mode", "nvmlDeviceGetPersistenceMode", convert=bool)
        self.read(
            gpu,
            ("memory_total_mib", "memory_used_mib"),
            "nvmlDeviceGetMemoryInfo",
            convert=lambda mem: (mem.total // MIB, mem.used // MIB),
        )

    def _temperatures(self) -> None:
        gpu = self.gpu
        try:  # nvmlDeviceGetTemperature is deprecated; its successor needs r570+ and pynvml 12.570+
            gpu["temperature_c"] = self.s.call(
                self.at("nvmlDeviceGetTemperatureV"), "nvmlDeviceGetTemperatureV", self.handle, 0
            )
        except Unavailable as why:
            if why.kind == "not_supported":  # also FunctionNotFound: a driver before r570
                self.read(gpu, "temperature_c", "nvmlDeviceGetTemperature", 0)
            else:
                self.s.note(gpu, "temperature_c", why)
        for key, threshold, label in (
            ("temp_slowdown_c", _THRESHOLD_SLOWDOWN, "SLOWDOWN"),
            ("temp_shutdown_c", _THRESHOLD_SHUTDOWN, "SHUTDOWN"),
            ("temp_max_operating_c", _THRESHOLD_GPU_MAX, "GPU_MAX"),
        ):
            self.read(gpu, key, "nvmlDeviceGetTemperatureThreshold", threshold, extra=(label,))
        self.read(gpu, "temp_tlimit_margin_c", "nvmlDeviceGetMarginTemperature")

    def _ecc(self) -> None:
        gpu = self.gpu
        self.read(
            gpu,
            "ecc_mode",
            "nvmlDeviceGetEccMode",
            convert=lambda modes: "enabled" if modes[0] else "disabled",
        )
        if gpu["ecc_mode"] != "enabled":
            off = {"kind": "not_supported", "detail": "ECC mode is disabled"}
            why = gpu["unavailable"].get("ecc_mode", off)
            mark_unavailable(gpu, "ecc", why["kind"], why["detail"])
            return
        ecc: Dict[str, Any] = {}
        for counter, counter_type in _COUNTERS.items():
            counts: Dict[str, Any] = {"unavailable": {}}
            for error, error_type in _ERROR_TYPES.items():
                self.read(
                    counts,
                    error,
                    "nvmlDeviceGetTotalEccErrors",
                    error_type,
                    counter_type,
                    extra=(error, counter),
                )
            for location, location_type in _LOCATIONS.items():
                for error, error_type in _ERROR_TYPES.items():
                    self.read(
                        counts,
                        f"{location}_{error}",
                        "nvmlDeviceGetMemoryErrorCounter",
                        error_type,
                        counter_type,
                        location_type,
                        extra=(error, counter, location.upper()),
                    )
            _attach(ecc, counter, counts)
        _attach(gpu, "ecc", ecc)

    def _memory_health(self) -> None:
        pages: Dict[str, Any] = {}
        for key, cause in _RETIREMENT_CAUSES.items():
            self.read(
                pages,
                key,
                "nvmlDeviceGetRetiredPages",
                cause,
                extra=(f"cause={cause}",),
                convert=len,
            )
        self.read(pages, "pending", "nvmlDeviceGetRetiredPagesPendingStatus", convert=bool)
        _attach(self.gpu, "retired_pages", pages)
        self.read(
            self.gpu,
            "remapped_rows",
            "nvmlDeviceGetRemappedRows",
            convert=lambda rows: {
                "correctable": rows[0],
                "uncorrectable": rows[1],
                "pending": bool(rows[2]),
                "failure": bool(rows[3]),
            },
        )

    def _clocks_and_power(self) -> None:
        gpu = self.gpu
        self.read(
            gpu,
            "clock_event_reasons",
            "nvmlDeviceGetCurrentClocksEventReasons",
            convert=_clock_reasons,
        )
        self.read(gpu, "power_draw_w", "nvmlDeviceGetPowerUsage", convert=_watts)
        self.read(gpu, "power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", convert=_watts)
        self.read(gpu, "performance_state", "nvmlDeviceGetPerformanceState", convert=_pstate)
        self.read(
            gpu,
            "utilization_gpu_pct",
            "nvmlDeviceGetUtilizationRates",
            convert=lambda rates: _percent(rates.gpu),
        )

    def _pcie(self) -> None:
        pcie: Dict[str, Any] = {}
        for key, name in (
            ("gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
            ("gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
            ("width_current", "nvmlDeviceGetCurrPcieLinkWidth"),
            ("width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
            ("replay_count", "nvmlDeviceGetPcieReplayCounter"),
        ):
            self.read(pcie, key, name)
        _attach(self.gpu, "pcie", pcie)

    def _nvlink(self) -> None:
        """Links 0..N until NVML says there are no more; PCIe-only boards fail on link 0."""
        links: List[dict] = []
        for link in range(getattr(self.s.nv, "NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_NVLINKS)):
            label = self.at("nvmlDeviceGetNvLinkState", f"link={link}")
            try:
                state = self.s.call(label, "nvmlDeviceGetNvLinkState", self.handle, link)
            except Unavailable as why:
                if link == 0:
                    self.s.note(self.gpu, "nvlink", why)
                    return
                if why.kind == "not_supported" or why.code == NVML_ERROR_INVALID_ARGUMENT:
                    break  # past the last link
                entry = {"link": link}
                self.s.note(entry, "up", why)
                links.append(entry)
                if why.kind == "timeout":
                    break
            else:
                links.append({"link": link, "up": state == 1})
        self.gpu["nvlink"] = links

    def _fabric(self) -> None:
        """The GPU's NVLink fabric: nvmlDeviceGetGpuFabricInfoV with the newest struct both
        the bindings and the driver know, else the deprecated nvmlDeviceGetGpuFabricInfo
        (no health) where the driver or the bindings lack the V call."""
        nv = self.s.nv
        structs = [(name, getattr(nv, cls)) for name, cls in _FABRIC_STRUCTS if hasattr(nv, cls)]
        lacking = Unavailable(
            "not_supported",
            self.at("nvmlDeviceGetGpuFabricInfoV"),
            "no nvmlGpuFabricInfo v2/v3 struct in the installed nvidia-ml-py",
        )
        refused: List[str] = []
        for name, struct in structs:
            info = struct()
            label = self.at("nvmlDeviceGetGpuFabricInfoV", name)
            try:
                self.s.call(label, "nvmlDeviceGetGpuFabricInfoV", self.handle, ctypes.byref(info))
            except Unavailable as why:
                if why.code == NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
                    refused.append(name)  # a driver older than this struct: try the older one
                    lacking = why
                    continue
                if why.code == NVML_ERROR_FUNCTION_NOT_FOUND or (
                    why.code is None and why.kind == "not_supported"
                ):
                    lacking = why  # no V call in the driver or the bindings
                    break
                self.s.note(self.gpu, "fabric", why)
                return
            summary = info.healthSummary if name == "v3" else None
            older = (
                f"the driver refused {refused[0]}" if refused else "no newer one in nvidia-ml-py"
            )
            why_not = f"{label}: the {name} struct has no health summary ({older})"
            self._store_fabric(info, label, info.healthMask, summary, why_not)
            return
        self._deprecated_fabric(lacking)

    def _deprecated_fabric(self, lacking: Unavailable) -> None:
        """nvmlDeviceGetGpuFabricInfo: state, status, clique and cluster, no health."""
        label = self.at("nvmlDeviceGetGpuFabricInfo")
        struct = getattr(self.s.nv, "c_nvmlGpuFabricInfo_t", None)
        if struct is None:
            self.s.note(self.gpu, "fabric", lacking)
            return
        info = struct()
        try:
            self.s.call(label, "nvmlDeviceGetGpuFabricInfo", self.handle, ctypes.byref(info))
        except Unavailable as why:
            if why.kind == "not_supported" and why.code != NVML_ERROR_NOT_SUPPORTED:
                why = Unavailable(why.kind, why.call, f"{why.error}; {lacking.detail}", why.code)
            self.s.note(self.gpu, "fabric", why)  # neither call there: say why for both
            return
        no_health = f"{label} reports no health ({lacking.detail})"
        self._store_fabric(info, label, None, None, no_health)

    def _store_fabric(
        self, info: Any, label: str, mask: Optional[int], summary: Optional[int], why_not: str
    ) -> None:
        if info.state == parse_fabric.STATE_NOT_SUPPORTED:
            why = Unavailable(
                "not_supported", label, "fabric state NOT_SUPPORTED (no NVLink fabric)"
            )
            self.s.note(self.gpu, "fabric", why)
            return
        health = parse_fabric.decode_health(mask, summary, label, why_not)
        self.gpu["fabric"] = parse_fabric.from_nvml(
            info.state, self._status(info.status), info.cliqueId, list(info.clusterUuid), health
        )

    def _status(self, code: int) -> str:
        """The fabric status (an nvmlReturn_t) in nvidia-smi's words: "Success",
        "Insufficient Resources" (from pynvml's NVMLError_InsufficientResources)."""
        if code == NVML_SUCCESS:
            return "Success"
        name = type(self.s.nv.NVMLError(code)).__name__.partition("_")[2]
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name) or f"NVML error {code}"

    def _recovery_action(self) -> None:
        """Field 230 reports errors per value in nvmlReturn; the call itself still succeeds."""
        field = getattr(self.s.nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", RECOVERY_ACTION_FIELD)
        label = self.at("nvmlDeviceGetFieldValues", f"field={field}")
        try:
            value = self.s.call(label, "nvmlDeviceGetFieldValues", self.handle, [field])[0]
        except Unavailable as why:
            self.s.note(self.gpu, "recovery_action", why)
            return
        member = _VALUE_MEMBERS.get(value.valueType)
        if value.nvmlReturn == NVML_SUCCESS and member:
            self.gpu["recovery_action"] = int(getattr(value.value, member))
        elif value.nvmlReturn == NVML_ERROR_NOT_SUPPORTED:
            self.s.note(
                self.gpu,
                "recovery_action",
                Unavailable("not_supported", label, "Not Supported (drivers before r570 lack it)"),
            )
        else:
            error = type(self.s.nv.NVMLError(value.nvmlReturn)).__name__
            self.s.note(
                self.gpu,
                "recovery_action",
                Unavailable(
                    "error",
                    label,
                    f"nvmlReturn={value.nvmlReturn} ({error}), valueType={value.valueType}",
                    value.nvmlReturn,
                ),
            )


def _driver(session: Session) -> Dict[str, Any]:
    driver = new_driver(True)
    for key, name, convert in (
        ("version", "nvmlSystemGetDriverVersion", _text),
        ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion", _cuda_version),
        ("nvml_version", "nvmlSystemGetNVMLVersion", _text),
    ):
        session.read(driver, key, name, name, convert=convert)
    return driver


def collect(call_timeout_s: float, errors: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The driver, gpu_count and gpus parts of the facts document, read over NVML.

    None (with the reason appended to `errors`) when NVML cannot be used at all, so the caller
    can fall back to nvidia-smi. Each NVML call may take at most call_timeout_s.
    """
    session = open_session(call_timeout_s, errors)
    if session is None:
        return None
    facts = None
    try:
        count = session.call("nvmlDeviceGetCount", "nvmlDeviceGetCount")
    except Unavailable as why:  # without the GPU count NVML is of no use; nvidia-smi may do
        errors.append({"probe": "nvml", "call": why.call, "error": why.error})
    else:
        facts = {
            "driver": _driver(session),
            "gpu_count": count,
            "gpus": [_GpuReader(session, index).collect() for index in range(count)],
        }
    close_session(session)
    return facts
