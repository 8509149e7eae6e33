"""NVML collector of the probe: every GPU fact of the facts document, read through nvidia-ml-py.

Stdlib plus an optional `pynvml`: this file is shipped to GPU nodes, where nvidia-ml-py may be
missing. When NVML cannot be used at all, collect() returns None and the caller falls back to
`nvidia-smi -q -x`.

A wedged driver can block an NVML call forever, so every call runs on one daemon worker thread
and the caller waits at most `call_timeout_s`. After one call has hung, NVML counts as
unresponsive: later calls fail at once with kind `timeout`, so the probe still finishes in about
one timeout. The hung thread is left behind, never joined.
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Callable
from typing import Any

from gpuhealth.probe.schema import CLOCK_REASON_BITS, GPU_KEYS, mark_unavailable, new_gpu

MIB = 1024 * 1024

# NVML ABI constants, spelled out so any nvidia-ml-py release works (older ones lack some names).
RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (r570+)
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_FUNCTION_NOT_FOUND = 13
_NOT_SUPPORTED_CODES = (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND)
_THRESHOLD_SHUTDOWN, _THRESHOLD_SLOWDOWN, _THRESHOLD_GPU_MAX = 0, 1, 3
_ERROR_TYPES = {"corrected": 0, "uncorrected": 1}  # nvmlMemoryErrorType_t
_COUNTERS = {"volatile": 0, "aggregate": 1}  # nvmlEccCounterType_t
_LOCATIONS = {"sram": 7, "dram": 2}  # nvmlMemoryLocation_t
_RETIREMENT_CAUSES = {"single_bit": 0, "double_bit": 1}  # nvmlPageRetirementCause_t
_DEFAULT_MAX_NVLINKS = 18  # NVML_NVLINK_MAX_LINKS before nvidia-ml-py 13.610
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


class _Unavailable(Exception):
    """Why a call gave no value: a facts `unavailable` kind, and whether it belongs in `errors`."""

    def __init__(
        self, kind: str, call: str, error: str, code: int | None = None, record: bool | None = None
    ) -> None:
        self.kind, self.call, self.error, self.code = kind, call, error, code
        self.detail = f"{call}: {error}"
        super().__init__(self.detail)
        self.record = kind == "error" if record is None else record


class _Worker:
    """One daemon thread that runs NVML calls in order, so a hung call cannot hang the probe."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.hung: str | None = None  # the call that timed out; NVML is unresponsive after it
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="nvml-calls", daemon=True).start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, done, outcome = job
            try:
                outcome.append((True, fn()))
            except Exception as exc:  # handed to the waiting caller
                outcome.append((False, exc))
            done.set()

    def run(self, label: str, fn: Callable[[], Any]) -> Any:
        """fn() on the worker, or _Unavailable(timeout) once call_timeout_s has passed."""
        if self.hung:
            raise _Unavailable("timeout", label, f"not called: NVML hung at {self.hung}")
        done, outcome = threading.Event(), []
        self._jobs.put((fn, done, outcome))
        if not done.wait(self.timeout_s):
            self.hung = label
            raise _Unavailable(
                "timeout", label, f"timed out after {self.timeout_s:g} s", record=True
            )
        ok, value = outcome[0]
        if ok:
            return value
        raise value

    def close(self) -> None:
        """Let an idle worker thread end; a hung one stays blocked in the driver."""
        self._jobs.put(None)


