"""GPU faults the NVIDIA driver reports in the kernel log without an Xid line: the table.

A GPU can fall off the bus at driver load, or its GSP firmware stop answering, with no
`NVRM: Xid` line at all; a log judged by its Xids alone then passes. Each entry below is one
such fault: its `name` (the facts' `fault`), the `pattern` searched in a kernel message, the
verdict, what it means, the action code (gpuhealth.results.Action) and advice, and where the
line's form comes from. The checks judge by this table; the parser recognises by it.

It is data in a Python module, not YAML beside xids.yml, because the probe ships only Python
modules to the nodes (stdlib only, Python 3.6): the node must recognise these lines itself.

Stdlib only: shipped to the nodes with the probe.
"""

import re
from typing import Any, Dict, List, Optional, Tuple

_OGKM = "https://github.com/NVIDIA/open-gpu-kernel-modules"
_RESET_ADVICE = (
    "drain the node and reset the GPU (nvidia-smi -r -i INDEX) or reboot; if it recurs, update "
    "the driver, then have the GPU inspected (RMA)"
)
_OFF_BUS_ADVICE = (
    "drain and power-cycle the node; reseat the GPU and check its power and PCIe slot; RMA if "
    "it recurs"
)

FAULTS: Tuple[Dict[str, str], ...] = (
    {
        "name": "fallen_off_bus",
        "pattern": r"fallen off the bus",
        "verdict": "FAIL",
        "meaning": "GPU has fallen off the bus",
        "action": "REBOOT_NODE",
        "advice": _OFF_BUS_ADVICE,
        "source": "NVIDIA/NVSentinel#155 (no Xid line, at driver load); "
        + _OGKM
        + "/issues/507; NVIDIA driver README, known issues (with Xid 79)",
    },
    {
        "name": "gpu_lost",
        "pattern": r"NV_ERR_GPU_IS_LOST|GPU lost from the bus",
        "verdict": "FAIL",
        "meaning": "the driver lost the GPU (NV_ERR_GPU_IS_LOST)",
        "action": "REBOOT_NODE",
        "advice": _OFF_BUS_ADVICE,
        "source": _OGKM + " nvstatuscodes: NV_ERR_GPU_IS_LOST 'GPU lost from the bus'",
    },
    {
        "name": "gsp_heartbeat",
        "pattern": r"[Hh]eartbeat timed out",
        "verdict": "FAIL",
        "meaning": "GSP firmware heartbeat timed out",
        "action": "RESET_GPU",
        "advice": _RESET_ADVICE,
        "source": _OGKM + "/issues/1230 (_kgspIsHeartbeatTimedOut: Heartbeat timed out)",
    },
    {
        "name": "gsp_timeout",
        "pattern": (
            r"GSP Timeout|[Tt]imeout waiting for RPC from (?:GPU\d{1,3} )?GSP"
            r"|waiting for RPC response from GPU\d{1,3} GSP"
        ),
        "verdict": "FAIL",
        "meaning": "GSP RPC timeout",
        "action": "RESET_GPU",
        "advice": _RESET_ADVICE,
        "source": _OGKM
        + "/issues/1230 (_kgspLogRpcTimeout: *** GSP Timeout ***); "
        + _OGKM
        + "/issues/446 (Timeout waiting for RPC from GSP!)",
    },
    {
        "name": "memory_subsystem",
        "pattern": r"Memory Subsystem Error detected",
        "verdict": "FAIL",
        "meaning": "GPU memory subsystem error",
        "action": "RESET_GPU",
        "advice": _RESET_ADVICE,
        "source": _OGKM + "/issues/1230 (kgmmuCheckMemSubsysError_IMPL)",
    },
    {
        "name": "rm_init_failed",
        "pattern": r"RmInitAdapter failed",
        "verdict": "FAIL",
        "meaning": "the driver could not initialise the GPU (RmInitAdapter failed)",
        "action": "REBOOT_NODE",
        "advice": (
            "drain and power-cycle the node; if it persists, check that the driver supports "
            "this GPU and the PCIe/BAR setup, then reseat or RMA the GPU"
        ),
        "source": _OGKM + "/issues/789; " + _OGKM + "/issues/1230; siderolabs/talos#6206",
    },
    {
        "name": "probe_failed",
        "pattern": (
            r"nvidia: probe of [0-9A-Fa-f:.]{1,20} failed with error"
            r"|NVIDIA probe routine failed for"
        ),
        "verdict": "FAIL",
        "meaning": "the nvidia driver's probe of the GPU failed",
        "action": "REBOOT_NODE",
        "advice": _OFF_BUS_ADVICE,
        "source": "NVIDIA/NVSentinel#155 (The NVIDIA probe routine failed for 1 device(s)); "
        "Linux driver core: '<driver>: probe of <device> failed with error <n>'",
    },
    {
        "name": "crash_dump",
        "pattern": r"GPU crash dump has been created",
        "verdict": "FAIL",
        "meaning": "the driver wrote a GPU crash dump (a fatal GPU error)",
        "action": "INSPECT",
        "advice": (
            "run nvidia-bug-report.sh as root before the driver is unloaded, read the errors "
            "logged before the dump, then reset the GPU or reboot"
        ),
        "source": _OGKM + " (NVRM: A GPU crash dump has been created. If possible, please run "
        "nvidia-bug-report.sh ...)",
    },
)

# One alternation, searched once per message; the group that matched names the fault.
_FAULT_RE = re.compile("|".join("(?P<{}>{})".format(f["name"], f["pattern"]) for f in FAULTS))
# A PCI address in a message: a 4-8 digit domain keeps times (10:01:02) out.
_BUS_RE = re.compile(
    r"(?<![0-9A-Fa-f:])(?:PCI:)?([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
    r"(?![0-9A-Fa-f])"
)
# The driver's own GPU number ("NVRM: GPU6 _kgspIsHeartbeatTimedOut"), not nvidia-smi's index.
_LABEL_RE = re.compile(r"\bGPU(\d{1,3})\b")
# "NVRM: The NVIDIA GPU 0000:b3:00.0" opens a report whose fault is on a later line.
_OPENER_RE = re.compile(r"NVRM: The NVIDIA GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f:.]{5,10})")


def find(message: str) -> Optional[str]:
    """The name of the fault a kernel message reports, or None."""
    match = _FAULT_RE.search(message)
    return match.lastgroup if match else None


def bus_in(message: str) -> Optional[str]:
    """The PCI address a message names (as printed), or None."""
    match = _BUS_RE.search(message)
    return match.group(1) if match else None


def label_in(message: str) -> Optional[str]:
    """The driver's GPU number a message names ("GPU6"), or None."""
    match = _LABEL_RE.search(message)
    return "GPU" + match.group(1) if match else None


def opener(message: str) -> Optional[str]:
    """The PCI address of a multi-line "The NVIDIA GPU <bus>" report's first line, or None."""
    match = _OPENER_RE.search(message)
    return match.group(1) if match else None


def attribute(events: List[Dict[str, Any]], labels: Dict[str, str]) -> None:
    """Give fault events that name only the driver's GPU number the bus id that number has
    elsewhere in the same log (an Xid 119 line names both), in place."""
    for event in events:
        if event["kind"] == "fault" and event["bus_id"] is None and event["gpu"] in labels:
            event["bus_id"] = labels[event["gpu"]]
