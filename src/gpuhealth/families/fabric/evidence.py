"""Saved fabric evidence for triage: `fi_info` output, and copies of /sys/class/infiniband."""

from __future__ import annotations

import os
import re
from typing import Any

from gpuhealth.facts import why
from gpuhealth.families.fabric import parse_fi_info, sysfs
from gpuhealth.registry import Kind

_FI_INFO_HEAD = re.compile(r"^(provider: \S+\n[ \t]+fabric: |fi_getinfo: -\d+)", re.M)


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


KINDS = (
    Kind("fi_info", looks_like_fi_info, from_fi_info_text, priority=20),
    Kind("/sys/class/infiniband copy", looks_like_class_dir, from_class_dir, directory=True),
)