class _Session:
    """An initialised NVML: the pynvml module, the worker running its calls, the errors list."""

    def __init__(self, nv: Any, worker: _Worker, errors: list[dict]) -> None:
        self.nv, self.worker, self.errors = nv, worker, errors

    def call(self, label: str, name: str, *args: Any) -> Any:
        """pynvml.<name>(*args) on the worker; failures raise _Unavailable with their kind.

        `label` names the call in details and errors, e.g. "nvmlDeviceGetSerial(gpu=2)".
        """
        fn = getattr(self.nv, name, None)
        if fn is None:
            raise _Unavailable("not_supported", label, "not in the installed nvidia-ml-py")
        return self.worker.run(label, functools.partial(self._classified, label, fn, *args))

    def _classified(self, label: str, fn: Callable[..., Any], *args: Any) -> Any:
        # Runs on the worker: str() of an NVMLError may itself call into NVML.
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            kind = "not_supported" if exc.value in _NOT_SUPPORTED_CODES else "error"
            raise _Unavailable(kind, label, str(exc), exc.value) from None
        except Exception as exc:
            raise _Unavailable("error", label, f"{type(exc).__name__}: {exc}") from None

    def record(self, why: _Unavailable) -> None:
        """Append a real failure (an NVML error, the call that hung) to the probe's errors."""
        if why.record:
            self.errors.append({"probe": "nvml", "call": why.call, "error": why.error})

    def note(self, obj: dict, keys: str | tuple[str, ...], why: _Unavailable) -> None:
        """Null obj's keys with the reason, and record the failure once."""
        for key in (keys,) if isinstance(keys, str) else keys:
            mark_unavailable(obj, key, why.kind, why.detail)
        self.record(why)

    def read(
        self,
        obj: dict,
        keys: str | tuple[str, ...],
        label: str,
        name: str,
        *args: Any,
        convert: Callable[[Any], Any] | None = None,
    ) -> None:
        """obj[keys] = convert(pynvml.<name>(*args)); a tuple of keys takes a tuple of values."""
        try:
            value = self.call(label, name, *args)
        except _Unavailable as why:
            self.note(obj, keys, why)
            return
        value = convert(value) if convert else value
        if isinstance(keys, str):
            obj[keys] = value
        else:
            obj.update(zip(keys, value, strict=True))


def _text(value: str | bytes) -> str:
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


def _clock_reasons(mask: int) -> dict:
    return {"active": [name for name, bit in CLOCK_REASON_BITS.items() if mask & bit], "mask": mask}


def _process(info: Any) -> dict:
    """A compute process; its name comes from /proc, which NVML does not give."""
    entry: dict[str, Any] = {"pid": info.pid, "name": None, "used_memory_mib": None}
    try:
        with open(f"/proc/{info.pid}/comm", encoding="utf-8", errors="replace") as comm:
            entry["name"] = comm.read().strip()
    except OSError as exc:
        mark_unavailable(entry, "name", "absent", f"/proc/{info.pid}/comm: {exc.strerror}")
    if info.usedGpuMemory is None:  # NVML_VALUE_NOT_AVAILABLE (WDDM, some MIG setups)
        mark_unavailable(entry, "used_memory_mib", "not_supported", "NVML gives no value")
    else:
        entry["used_memory_mib"] = info.usedGpuMemory // MIB
    return entry


