"""Saved fabric evidence for triage: `fi_info` output, copies of /sys/class/infiniband, `ibstat`
and `ibv_devinfo` output, and `nvidia-smi topo -m` (each GPU's distance to each NIC)."""

from __future__ import annotations

import os
import re
from typing import Any

from gpuhealth.facts import mark_unavailable, why
from gpuhealth.families.fabric import parse_fi_info, parse_ibstat, parse_topo, sysfs
from gpuhealth.families.gpu.schema import GPU_KEYS, new_driver, new_gpu
from gpuhealth.registry import Kind

_FI_INFO_HEAD = re.compile(r"^(provider: \S+\n[ \t]+fabric: |fi_getinfo: -\d+)", re.M)
# Where ibstat's and ibv_devinfo's outputs begin in a ticket (each device again), and topo -m's.
_IBSTAT_START = re.compile(r"^CA '[^'\s]{1,64}'[ \t]*\r?\n[ \t]+CA type:", re.M)
_IBV_START = re.compile(r"^hca_id:[ \t]*\S+[ \t]*\r?\n[ \t]+transport:", re.M)
_TOPO_START = re.compile(r"^[ \t]*GPU0\b[^\n]{0,8000}\bCPU Affinity", re.M)


def looks_like_fi_info(text: str) -> bool:
    """Saved `fi_info` output: a provider block, or the fi_getinfo error it prints instead."""
    return _FI_INFO_HEAD.search(text[:65536]) is not None


def from_fi_info_text(text: str) -> dict[str, Any]:
    """The `fabric` section a saved `fi_info` output gives: fi_info only, no sysfs devices."""
    record = {"rc": None, **parse_fi_info.summary(parse_fi_info.parse(text))}
    absent = why("absent", "fi_info output holds no sysfs device data")
    return {"fabric": {"devices": None, "fi_info": record, "unavailable": {"devices": absent}}}


def looks_like_class_dir(path: Any) -> bool:
    """A copy of /sys/class/infiniband: device folders that hold a `ports` folder."""
    try:
        return any(os.path.isdir(os.path.join(path, name, "ports")) for name in os.listdir(path))
    except OSError:
        return False


def from_class_dir(path: Any) -> dict[str, Any]:
    """The `fabric` section a copied /sys/class/infiniband gives: devices, no fi_info."""
    devices, problems = sysfs.read_devices(str(path))
    absent = why("absent", "a sysfs copy holds no fi_info output")
    return {
        "fabric": {"devices": devices, "fi_info": None, "unavailable": {"fi_info": absent}},
        "errors": [{"probe": "fabric", "error": problem} for problem in problems],
    }


def from_port_tool_text(text: str) -> dict[str, Any]:
    """The `fabric` section a pasted `ibstat` or `ibv_devinfo` gives: devices, no fi_info."""
    absent = why("absent", "ibstat/ibv_devinfo output holds no fi_info output")
    return {
        "fabric": {
            "devices": parse_ibstat.parse(text),
            "fi_info": None,
            "unavailable": {"fi_info": absent},
        }
    }


def from_topo_text(text: str) -> dict[str, Any]:
    """Facts from a pasted `nvidia-smi topo -m`: the GPU-to-NIC levels in the `fabric`
    section, and one GPU record per row that says nothing else (kind `absent`)."""
    matrix = parse_topo.parse(text)
    absent = ("absent", "not in nvidia-smi topo -m output")
    gpus = []
    for row in matrix["gpus"]:
        gpu = new_gpu(row["index"])
        for key in GPU_KEYS[1:]:
            mark_unavailable(gpu, key, *absent)
        gpus.append(gpu)
    driver = new_driver(True)  # nvidia-smi answered
    for key in ("version", "cuda_driver_version", "nvml_version"):
        mark_unavailable(driver, key, *absent)
    fabric: dict[str, Any] = {"devices": None, "gpu_pci": None, "fi_info": None}
    fabric["topo_matrix"] = matrix
    fabric["unavailable"] = {key: why(*absent) for key in ("devices", "gpu_pci", "fi_info")}
    return {"driver": driver, "gpu_count": None, "gpus": gpus, "fabric": fabric, "errors": []}


KINDS = (
    Kind("fi_info", looks_like_fi_info, from_fi_info_text, priority=20, starts=_FI_INFO_HEAD),
    Kind("/sys/class/infiniband copy", looks_like_class_dir, from_class_dir, directory=True),
    Kind(
        "nvidia-smi topo -m",
        parse_topo.looks_like,
        from_topo_text,
        priority=15,
        starts=_TOPO_START,
    ),
    Kind(
        "ibstat",
        parse_ibstat.looks_like_ibstat,
        from_port_tool_text,
        priority=21,
        starts=_IBSTAT_START,
    ),
    Kind(
        "ibv_devinfo",
        parse_ibstat.looks_like_ibv_devinfo,
        from_port_tool_text,
        priority=22,
        starts=_IBV_START,
    ),
)
