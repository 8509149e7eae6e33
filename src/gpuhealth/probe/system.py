"""Host identity and driver-independent GPU discovery from /proc and /sys.

Every path is read under a root prefix so tests can point the probe at a copied tree.
"""

from __future__ import annotations

import os
import platform
import re
import socket
from typing import Any

NVIDIA_VENDOR = "0x10de"
# PCI class codes of VGA (0x0300) and 3D (0x0302) controllers: the GPUs, not NVSwitches/bridges.
GPU_CLASSES = ("0x0300", "0x0302")


def read_text(root: str, path: str) -> str | None:
    """Contents of root+path, or None when it does not exist or cannot be read."""
    try:
        with open(os.path.join(root, path.lstrip("/")), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def host_info(root: str) -> dict[str, Any]:
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
    }


def nvidia_pci_gpus(root: str) -> list[str] | None:
    """Bus ids of NVIDIA GPUs on the PCI bus, formatted like NVML's ("00000000:19:00.0")."""
    base = os.path.join(root, "sys/bus/pci/devices")
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return None
    found = []
    for entry in entries:
        vendor = (read_text(root, f"/sys/bus/pci/devices/{entry}/vendor") or "").strip()
        klass = (read_text(root, f"/sys/bus/pci/devices/{entry}/class") or "").strip()
        if vendor == NVIDIA_VENDOR and klass[:6] in GPU_CLASSES:
            domain, rest = entry.split(":", 1)
            found.append(f"{int(domain, 16):08X}:{rest.upper()}")
    return found


def proc_driver_version(root: str) -> str | None:
    """The loaded kernel module's version from /proc/driver/nvidia/version, if any."""
    text = read_text(root, "/proc/driver/nvidia/version")
    if text is None:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", text)
    return match.group(1) if match else ""
