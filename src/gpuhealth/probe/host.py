"""The `system` section: NUMA layout, CPUs, memory, disk space, memlock, modules and services.

What a GPU job needs from the host around the GPUs. /proc and /sys are read under the root
prefix; limits, free space of paths and commands (`numactl`, `systemctl`) are those of the
probe process itself, which runs the way a job launched over the same ssh or Slurm path does.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import threading
from typing import Any

from gpuhealth.parsers import ParseError, numactl, proc
from gpuhealth.probe import command, system

COMMAND_TIMEOUT_S = 10.0
# Queried on every node, whatever the profile says, so saved facts can be re-judged later.
UNITS = ("nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm", "gpud")


def _unavailable(kind: str, detail: str) -> dict[str, str]:
    return {"kind": kind, "detail": detail[:500]}


def numa_nodes(root: str) -> tuple[list[dict[str, Any]] | None, dict[str, str] | None]:
    """The kernel's NUMA nodes with their CPUs and memory, or None and why."""
    base = os.path.join(root, "sys/devices/system/node")
    try:
        entries = os.listdir(base)
    except OSError:
        return None, _unavailable(
            "not_supported", "no /sys/devices/system/node (kernel built without NUMA)"
        )
    nodes = []
    numbered = sorted(int(e[4:]) for e in entries if re.fullmatch(r"node\d+", e))
    for number in numbered:
        folder = f"/sys/devices/system/node/node{number}"
        try:
            cpus = proc.cpulist(system.read_text(root, f"{folder}/cpulist") or "")
            mem = proc.meminfo(system.read_text(root, f"{folder}/meminfo") or "")
        except ParseError as exc:
            return None, _unavailable("error", f"{folder}: {exc}")
        nodes.append(
            {
                "node": number,
                "cpus": proc.format_cpulist(cpus),
                "cpu_count": len(cpus),
                "memory_total_kb": mem.get("MemTotal"),
            }
        )
    return nodes, None


def gpu_numa_nodes(root: str) -> dict[str, int | None] | None:
    """Each NVIDIA GPU's NUMA node from sysfs, keyed by NVML bus id; -1 means "none given"."""
    gpus = system.nvidia_pci_gpus(root)
    if gpus is None:
        return None
    result: dict[str, int | None] = {}
    for bus_id in gpus:
        domain, rest = bus_id.split(":", 1)
        entry = f"{int(domain, 16):04x}:{rest.lower()}"
        text = (system.read_text(root, f"/sys/bus/pci/devices/{entry}/numa_node") or "").strip()
        result[bus_id] = int(text) if re.fullmatch(r"-?\d+", text) else None
    return result


def run_numactl() -> dict[str, Any]:
    """`numactl --hardware`, parsed; a missing binary or a failure is recorded, not raised."""
    record: dict[str, Any] = {
        "available": shutil.which("numactl") is not None,
        "rc": None,
        "error": None,
        "hardware": None,
    }
    if not record["available"]:
        record["error"] = "numactl: command not found"
        return record
    result = command.run(["numactl", "--hardware"], COMMAND_TIMEOUT_S)
    record["rc"] = result.rc
    if result.error or result.rc != 0:
        text = result.error or f"exit {result.rc}: {result.stderr.strip() or result.stdout.strip()}"
        record["error"] = text[:500]
        return record
    try:
        record["hardware"] = numactl.parse_hardware(result.stdout)
    except ParseError as exc:
        record["error"] = f"unparsable output: {exc}"
    return record


def service_states(units: tuple[str, ...]) -> tuple[dict[str, str] | None, dict[str, str] | None]:
    """`systemctl is-active` of each unit (active, inactive, failed, ...), or None and why."""
    result = command.run(["systemctl", "is-active", *units], COMMAND_TIMEOUT_S)
    if result.timed_out:
        return None, _unavailable("timeout", result.error or "systemctl timed out")
    if result.error:
        return None, _unavailable("not_supported", f"systemctl not available: {result.error}")
    states = result.stdout.split()
    if len(states) == len(units):
        return dict(zip(units, states, strict=True)), None
    why = " ".join((result.stderr.strip() or result.stdout.strip() or f"exit {result.rc}").split())
    if not result.stdout.strip():
        # No systemd as PID 1 (containers): systemctl exists but cannot reach a manager.
        return None, _unavailable("not_supported", f"systemctl not available: {why}")
    return None, _unavailable("error", f"systemctl is-active: {why}")


def _memlock_kb(value: int) -> int | str:
    return "unlimited" if value == resource.RLIM_INFINITY else value // 1024


