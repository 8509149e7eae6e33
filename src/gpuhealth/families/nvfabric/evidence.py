"""Saved NVLink fabric evidence for triage: the `Fabric` blocks of `nvidia-smi -q` pasted on
their own (`nvidia-smi -q | grep -A8 Fabric`); whole `-q` and `-q -x` outputs are the GPU
family's kinds, and their GPU records carry the fabric too."""

from __future__ import annotations

import re

from gpuhealth.families.gpu import parse_smi_text
from gpuhealth.registry import Kind

# A "Fabric" line with an indented "State : ..." under it, as nvidia-smi -q prints the block.
_BLOCK = re.compile(r"^[ \t]*Fabric[ \t]*\r?\n[ \t]+State[ \t]+:", re.M)


def _looks_like_fragment(text: str) -> bool:
    return _BLOCK.search(text[:65536]) is not None


KINDS = (
    Kind(
        "nvidia-smi -q Fabric lines",
        _looks_like_fragment,
        parse_smi_text.parse_fabric_fragment,
        priority=12,
    ),
)
