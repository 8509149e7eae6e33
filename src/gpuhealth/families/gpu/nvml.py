"""The GPU family's NVML reader: every GPU fact of the facts document, through nvidia-ml-py;
the families that build on it read their parts of each GPU record in the same pass, over the
same session (their probe's GPU_READS: the NVLink fabric's).

Each NVML call runs on the session's worker with its timeout (gpuhealth.probe.nvml); a call
that fails nulls only its own keys, with the reason. Node side: Python 3.6, the standard
library and, when importable, `pynvml`.
"""

import ctypes
import string
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from gpuhealth.facts import mark_unavailable, reason
from gpuhealth.families.gpu.schema import (
    CLOCK_REASON_BITS,
    GPU_KEYS,
    NVLINK_COUNTER_SOURCES,
    NVLINK_ERROR_COUNTERS,
    NVLINK_FIELD_COUNTERS,
    PLATFORM_KEYS,
    new_driver,
    new_gpu,
)
from gpuhealth.probe.nvml import (
    MIB,
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
# nvmlDeviceGetPlatformInfo structs, newest first, and their members for the PLATFORM_KEYS:
# v2 renamed v1's rack-relative slot and node fields and replaced the rack GUID by the
# chassis serial number.
_PLATFORM_STRUCTS = (
    (
        "v2",
        "c_nvmlPlatformInfo_v2_t",
        {
            "module_id": "moduleId",
            "tray_index": "trayIndex",
            "slot_number": "slotNumber",
            "host_id": "hostId",
            "peer_type": "peerType",
            "chassis_serial": "chassisSerialNumber",
        },
    ),
    (
        "v1",
        "c_nvmlPlatformInfo_v1_t",
        {
            "module_id": "moduleId",
            "tray_index": "computeSlotIndex",
            "slot_number": "chassisPhysicalSlotNumber",
            "host_id": "nodeIndex",
            "peer_type": "peerType",
        },
    ),
)
_PRINTABLE = set(string.ascii_letters + string.digits + string.punctuation + " ")
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


def _raw(struct: Any, member: str) -> bytes:
    """A struct member's bytes as the driver wrote them (pynvml's structs decode char fields
    as UTF-8 text, which fails on bytes such as 0x80)."""
    field = getattr(type(struct), member)
    return ctypes.string_at(ctypes.addressof(struct) + field.offset, field.size)


def _clock_reasons(mask: int) -> dict:
    """Every reason is known from the bitmask: none is unavailable."""
    active = [name for name, bit in CLOCK_REASON_BITS.items() if mask & bit]
    return {"active": active, "mask": mask, "unavailable": {}}


def call_label(index: int, name: str, *extra: str) -> str:
    """A call as it appears in details and errors: nvmlDeviceGetX(gpu=2, ...)."""
    return f"{name}({', '.join((f'gpu={index}', *extra))})"


def newest(
    session: Session,
    at: Callable[..., str],
    function: str,
    handle: Any,
    structs: List[Tuple[str, Any]],
    lacking: Unavailable,
) -> Tuple[str, Any, List[str]]:
    """Call a versioned NVML function of a GPU (`handle`) with the newest of `structs`
    ((name, ctypes class), newest first) the driver takes: (its name, the filled struct, the
    names the driver refused as too new). Raises the call's Unavailable: `lacking` when there
    is no struct, the last version mismatch when the driver takes none, any other error at
    once. `at(function, name)` labels a call."""
    refused: List[str] = []
    for name, struct in structs:
        info = struct()
        try:
            session.call(at(function, name), function, handle, ctypes.byref(info))
        except Unavailable as why:
            if why.code != NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
                raise
            refused.append(name)  # a driver older than this struct: try the older one
            lacking = why
            continue
        return name, info, refused
    raise lacking


# A read another family makes of each GPU during this family's NVML pass (a family probe's
# GPU_READS): (the session, the GPU's record, its NVML handle); it fills its own keys of the
# record, each failing call nulling only those, with the reason.
GpuRead = Callable[[Session, Dict[str, Any], Any], None]


class _GpuReader:
    """Reads one GPU record; every failing call nulls only its own keys."""

    def __init__(
        self, session: Session, index: int, reads: Sequence[Tuple[str, GpuRead]] = ()
    ) -> None:
        self.s, self.index, self.reads = session, index, reads
        self.gpu = new_gpu(index)
        self.handle: Any = None
        self.first_read_at: Optional[float] = None  # when the NVLink error counters were read

    def store(self, key: str, value: Any) -> None:
        """A value for a key new_gpu marked as only NVML's (NVML_ONLY): drop that reason."""
        self.gpu["unavailable"].pop(key, None)
        self.gpu[key] = value

    def at(self, name: str, *extra: str) -> str:
        """The call as it appears in details and errors: nvmlDeviceGetX(gpu=2, ...)."""
        return call_label(self.index, name, *extra)

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
        since = len(self.s.lost)
        try:
            self.handle = self.s.call(
                self.at("nvmlDeviceGetHandleByIndex"), "nvmlDeviceGetHandleByIndex", self.index
            )
        except Unavailable as why:  # e.g. GPU is lost: keep the record, every field says why
            self.s.note(self.gpu, GPU_KEYS[1:], why)
            self.became_lost(since)
            return self.gpu
        self._identity()
        self._temperatures()
        self._ecc()
        self._memory_health()
        self._clocks_and_power()
        self._pcie()
        self._nvlink()
        self._nvlink_errors()
        self._others()
        self._platform()
        self.read(
            self.gpu,
            "processes",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            convert=lambda infos: [process_record(info) for info in infos],
        )
        self._recovery_action()
        self._judge_lost(since)
        return self.gpu

    def _others(self) -> None:
        """The other families' reads of this GPU (the NVLink fabric's), each on its own: a bug
        in one is that family's error, never the GPU record's."""
        for family, read in self.reads:
            try:
                read(self.s, self.gpu, self.handle)
            except Exception as exc:
                self.s.errors.append({"probe": family, "error": f"{type(exc).__name__}: {exc}"})

    def became_lost(self, since: int) -> bool:
        """Name the GPU lost by the first of its calls since `since` (an index into the
        session's `lost`) that NVML answered NVML_ERROR_GPU_IS_LOST; whether there was one."""
        calls = self.s.lost[since:]
        if calls and not self.gpu["lost"]:
            self.store("lost", {"call": calls[0].call, "error": calls[0].error})
        return bool(calls)

    def _judge_lost(self, since: int) -> None:
        """`lost` once every call for the GPU was made: the call that found it lost, else
        false; unknown when NVML hung before it answered them all."""
        if self.became_lost(since):
            return
        hung = self.s.worker.hung
        if hung:
            detail = f"NVML hung at {hung} (no answer within {self.s.worker.timeout_s:g} s)"
            mark_unavailable(self.gpu, "lost", "timeout", detail)
        else:
            self.store("lost", False)

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

    def _nvlink_errors(self) -> None:
        """First read of the error counters of every active link: nvmlDeviceGetNvLinkErrorCounter,
        else, where the driver supports none of its counters (deprecated on Blackwell), the
        NVLink5 counters as field values. read_nvlink_errors_again reads them once more after
        the window, so a link erroring now shows as growth."""
        gpu = self.gpu
        links = gpu["nvlink"]
        if links is None:  # a PCIe board, or the link states could not be read
            why = reason(gpu, "nvlink")
            mark_unavailable(gpu, "nvlink_errors", why["kind"], why["detail"])
            return
        active = [entry["link"] for entry in links if entry.get("up")]
        if not active:
            detail = f"no NVLink link of gpu={self.index} is up (see the nvlink check)"
            mark_unavailable(gpu, "nvlink_errors", "not_supported", detail)
            return
        self.first_read_at = time.monotonic()
        read = [self._legacy_entry(active[0])]  # decides for the GPU: 5 calls, not 5 per link
        refused = read[0]["unavailable"]
        if len(refused) == len(NVLINK_ERROR_COUNTERS) and all(
            why["kind"] == "not_supported" for why in refused.values()
        ):
            legacy = f"{refused['replay']['detail']} (every counter of link {active[0]})"
            self._field_counters(active, legacy)
            return
        read += [self._legacy_entry(link) for link in active[1:]]
        record: Dict[str, Any] = {
            "source": "error_counter",
            "window_s": None,
            "links": read,
            "unavailable": {},
        }
        self.store("nvlink_errors", record)

    def _legacy_entry(self, link: int) -> Dict[str, Any]:
        """One link's five nvmlDeviceGetNvLinkErrorCounter counters, first read."""
        entry: Dict[str, Any] = {"link": link, "unavailable": {}}
        for name, code, label in NVLINK_ERROR_COUNTERS:
            try:
                value = self._counter(link, code, label)
            except Unavailable as why:
                self.s.note(entry, name, why)
            else:
                entry[name] = {"first": value, "second": None, "unavailable": {}}
        return entry

    def _counter(self, link: int, code: int, label: str) -> int:
        name = "nvmlDeviceGetNvLinkErrorCounter"
        value = self.s.call(self.at(name, f"link={link}", label), name, self.handle, link, code)
        if not isinstance(value, int) or value < 0:
            raise Unavailable("error", self.at(name, f"link={link}", label), f"value {value!r}")
        return value

    def _field_counters(self, active: List[int], legacy: str) -> None:
        """First read of the NVLink5 counters (NVLINK_FIELD_COUNTERS) of every active link, in
        one nvmlDeviceGetFieldValues call; `legacy` says why the legacy call was not used."""
        gpu = self.gpu
        self.first_read_at = time.monotonic()
        try:
            values = self._field_values(active)
        except Unavailable as why:
            self.first_read_at = None
            if why.kind == "not_supported":  # neither way of reading them: say why for both
                detail = f"{legacy}; {why.detail}"
                mark_unavailable(gpu, "nvlink_errors", "not_supported", detail)
            else:
                self.s.note(gpu, "nvlink_errors", why)
            return
        read: List[Dict[str, Any]] = []
        for link in active:
            entry: Dict[str, Any] = {"link": link, "unavailable": {}}
            for name, _, _ in NVLINK_FIELD_COUNTERS:
                value = values[(link, name)]
                if isinstance(value, Unavailable):
                    self.s.note(entry, name, value)
                else:
                    entry[name] = {"first": value, "second": None, "unavailable": {}}
            read.append(entry)
        reasons = [entry["unavailable"][name] for entry in read for name in entry["unavailable"]]
        if len(reasons) == len(read) * len(NVLINK_FIELD_COUNTERS) and all(
            why["kind"] == "not_supported" for why in reasons
        ):
            detail = (
                f"{legacy}; {reasons[0]['detail']} (every NVLink5 field of the {len(read)} "
                "active links)"
            )
            mark_unavailable(gpu, "nvlink_errors", "not_supported", detail)
            self.first_read_at = None
            return
        record: Dict[str, Any] = {
            "source": "field_values",
            "window_s": None,
            "links": read,
            "unavailable": {},
        }
        self.store("nvlink_errors", record)

    def _field_values(self, active: List[int]) -> Dict[Tuple[int, str], Any]:
        """(link, counter) -> its value, or the Unavailable its entry's nvmlReturn gives: all
        links and counters in one call, each (field id, scopeId = link)."""
        wanted = [(link, entry) for link in active for entry in NVLINK_FIELD_COUNTERS]
        label = self.at(
            "nvmlDeviceGetFieldValues",
            f"{len(NVLINK_FIELD_COUNTERS)} NVLink fields x {len(active)} links",
        )
        ids = [(field, link) for link, (_, field, _) in wanted]
        try:
            values = self.s.call(label, "nvmlDeviceGetFieldValues", self.handle, ids)
        except Unavailable as why:
            if why.code is None and why.error.startswith("TypeError"):
                # nvidia-ml-py releases that take bare field ids only: no scopeId, no link
                raise Unavailable(
                    "not_supported",
                    label,
                    f"the installed nvidia-ml-py cannot name a link (scopeId): {why.error}; "
                    "upgrade nvidia-ml-py",
                ) from None
            raise
        return {
            (link, name): self._field_value(
                self.at("nvmlDeviceGetFieldValues", f"link={link}", f"field={field} {nvml_name}"),
                value,
            )
            for (link, (name, field, nvml_name)), value in zip(wanted, values)
        }

    def _field_value(self, label: str, value: Any) -> Any:
        """A counter from one nvmlFieldValue_t: a non-negative integer, or the Unavailable its
        nvmlReturn (or an unusable value) gives; NOT_SUPPORTED is unknown, never 0."""
        code = value.nvmlReturn
        if code == NVML_SUCCESS:
            member = _VALUE_MEMBERS.get(value.valueType)
            number = getattr(value.value, member) if member and member != "dVal" else None
            if isinstance(number, int) and number >= 0:
                return number
            return Unavailable(
                "error", label, f"valueType={value.valueType}: {number!r} is not a counter"
            )
        if code == NVML_ERROR_NOT_SUPPORTED:
            return Unavailable("not_supported", label, "Not Supported", code)
        error = type(self.s.nv.NVMLError(code)).__name__
        return Unavailable("error", label, f"nvmlReturn={code} ({error})", code)

    def read_nvlink_errors_again(self, window_s: float, hung: Optional[str]) -> None:
        """The second read, after the probe's one wait; the window recorded is this GPU's
        own, first read to second. None when the counters were read once: window_s 0, or
        NVML hung at another GPU after these were read (that GPU's checks fail for it)."""
        record = self.gpu["nvlink_errors"]
        if self.first_read_at is None or record is None:
            return
        counters = NVLINK_COUNTER_SOURCES[record["source"]]
        if window_s <= 0 or hung:
            kind, detail = (
                ("timeout", f"not read again: NVML hung at {hung}")
                if hung
                else ("absent", "nvlink_error_window_s is 0: the counters were read once")
            )
            mark_unavailable(record, "window_s", kind, detail)
            for entry in record["links"]:
                for name, _, _ in counters:
                    if entry[name] is not None:
                        mark_unavailable(entry[name], "second", kind, detail)
            return
        record["window_s"] = round(time.monotonic() - self.first_read_at, 3)
        if record["source"] == "field_values":
            self._field_counters_again(record)
            return
        for entry in record["links"]:
            for name, code, label in NVLINK_ERROR_COUNTERS:
                counter = entry[name]
                if counter is None:
                    continue
                try:
                    counter["second"] = self._counter(entry["link"], code, label)
                except Unavailable as why:
                    self.s.note(counter, "second", why)

    def _field_counters_again(self, record: Dict[str, Any]) -> None:
        """The second read of the field-value counters: again one call for the GPU."""
        try:
            values = self._field_values([entry["link"] for entry in record["links"]])
        except Unavailable as why:
            for entry in record["links"]:
                for name, _, _ in NVLINK_FIELD_COUNTERS:
                    if entry[name] is not None:
                        mark_unavailable(entry[name], "second", why.kind, why.detail)
            self.s.record(why)
            return
        for entry in record["links"]:
            for name, _, _ in NVLINK_FIELD_COUNTERS:
                counter, value = entry[name], values[(entry["link"], name)]
                if counter is None:
                    continue
                if isinstance(value, Unavailable):
                    self.s.note(counter, "second", value)
                else:
                    counter["second"] = value

    def _platform(self) -> None:
        """Where the GPU sits: nvmlDeviceGetPlatformInfo (GB200/GB300 trays; NOT_SUPPORTED on
        HGX boards is normal) with the newest struct the driver takes, and the module id from
        nvmlDeviceGetModuleId when the platform info does not give it."""
        platform: Dict[str, Any] = {"unavailable": {}}
        why = self._platform_info(platform)
        if why is not None:
            self.s.note(platform, PLATFORM_KEYS, why)
        if platform["module_id"] is None:
            label = self.at("nvmlDeviceGetModuleId")
            try:
                platform["module_id"] = self.s.call(label, "nvmlDeviceGetModuleId", self.handle)
            except Unavailable as module:
                if why is not None:  # neither call answered: the GPU has no platform record
                    if module.kind == why.kind:
                        detail = f"{why.detail}; {module.detail}"
                        mark_unavailable(self.gpu, "platform", why.kind, detail)
                        self.s.record(module)
                        return
                self.s.note(platform, "module_id", module)
            else:
                platform["unavailable"].pop("module_id", None)
        self.store("platform", platform)

    def _platform_info(self, platform: Dict[str, Any]) -> Optional[Unavailable]:
        """Fill `platform` from the platform info; the reason when there is none."""
        nv = self.s.nv
        lacking = Unavailable(
            "not_supported",
            self.at("nvmlDeviceGetPlatformInfo"),
            "no nvmlPlatformInfo struct in the installed nvidia-ml-py",
        )
        structs = [(n, getattr(nv, c)) for n, c, _ in _PLATFORM_STRUCTS if hasattr(nv, c)]
        try:
            name, info, refused = newest(
                self.s, self.at, "nvmlDeviceGetPlatformInfo", self.handle, structs, lacking
            )
        except Unavailable as why:
            return why
        label = self.at("nvmlDeviceGetPlatformInfo", name)
        members = next(m for n, _, m in _PLATFORM_STRUCTS if n == name)
        for key in PLATFORM_KEYS:
            member = members.get(key)
            if member is None:
                older = f"the driver refused {refused[0]}" if refused else "an older struct"
                detail = f"{label}: the {name} struct has no {key} ({older})"
                mark_unavailable(platform, key, "not_supported", detail)
            elif key == "chassis_serial":
                self._chassis_serial(platform, label, _raw(info, member))
            else:
                platform[key] = _raw(info, member)[0]
        return None

    def _chassis_serial(self, platform: Dict[str, Any], label: str, raw: bytes) -> None:
        """The chassis serial as text (13 ASCII bytes on Blackwell, zero-padded)."""
        text = raw.rstrip(b"\0").decode("ascii", "replace")
        if not text:
            mark_unavailable(platform, "chassis_serial", "not_supported", f"{label}: all zero")
        elif set(text) <= _PRINTABLE:
            platform["chassis_serial"] = text
        else:
            detail = f"{label}: chassis serial {raw.hex()} is not text"
            self.s.note(platform, "chassis_serial", Unavailable("error", label, detail))

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


def collect(
    call_timeout_s: float,
    errors: List[Dict[str, Any]],
    nvlink_error_window_s: float = 0.0,
    reads: Sequence[Tuple[str, GpuRead]] = (),
) -> Optional[Dict[str, Any]]:
    """The driver, gpu_count and gpus parts of the facts document, read over NVML, with the
    reads other families make of each GPU over the same session (`reads`: (family, read)).

    None (with the reason appended to `errors`) when NVML cannot be used at all, so the caller
    can fall back to nvidia-smi. Each NVML call may take at most call_timeout_s. The NVLink
    error counters are read twice, nvlink_error_window_s apart: one wait for all GPUs.
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
        driver = _driver(session)
        readers = [_GpuReader(session, index, reads) for index in range(count)]
        gpus = [reader.collect() for reader in readers]
        waiting = [reader for reader in readers if reader.first_read_at is not None]
        if waiting and nvlink_error_window_s > 0 and not session.worker.hung:
            time.sleep(nvlink_error_window_s)
        for reader in waiting:
            since = len(session.lost)
            reader.read_nvlink_errors_again(nvlink_error_window_s, session.worker.hung)
            reader.became_lost(since)  # it fell off the bus during the window
        facts = {"driver": driver, "gpu_count": count, "gpus": gpus}
    close_session(session)
    return facts
