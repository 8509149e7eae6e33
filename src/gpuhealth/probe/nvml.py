"""NVML sessions for the probe: nvidia-ml-py behind a worker thread with a per-call timeout.

A wedged driver can block an NVML call forever, so every call runs on one daemon worker thread
and the caller waits at most `call_timeout_s`. After one call has hung, NVML counts as
unresponsive: later calls fail at once with kind `timeout`, so the probe still finishes in about
one timeout. The hung thread is left behind, never joined.

Node side: Python 3.6, the standard library and, when importable, `pynvml` (nvidia-ml-py).
"""

import functools
import queue
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from gpuhealth.facts import mark_unavailable

MIB = 1024 * 1024

# NVML return codes, spelled out so any nvidia-ml-py release works (older ones lack names).
NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15  # "fallen off the bus or has otherwise become inaccessible"
_NOT_SUPPORTED_CODES = (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND)

Keys = Union[str, Tuple[str, ...]]


class Unavailable(Exception):
    """Why a call gave no value: a facts `unavailable` kind, and whether it belongs in `errors`."""

    def __init__(
        self,
        kind: str,
        call: str,
        error: str,
        code: Optional[int] = None,
        record: Optional[bool] = None,
    ) -> None:
        self.kind, self.call, self.error, self.code = kind, call, error, code
        self.detail = f"{call}: {error}"
        super().__init__(self.detail)
        self.record = kind == "error" if record is None else record


class _Worker:
    """One daemon thread that runs NVML calls in order, so a hung call cannot hang the probe."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.hung: Optional[str] = None
        self._jobs: queue.Queue = queue.Queue()
        threading.Thread(target=self._serve, name="nvml-calls", daemon=True).start()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, done, outcome = job
            try:
                outcome.append((True, fn()))
            except Exception as exc:  # handed to the waiting caller
                outcome.append((False, exc))
            done.set()

    def run(self, label: str, fn: Callable[[], Any]) -> Any:
        """fn() on the worker, or Unavailable(timeout) once call_timeout_s has passed."""
        if self.hung:
            raise Unavailable("timeout", label, f"not called: NVML hung at {self.hung}")
        done = threading.Event()
        outcome: List[Tuple[bool, Any]] = []
        self._jobs.put((fn, done, outcome))
        if not done.wait(self.timeout_s):
            self.hung = label
            raise Unavailable(
                "timeout", label, f"timed out after {self.timeout_s:g} s", record=True
            )
        ok, value = outcome[0]
        if ok:
            return value
        raise value

    def close(self) -> None:
        """Let an idle worker thread end; a hung one stays blocked in the driver."""
        self._jobs.put(None)


class Session:
    """An initialised NVML: the pynvml module, the worker running its calls, the errors list."""

    def __init__(self, nv: Any, worker: _Worker, errors: List[Dict[str, Any]]) -> None:
        self.nv, self.worker, self.errors = nv, worker, errors
        # Every call NVML answered NVML_ERROR_GPU_IS_LOST, in order: a GPU's reader names the
        # GPU lost from those made while it read.
        self.lost: List[Unavailable] = []

    def call(self, label: str, name: str, *args: Any) -> Any:
        """pynvml.<name>(*args) on the worker; failures raise Unavailable with their kind.

        `label` names the call in details and errors, e.g. "nvmlDeviceGetSerial(gpu=2)".
        """
        fn = getattr(self.nv, name, None)
        if fn is None:
            raise Unavailable("not_supported", label, "not in the installed nvidia-ml-py")
        return self.worker.run(label, functools.partial(self._classified, label, fn, *args))

    def _classified(self, label: str, fn: Callable[..., Any], *args: Any) -> Any:
        # Runs on the worker: str() of an NVMLError may itself call into NVML.
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            kind = "not_supported" if exc.value in _NOT_SUPPORTED_CODES else "error"
            raise Unavailable(kind, label, str(exc), exc.value) from None
        except Exception as exc:
            raise Unavailable("error", label, f"{type(exc).__name__}: {exc}") from None

    def record(self, why: Unavailable) -> None:
        """Append a real failure (an NVML error, the call that hung) to the probe's errors;
        keep a GPU-is-lost answer in `lost` as well."""
        if why.record:
            self.errors.append({"probe": "nvml", "call": why.call, "error": why.error})
        if why.code == NVML_ERROR_GPU_IS_LOST:
            self.lost.append(why)

    def note(self, obj: Dict[str, Any], keys: Keys, why: Unavailable) -> None:
        """Null obj's keys with the reason, and record the failure once."""
        for key in (keys,) if isinstance(keys, str) else keys:
            mark_unavailable(obj, key, why.kind, why.detail)
        self.record(why)

    def read(
        self,
        obj: Dict[str, Any],
        keys: Keys,
        label: str,
        name: str,
        *args: Any,
        convert: Optional[Callable[[Any], Any]] = None,
    ) -> None:
        """obj[keys] = convert(pynvml.<name>(*args)); a tuple of keys takes a tuple of values.
        A value `convert` refuses (ValueError) is an error for those keys, never a guess."""
        try:
            value = self.call(label, name, *args)
            value = convert(value) if convert else value
        except Unavailable as why:
            self.note(obj, keys, why)
            return
        except ValueError as exc:
            self.note(obj, keys, Unavailable("error", label, f"unusable value: {exc}"))
            return
        if isinstance(keys, str):
            obj[keys] = value
        else:
            values = tuple(value)
            if len(values) != len(keys):
                raise ValueError(f"{label} gave {len(values)} values for {keys}")
            obj.update(zip(keys, values))


def open_session(call_timeout_s: float, errors: List[Dict[str, Any]]) -> Optional[Session]:
    """NVML initialised behind a call worker, or None with the reason appended to `errors`."""
    try:
        import pynvml
    except Exception as exc:  # not installed, or broken: either way use nvidia-smi
        errors.append(
            {
                "probe": "nvml",
                "call": "import pynvml",
                "error": f"{type(exc).__name__}: {exc}",
            }
        )
        return None
    worker = _Worker(call_timeout_s)
    session = Session(pynvml, worker, errors)
    try:
        session.call("nvmlInit", "nvmlInit")
    except Unavailable as why:  # no library, driver not loaded, init failed or hung
        errors.append({"probe": "nvml", "call": why.call, "error": why.error})
        worker.close()
        return None
    return session


def close_session(session: Session) -> None:
    """nvmlShutdown, then let the worker thread end."""
    try:
        session.call("nvmlShutdown", "nvmlShutdown")
    except Unavailable as why:
        session.record(why)
    session.worker.close()


def process_record(info: Any) -> Dict[str, Any]:
    """A compute process from NVML; its name comes from /proc, which NVML does not give."""
    entry: Dict[str, Any] = {"pid": info.pid, "name": None, "used_memory_mib": None}
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