class _GpuReader:
    """Reads one GPU record; every failing call nulls only its own keys."""

    def __init__(self, session: _Session, index: int) -> None:
        self.s, self.index = session, index
        self.gpu = new_gpu(index)
        self.handle: Any = None

    def at(self, name: str, *extra: str) -> str:
        """The call as it appears in details and errors: nvmlDeviceGetX(gpu=2, ...)."""
        return f"{name}({', '.join((f'gpu={self.index}', *extra))})"

    def read(
        self,
        obj: dict,
        keys: str | tuple[str, ...],
        name: str,
        *args: Any,
        extra: tuple[str, ...] = (),
        convert: Callable[[Any], Any] | None = None,
    ) -> None:
        self.s.read(obj, keys, self.at(name, *extra), name, self.handle, *args, convert=convert)

    def collect(self) -> dict:
        try:
            self.handle = self.s.call(
                self.at("nvmlDeviceGetHandleByIndex"), "nvmlDeviceGetHandleByIndex", self.index
            )
        except _Unavailable as why:  # e.g. GPU is lost: keep the record, every field says why
            self.s.note(self.gpu, GPU_KEYS[1:], why)
            return self.gpu
        self._identity()
        self._temperatures()
        self._ecc()
        self._memory_health()
        self._clocks_and_power()
        self._pcie()
        self._nvlink()
        self.read(
            self.gpu,
            "processes",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            convert=lambda infos: [_process(info) for info in infos],
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
        except _Unavailable as why:
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
        ecc: dict[str, Any] = {}
        for counter, counter_type in _COUNTERS.items():
            counts: dict[str, Any] = {}
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
        pages: dict[str, Any] = {}
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

    def _pcie(self) -> None:
        pcie: dict[str, Any] = {}
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
        links: list[dict] = []
        for link in range(getattr(self.s.nv, "NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_NVLINKS)):
            label = self.at("nvmlDeviceGetNvLinkState", f"link={link}")
            try:
                state = self.s.call(label, "nvmlDeviceGetNvLinkState", self.handle, link)
            except _Unavailable as why:
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

    def _recovery_action(self) -> None:
        """Field 230 reports errors per value in nvmlReturn; the call itself still succeeds."""
        field = getattr(self.s.nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", RECOVERY_ACTION_FIELD)
        label = self.at("nvmlDeviceGetFieldValues", f"field={field}")
        try:
            value = self.s.call(label, "nvmlDeviceGetFieldValues", self.handle, [field])[0]
        except _Unavailable as why:
            self.s.note(self.gpu, "recovery_action", why)
            return
        member = _VALUE_MEMBERS.get(value.valueType)
        if value.nvmlReturn == NVML_SUCCESS and member:
            self.gpu["recovery_action"] = int(getattr(value.value, member))
        elif value.nvmlReturn == NVML_ERROR_NOT_SUPPORTED:
            self.s.note(
                self.gpu,
                "recovery_action",
                _Unavailable("not_supported", label, "Not Supported (drivers before r570 lack it)"),
            )
        else:
            error = type(self.s.nv.NVMLError(value.nvmlReturn)).__name__
            self.s.note(
                self.gpu,
                "recovery_action",
                _Unavailable(
                    "error",
                    label,
                    f"nvmlReturn={value.nvmlReturn} ({error}), valueType={value.valueType}",
                    value.nvmlReturn,
                ),
            )


def _driver(session: _Session) -> dict:
    driver: dict[str, Any] = {
        "loaded": True,
        "version": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "unavailable": {},
    }
    for key, name, convert in (
        ("version", "nvmlSystemGetDriverVersion", _text),
        ("cuda_driver_version", "nvmlSystemGetCudaDriverVersion", _cuda_version),
        ("nvml_version", "nvmlSystemGetNVMLVersion", _text),
    ):
        session.read(driver, key, name, name, convert=convert)
    return driver


# The GPU records of the last successful collect(), for sub-probes that follow up on what the
# NVML pass saw (memory reclaim) without a second pass over a clean node.
last_gpus: list[dict] | None = None


def open_session(call_timeout_s: float, errors: list[dict]) -> _Session | None:
    """NVML initialised behind a call worker, or None with the reason appended to `errors`."""
    try:
        import pynvml
    except Exception as exc:  # not installed, or broken: either way use nvidia-smi
        errors.append(
            {"probe": "nvml", "call": "import pynvml", "error": f"{type(exc).__name__}: {exc}"}
        )
        return None
    worker = _Worker(call_timeout_s)
    session = _Session(pynvml, worker, errors)
    try:
        session.call("nvmlInit", "nvmlInit")
    except _Unavailable as why:  # no library, driver not loaded, init failed or hung
        errors.append({"probe": "nvml", "call": why.call, "error": why.error})
        worker.close()
        return None
    return session


def close_session(session: _Session) -> None:
    """nvmlShutdown, then let the worker thread end."""
    try:
        session.call("nvmlShutdown", "nvmlShutdown")
    except _Unavailable as why:
        session.record(why)
    session.worker.close()


def collect(call_timeout_s: float, errors: list[dict]) -> dict | None:
    """The driver, gpu_count and gpus parts of the facts document, read over NVML.

    None (with the reason appended to `errors`) when NVML cannot be used at all, so the caller
    can fall back to nvidia-smi. Each NVML call may take at most call_timeout_s.
    """
    global last_gpus
    last_gpus = None
    session = open_session(call_timeout_s, errors)
    if session is None:
        return None
    facts = None
    try:
        count = session.call("nvmlDeviceGetCount", "nvmlDeviceGetCount")
    except _Unavailable as why:  # without the GPU count NVML is of no use; nvidia-smi may do
        errors.append({"probe": "nvml", "call": why.call, "error": why.error})
    else:
        facts = {
            "driver": _driver(session),
            "gpu_count": count,
            "gpus": [_GpuReader(session, index).collect() for index in range(count)],
        }
        last_gpus = facts["gpus"]
    close_session(session)
    return facts
