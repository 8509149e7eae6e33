"""Saved GPU evidence for triage: `nvidia-smi -q -x` (any DTD), `nvidia-smi -q` text, whole or
as sections grep printed, the default `nvidia-smi` table, and `nvidia-smi nvlink -s`/`-e`."""

from __future__ import annotations

import re
from typing import Any

import defusedxml.ElementTree

from gpuhealth.families.gpu import parse_nvlink, parse_smi_table, parse_smi_text, parse_smi_xml
from gpuhealth.registry import Kind

# The table's banner ("| NVIDIA-SMI 550.90.07   Driver Version: ..." or, since r610, "KMD
# Version"), or the line nvidia-smi prints for a GPU it cannot open, alone or above the table.
_TABLE = re.compile(
    r"^[ \t]*(?:\|[ \t]*NVIDIA-SMI [^|\n]{0,80}Version:|Unable to determine the device handle "
    r"for GPU)",
    re.M,
)


# Where each output begins in a ticket: the XML prolog or root, the -q banner, the table's
# (date and) top border above its banner or the line for a GPU it could not open, a nvlink
# `GPU N: ... (UUID: ...)` line with a link line (or NVML's complaint) below it.
_XML_START = re.compile(
    r"^[ \t]*(?:<\?xml[^\n]{0,200}\n(?:[ \t]*<!DOCTYPE[^\n]{0,500}\n)?[ \t]*)?<nvidia_smi_log\b",
    re.M,
)
_Q_START = re.compile(r"^[ \t]*=+[ \t]*NVSMI LOG[ \t]*=+", re.M)
_TABLE_START = re.compile(
    r"^[ \t]*(?:(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4}"
    r"[ \t]*\r?\n[ \t]*)?\+-{10,}\+[ \t]*\r?\n[ \t]*\|[ \t]*NVIDIA-SMI "
    r"|^[ \t]*Unable to determine the device handle for GPU",
    re.M,
)
_NVLINK_START = re.compile(
    r"^GPU \d{1,4}: [^\n]{0,200}\(UUID: [^\n]{0,100}\)[ \t]*\r?\n(?:[ \t]+Link \d|NVML: )", re.M
)


def _looks_like_smi_xml(text: str) -> bool:
    return "<nvidia_smi_log" in text[:4096]


def _looks_like_smi_text(text: str) -> bool:
    """A whole `nvidia-smi -q`, also one pasted without its banner and Driver Version line:
    "Attached GPUs" heads every such output and no `grep Fabric` window holds it."""
    head = text[:4096]
    return "NVSMI LOG" in head or "Attached GPUs" in head


def _looks_like_table(text: str) -> bool:
    return _TABLE.search(text[:65536]) is not None


def _parse_smi_xml(text: str) -> dict[str, Any]:
    # Untrusted files: defusedxml refuses entity expansion and external references.
    return parse_smi_xml.parse(text, fromstring=defusedxml.ElementTree.fromstring)


KINDS = (
    Kind("nvidia-smi -q -x", _looks_like_smi_xml, _parse_smi_xml, priority=10, starts=_XML_START),
    Kind("nvidia-smi -q", _looks_like_smi_text, parse_smi_text.parse, priority=11, starts=_Q_START),
    Kind("nvidia-smi", _looks_like_table, parse_smi_table.parse, priority=13, starts=_TABLE_START),
    Kind(
        "nvidia-smi nvlink -s / -e",
        parse_nvlink.looks_like_pasted,
        parse_nvlink.parse_pasted,
        priority=14,
        starts=_NVLINK_START,
    ),
    # After `nvidia-smi topo -m` (15): the most general of the nvidia-smi kinds.
    Kind(
        "nvidia-smi -q sections",
        parse_smi_text.looks_like_fragment,
        parse_smi_text.parse_fragment,
        priority=16,
    ),
)
