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
    Kind("nvidia-smi -q -x", _looks_like_smi_xml, _parse_smi_xml, priority=10),
    Kind("nvidia-smi -q", _looks_like_smi_text, parse_smi_text.parse, priority=11),
    Kind("nvidia-smi", _looks_like_table, parse_smi_table.parse, priority=13),
    Kind(
        "nvidia-smi nvlink -s / -e",
        parse_nvlink.looks_like_pasted,
        parse_nvlink.parse_pasted,
        priority=14,
    ),
    # After `nvidia-smi topo -m` (15): the most general of the nvidia-smi kinds.
    Kind(
        "nvidia-smi -q sections",
        parse_smi_text.looks_like_fragment,
        parse_smi_text.parse_fragment,
        priority=16,
    ),
)
