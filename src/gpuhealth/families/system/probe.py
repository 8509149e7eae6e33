"""The `system` section: NUMA layout, CPUs, memory, disk space, memlock, modules and services.

What a GPU job needs from the host around the GPUs. /proc and /sys are read under the root
prefix; limits, free space of paths and commands (`numactl`, `systemctl`) are those of the
probe process itself, which runs the way a job launched over the same ssh or Slurm path does.
Node side: Python 3.6 and the standard library.
"""

import errno
import os
import re
import resource
import shutil
import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from gpuhealth.facts import Unavailable, why
from gpuhealth.families.system import parse_numactl, parse_proc, schema
from gpuhealth.parsing import ParseError
from gpuhealth.probe import command, node
from gpuhealth.schema import written

if TYPE_CHECKING:
    from gpuhealth.probe.main import Context

SECTIONS = written(schema.SECTIONS)
# Queried on every node, whatever the profile says, so saved facts can be re-judged later.
UNITS = ("nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm", "gpud")

Why = Optional[Unavailable]
Reading = Tuple[Any, Why]
# What the machine is, whatever its host name (the run store follows a node's history by it):
# the DMI system serial, system UUID and board serial (readable by root only on most kernels),
# then the OS's machine id, which re-imaging changes. The controller picks among them
# (families/system/metrics.node_ids drops vendors' placeholders).
MACHINE_IDS = (
    ("product_serial", "/sys/class/dmi/id/product_serial"),
    ("product_uuid", "/sys/class/dmi/id/product_uuid"),
    ("board_serial", "/sys/class/dmi/id/board_serial"),
    ("machine_id", "/etc/machine-id"),
)
MAX_ID = 64  # the length facts documents allow an identity (the run store's columns)


def numa_nodes(root: str) -> Reading:
    """The kernel's NUMA nodes with their CPUs and memory, or None and why."""
    base = node.under(root, "/sys/devices/system/node")
    try:
        entries = os.listdir(base)
    except OSError:
        return None, why("not_supported", "no /sys/devices/system/node (kernel built without NUMA)")
    nodes = []
    numbered = sorted(int(e[4:]) for e in entries if re.match(r"node\d{1,6}$", e))
    for number in numbered:
        folder = f"/sys/devices/system/node/node{number}"
        try:
            cpus = parse_proc.cpulist(node.read_text(root, folder + "/cpulist") or "")
            mem = parse_proc.meminfo(node.read_text(root, folder + "/meminfo") or "")
        except ParseError as exc:
            return None, why("error", f"{folder}: {exc}")
        nodes.append(
            {
                "node": number,
                "cpus": parse_proc.format_cpulist(cpus),
                "cpu_count": len(cpus),
                "memory_total_kb": mem.get("MemTotal"),
            }
        )
    return nodes, None


def gpu_numa_nodes(root: str) -> Optional[Dict[str, Optional[int]]]:
    """Each NVIDIA GPU's NUMA node from sysfs, keyed by NVML bus id; -1 means "none given"."""
    gpus = node.nvidia_pci_gpus(root)
    if gpus is None:
        return None
    result: Dict[str, Optional[int]] = {}
    for bus_id in gpus:
        path = f"/sys/bus/pci/devices/{node.sysfs_name(bus_id)}/numa_node"
        text = (node.read_text(root, path) or "").strip()
        result[bus_id] = int(text) if re.match(r"-?\d{1,6}$", text) else None
    return result


def run_numactl(timeout_s: float) -> Dict[str, Any]:
    """`numactl --hardware`, parsed; a missing binary or a failure is recorded, not raised."""
    record: Dict[str, Any] = {
        "available": shutil.which("numactl") is not None,
        "rc": None,
        "error": None,
        "hardware": None,
    }
    if not record["available"]:
        record["error"] = "numactl: command not found"
        return record
    result = command.run(["numactl", "--hardware"], timeout_s)
    record["rc"] = result.rc
    failure = result.failure()
    if failure:
        record["error"] = failure[:500]
        return record
    try:
        record["hardware"] = parse_numactl.parse_hardware(result.stdout)
    except ParseError as exc:
        record["error"] = f"unparsable output: {exc}"
    return record


def service_states(units: Tuple[str, ...], timeout_s: float) -> Reading:
    """`systemctl is-active` of each unit (active, inactive, failed, ...), or None and why."""
    result = command.run(["systemctl", "is-active"] + list(units), timeout_s)
    if result.timed_out:
        return None, why("timeout", result.error or "systemctl timed out")
    if result.error:
        return None, why("not_supported", f"systemctl not available: {result.error}")
    states = result.stdout.split()
    if len(states) == len(units):
        return dict(zip(units, states)), None
    text = result.stderr.strip() or result.stdout.strip() or f"exit {result.rc}"
    detail = " ".join(text.split())
    if not result.stdout.strip():
        # No systemd as PID 1 (containers): systemctl exists but cannot reach a manager.
        return None, why("not_supported", f"systemctl not available: {detail}")
    return None, why("error", f"systemctl is-active: {detail}")


def _memlock_kb(value: int) -> Union[int, str]:
    return "unlimited" if value == resource.RLIM_INFINITY else value // 1024


