"""The `fabric` section: RDMA devices from /sys/class/infiniband, the PCI position of them and
of the GPUs (for GPU-to-NIC affinity), and `fi_info` on EFA hosts.

`fi_info` is run only where the host is expected to have EFA, because it is what NCCL's
aws-ofi-nccl plugin sees: a device in sysfs that libfabric cannot open is no use to a job.
Node side: Python 3.6 and the standard library.
"""

import os
import shutil
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from gpuhealth.facts import why
from gpuhealth.families.fabric import parse_fi_info, schema, sysfs
from gpuhealth.parsing import ParseError
from gpuhealth.probe import command, node
from gpuhealth.schema import written

if TYPE_CHECKING:
    from gpuhealth.probe.main import Context

SECTIONS = written(schema.SECTIONS)
CLASS_DIR = "/sys/class/infiniband"
PCI_DEVICES_DIR = "/sys/bus/pci/devices"
FI_INFO_ARGS = ("-p", "efa", "-t", "FI_EP_RDM")
# The EFA installer puts libfabric's tools here, which a non-interactive SSH PATH lacks.
FI_INFO_DIRS = ("/opt/amazon/efa/bin",)


def find_fi_info() -> Optional[str]:
    """fi_info on PATH, else where the EFA installer puts it."""
    found = shutil.which("fi_info")
    if found:
        return found
    for folder in FI_INFO_DIRS:
        path = os.path.join(folder, "fi_info")
        if os.access(path, os.X_OK):
            return path
    return None


def _fi_info_failed(status: str, error: str, rc: Optional[int] = None) -> Dict[str, Any]:
    return {
        "status": status,
        "rc": rc,
        "error": error,
        "getinfo_error": None,
        "domains": [],
        "provider_version": None,
        "libfabric_version": None,
        "entries": [],
    }


def run_fi_info(timeout_s: float) -> Dict[str, Any]:
    """`fi_info -p efa -t FI_EP_RDM`: the EFA RDM domains libfabric can open, and its version."""
    binary = find_fi_info()
    if binary is None:
        return _fi_info_failed(
            "not_installed", f"fi_info not found on PATH or in {', '.join(FI_INFO_DIRS)}"
        )
    result = command.run([binary, *FI_INFO_ARGS], timeout_s)
    if result.timed_out:
        return _fi_info_failed("timeout", result.error or "timed out")
    if result.error:
        return _fi_info_failed("error", result.error)
    # stderr first: libfabric warnings land before the blocks, where the parser skips text.
    try:
        parsed = parse_fi_info.parse(result.stderr + "\n" + result.stdout)
    except ParseError as exc:
        return _fi_info_failed("error", f"unparsable fi_info output: {exc}", result.rc)
    record = {"rc": result.rc, **parse_fi_info.summary(parsed)}
    if result.rc != 0 and record["status"] == "ok":
        detail = result.stderr.strip()[:300] or "no message"
        record.update(status="error", error=f"fi_info exited {result.rc}: {detail}")
    return record


def gpu_bus_ids(facts: Dict[str, Any]) -> List[str]:
    """The GPUs' bus ids, NVML's spelling: those the GPU probe reported, then any other NVIDIA
    GPU on the PCI bus (one NVML cannot see still has a place in the topology)."""
    found = [g.get("pci_bus_id") for g in facts.get("gpus") or [] if isinstance(g, dict)]
    found += (facts.get("pci") or {}).get("nvidia_gpus") or []
    return list(dict.fromkeys(b for b in found if isinstance(b, str) and b))


def collect(ctx: "Context") -> Dict[str, Any]:
    """The facts document's `fabric` section."""
    devices, problems = sysfs.read_devices(node.under(ctx.root, CLASS_DIR))
    for problem in problems:
        ctx.error("fabric", problem)
    gpu_pci = sysfs.gpu_positions(node.under(ctx.root, PCI_DEVICES_DIR), gpu_bus_ids(ctx.facts))
    section: Dict[str, Any] = {
        "devices": devices,
        "gpu_pci": gpu_pci,
        "fi_info": None,
        "unavailable": {},
    }
    fabric = ctx.setting("fabric")
    if fabric != "efa":
        detail = f"fi_info runs only where the fabric is efa (here {fabric!r})"
        section["unavailable"]["fi_info"] = why("absent", detail)
        return {"fabric": section}
    section["fi_info"] = run_fi_info(float(ctx.setting("fi_info_timeout_s")))
    if section["fi_info"]["status"] in ("timeout", "error"):
        ctx.error("fabric", section["fi_info"]["error"], "fi_info")
    return {"fabric": section}