def _statvfs(full: str, timeout_s: float) -> os.statvfs_result:
    """os.statvfs in a daemon thread: a dead network mount blocks it in the kernel for good."""
    answer: list[Any] = []
    worker = threading.Thread(target=lambda: answer.append(_try_statvfs(full)), daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not answer:
        raise TimeoutError(f"statvfs did not return within {timeout_s:g} s (hung mount?)")
    if isinstance(answer[0], OSError):
        raise answer[0]
    return answer[0]


def _try_statvfs(full: str) -> os.statvfs_result | OSError:
    try:
        return os.statvfs(full)
    except OSError as exc:
        return exc


def disk_free(root: str, path: str, timeout_s: float = COMMAND_TIMEOUT_S) -> dict[str, Any]:
    """Free (for non-root users, like df's Avail) and total bytes of the filesystem at path."""
    record: dict[str, Any] = {"path": path, "total_bytes": None, "free_bytes": None}
    try:
        st = _statvfs(os.path.join(root, path.lstrip("/")), timeout_s)
    except TimeoutError as exc:
        why = _unavailable("timeout", f"{path}: {exc}")
        record["unavailable"] = {"total_bytes": why, "free_bytes": why}
        return record
    except OSError as exc:
        why = _unavailable("error", f"{path}: {exc.strerror or exc}")
        record["unavailable"] = {"total_bytes": why, "free_bytes": why}
        return record
    record["total_bytes"] = st.f_blocks * st.f_frsize
    record["free_bytes"] = st.f_bavail * st.f_frsize
    return record


def _cpu_count(root: str, name: str) -> tuple[int | None, dict[str, str] | None]:
    path = f"/sys/devices/system/cpu/{name}"
    text = system.read_text(root, path)
    if text is None:
        return None, _unavailable("error", f"cannot read {path}")
    try:
        return len(proc.cpulist(text)), None
    except ParseError as exc:
        return None, _unavailable("error", str(exc))


def memory(root: str) -> tuple[dict[str, int | None], dict[str, dict[str, str]]]:
    """MemTotal and MemAvailable from /proc/meminfo, in kB, and why either is missing."""
    keys = {"memory_total_kb": "MemTotal", "memory_available_kb": "MemAvailable"}
    text = system.read_text(root, "/proc/meminfo")
    try:
        fields = proc.meminfo(text) if text is not None else {}
        problem = None if text is not None else _unavailable("error", "cannot read /proc/meminfo")
    except ParseError as exc:
        fields, problem = {}, _unavailable("error", str(exc))
    values = {key: fields.get(field) for key, field in keys.items()}
    missing = {
        key: problem or _unavailable("not_supported", f"no {keys[key]} in /proc/meminfo")
        for key, value in values.items()
        if value is None
    }
    return values, missing


def kernel_modules(root: str) -> tuple[list[str] | None, dict[str, str] | None]:
    """Names of the modules in state Live, from /proc/modules."""
    text = system.read_text(root, "/proc/modules")
    if text is None:
        return None, _unavailable(
            "not_supported",
            "no /proc/modules (kernel without loadable modules, or a sandbox hiding them)",
        )
    try:
        return sorted(m["name"] for m in proc.modules(text) if m["state"] == "Live"), None
    except ParseError as exc:
        return None, _unavailable("error", str(exc))


def collect(config: dict[str, Any], errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The `system` section of the facts document (see docs/facts-schema.md)."""
    root = config["root"]
    expect = config.get("expect") or {}
    out: dict[str, Any] = {}
    unavailable: dict[str, dict[str, str]] = {}

    def put(key: str, value: Any, why: dict[str, str] | None) -> None:
        out[key] = value
        if why is not None:
            unavailable[key] = why

    put("numa_nodes", *numa_nodes(root))
    gpus = gpu_numa_nodes(root)
    put(
        "gpu_numa_nodes",
        gpus,
        _unavailable("error", "cannot list /sys/bus/pci/devices") if gpus is None else None,
    )
    out["numactl"] = run_numactl()
    if out["numactl"]["error"] and out["numactl"]["available"]:
        errors.append(
            {"probe": "system", "call": "numactl --hardware", "error": out["numactl"]["error"]}
        )
    put("cpus_online", *_cpu_count(root, "online"))
    put("cpus_present", *_cpu_count(root, "present"))
    out["cpus_usable"] = len(os.sched_getaffinity(0))
    values, missing = memory(root)
    out.update(values)
    unavailable.update(missing)
    scratch = [str(p) for p in expect.get("scratch_paths") or [] if str(p) != "/"]
    out["disks"] = [disk_free(root, path) for path in ["/", *scratch]]
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    out["memlock_kb"] = {"soft": _memlock_kb(soft), "hard": _memlock_kb(hard)}
    put("kernel_modules", *kernel_modules(root))
    put("services", *service_states(UNITS))
    why = unavailable.get("services")
    if why and why["kind"] != "not_supported":
        errors.append({"probe": "system", "call": "systemctl is-active", "error": why["detail"]})
    out["unavailable"] = unavailable
    return out