def _statvfs(full: str, timeout_s: float) -> Any:
    """os.statvfs in a daemon thread: a dead network mount blocks it in the kernel for good."""
    answer: List[Any] = []
    worker = threading.Thread(target=lambda: answer.append(_try_statvfs(full)), daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not answer:
        raise TimeoutError(f"statvfs did not return within {timeout_s:g} s (hung mount?)")
    if isinstance(answer[0], OSError):
        raise answer[0]
    return answer[0]


def _try_statvfs(full: str) -> Any:
    try:
        return os.statvfs(full)
    except OSError as exc:
        return exc


def disk_free(root: str, path: str, timeout_s: float) -> Dict[str, Any]:
    """Free (for non-root users, like df's Avail) and total bytes of the filesystem at path."""
    record: Dict[str, Any] = {"path": path, "total_bytes": None, "free_bytes": None}
    try:
        st = _statvfs(node.under(root, path), timeout_s)
    except TimeoutError as exc:
        reason = why("timeout", f"{path}: {exc}")
        record["unavailable"] = {"total_bytes": reason, "free_bytes": reason}
        return record
    except OSError as exc:
        reason = why("error", f"{path}: {exc.strerror or exc}")
        record["unavailable"] = {"total_bytes": reason, "free_bytes": reason}
        return record
    record["total_bytes"] = st.f_blocks * st.f_frsize
    record["free_bytes"] = st.f_bavail * st.f_frsize
    return record


def _cpu_count(root: str, name: str) -> Reading:
    path = f"/sys/devices/system/cpu/{name}"
    text = node.read_text(root, path)
    if text is None:
        return None, why("error", f"cannot read {path}")
    try:
        return len(parse_proc.cpulist(text)), None
    except ParseError as exc:
        return None, why("error", str(exc))


def memory(root: str) -> Tuple[Dict[str, Optional[int]], Dict[str, Unavailable]]:
    """MemTotal and MemAvailable from /proc/meminfo, in kB, and why either is missing."""
    keys = {"memory_total_kb": "MemTotal", "memory_available_kb": "MemAvailable"}
    text = node.read_text(root, "/proc/meminfo")
    problem: Why = None
    fields: Dict[str, int] = {}
    if text is None:
        problem = why("error", "cannot read /proc/meminfo")
    else:
        try:
            fields = parse_proc.meminfo(text)
        except ParseError as exc:
            problem = why("error", str(exc))
    values = {key: fields.get(field) for key, field in keys.items()}
    missing = {
        key: problem or why("not_supported", f"no {keys[key]} in /proc/meminfo")
        for key, value in values.items()
        if value is None
    }
    return values, missing


def kernel_modules(root: str) -> Reading:
    """Names of the modules in state Live, from /proc/modules."""
    text = node.read_text(root, "/proc/modules")
    if text is None:
        return None, why(
            "not_supported",
            "no /proc/modules (kernel without loadable modules, or a sandbox hiding them)",
        )
    try:
        return sorted(m["name"] for m in parse_proc.modules(text) if m["state"] == "Live"), None
    except ParseError as exc:
        return None, why("error", str(exc))


def machine_ids(root: str) -> Dict[str, Any]:
    """The machine's identities (MACHINE_IDS) as read, each null with why where it cannot be:
    no DMI (not_supported), root only (not_supported, "permission denied"), empty or too long."""
    found: Dict[str, Any] = {}
    unavailable: Dict[str, Unavailable] = {}
    for key, path in MACHINE_IDS:
        found[key] = None
        try:
            with open(node.under(root, path), encoding="utf-8", errors="replace") as f:
                text = f.read(4 * MAX_ID).strip()
        except OSError as exc:
            kind = "not_supported" if exc.errno in (errno.ENOENT, errno.EACCES) else "error"
            unavailable[key] = why(kind, f"{path}: {exc.strerror or exc}")
            continue
        if not text:
            unavailable[key] = why("not_supported", f"{path} is empty")
        elif len(text) > MAX_ID or not text.isprintable():
            unavailable[key] = why("error", f"{path}: not an identity ({len(text)} characters)")
        else:
            found[key] = text
    found["unavailable"] = unavailable
    return found


def collect(ctx: "Context") -> Dict[str, Any]:
    """The `system` section of the facts document (see docs/facts-schema.md)."""
    root = ctx.root
    timeout_s = float(ctx.setting("system_command_timeout_s"))
    out: Dict[str, Any] = {}
    unavailable: Dict[str, Unavailable] = {}

    def put(key: str, reading: Reading) -> None:
        out[key] = reading[0]
        if reading[1] is not None:
            unavailable[key] = reading[1]

    put("numa_nodes", numa_nodes(root))
    gpus = gpu_numa_nodes(root)
    put(
        "gpu_numa_nodes",
        (gpus, why("error", "cannot list /sys/bus/pci/devices") if gpus is None else None),
    )
    out["numactl"] = run_numactl(timeout_s)
    if out["numactl"]["error"] and out["numactl"]["available"]:
        ctx.error("system", out["numactl"]["error"], "numactl --hardware")
    put("cpus_online", _cpu_count(root, "online"))
    put("cpus_present", _cpu_count(root, "present"))
    out["cpus_usable"] = len(os.sched_getaffinity(0))
    values, missing = memory(root)
    out.update(values)
    unavailable.update(missing)
    scratch = [str(p) for p in ctx.setting("scratch_paths") or [] if str(p) != "/"]
    out["disks"] = [disk_free(root, path, timeout_s) for path in ["/"] + scratch]
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    out["memlock_kb"] = {"soft": _memlock_kb(soft), "hard": _memlock_kb(hard)}
    put("kernel_modules", kernel_modules(root))
    put("services", service_states(UNITS, timeout_s))
    out["machine"] = machine_ids(root)
    reason = unavailable.get("services")
    if reason and reason["kind"] != "not_supported":
        ctx.error("system", reason["detail"], "systemctl is-active")
    out["unavailable"] = unavailable
    return {"system": out}
