"""Host identity and driver-independent GPU discovery from /proc and /sys.

Every path is read under a root prefix so tests can point the probe at a copied tree.
Node side: Python 3.6 and the standard library.
"""

import os
import platform
import re
import socket
from typing import Any, Dict, List, Optional

NVIDIA_VENDOR = "0x10de"
# PCI class codes of VGA (0x0300) and 3D (0x0302) controllers: the GPUs, not NVSwitches/bridges.
GPU_CLASSES = ("0x0300", "0x0302")


def under(root: str, path: str) -> str:
    """`path` of the node's filesystem as seen from here (mounted under `root`)."""
    return os.path.join(root, path.lstrip("/"))


def read_text(root: str, path: str) -> Optional[str]:
    """Contents of root+path, or None when it does not exist or cannot be read."""
    try:
        with open(under(root, path), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def host_info(root: str) -> Dict[str, Any]:
    """Who the node is: enough to label reports and explain version-dependent behaviour."""
    os_name = None
    release = read_text(root, "/etc/os-release") or ""
    match = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', release, re.M)
    if match:
        os_name = match.group(1)
    return {
        "hostname": socket.gethostname(),
        "kernel": platform.release(),
        "arch": platform.machine(),
        "os": os_name,
        "python": platform.python_version(),
    }


def pci_bus_id(entry: str) -> str:
    """A sysfs PCI device name ("0000:19:00.0") as NVML spells it ("00000000:19:00.0")."""
    domain, rest = entry.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def sysfs_name(bus_id: str) -> str:
    """NVML's bus id ("00000000:19:00.0") as the sysfs device name ("0000:19:00.0")."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def nvidia_pci_gpus(root: str) -> Optional[List[str]]:
    """Bus ids of NVIDIA GPUs on the PCI bus, formatted like NVML's ("00000000:19:00.0")."""
    base = under(root, "/sys/bus/pci/devices")
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return None
    found = []
    for entry in entries:
        vendor = (read_text(root, f"/sys/bus/pci/devices/{entry}/vendor") or "").strip()
        klass = (read_text(root, f"/sys/bus/pci/devices/{entry}/class") or "").strip()
        if vendor == NVIDIA_VENDOR and klass[:6] in GPU_CLASSES and ":" in entry:
            try:
                found.append(pci_bus_id(entry))
            except ValueError:
                continue
    return found


def nvidia_device_nodes(root: str) -> Optional[int]:
    """How many GPU device nodes (/dev/nvidia0, /dev/nvidia1...) this process sees: all of the
    node's on a host, a container's or a job's share of them inside one (None: /dev unread)."""
    try:
        names = os.listdir(under(root, "/dev"))
    except OSError:
        return None
    return sum(1 for name in names if re.match(r"nvidia[0-9]{1,4}$", name))


def proc_driver_version(root: str) -> Optional[str]:
    """The loaded kernel module's version from /proc/driver/nvidia/version, if any ("" when
    the file exists but names no version)."""
    text = read_text(root, "/proc/driver/nvidia/version")
    if text is None:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else ""
