"""Saved DCGM evidence for triage: `dcgmi diag` and `dcgmi health -c`, as `-j` JSON or as the
default box-drawn tables."""

from __future__ import annotations

import re
from typing import Any

from gpuhealth.families.dcgm import parse_dcgm, parse_dcgm_table
from gpuhealth.registry import Kind

# Where each output begins in a ticket: a JSON document at the margin, a table's top border
# above its title row.
_JSON_START = re.compile(r"^(?:\{|\[[ \t]*\r?$|\[[ \t]*\{)", re.M)
_DIAG_START = re.compile(
    r"^[ \t]*\+[-=+]{3,}\+[ \t]*\r?\n[ \t]*\|[ \t]*Diagnostic[ \t]+\|[ \t]*Result[ \t]+\|", re.M
)
_HEALTH_START = re.compile(
    r"^[ \t]*\+[-=+]{3,}\+[ \t]*\r?\n[ \t]*\|[ \t]*Health Monitor Report[ \t]+\|", re.M
)


def looks_like_diag(text: str) -> bool:
    """`dcgmi diag -j` output of any DCGM release."""
    return any(f'"{key}"' in text for key in parse_dcgm.DIAG_KEYS)


def _diag_section(diag: dict[str, Any]) -> dict[str, Any]:
    section = {"level": None, "command": None, "rc": None, "duration_s": None, "error": None}
    return {"dcgm": {**section, "diag": diag}}


def diag_evidence(text: str) -> dict[str, Any]:
    """Saved `dcgmi diag -j` output as the `dcgm` facts section."""
    return _diag_section(parse_dcgm.parse_diag(text))


def diag_table_evidence(text: str) -> dict[str, Any]:
    """A pasted `dcgmi diag` table as the `dcgm` facts section."""
    return _diag_section(parse_dcgm_table.parse_diag(text))


def looks_like_health(text: str) -> bool:
    """`dcgmi health -c -j` output."""
    return '"Health Monitor Report"' in text or '"Overall Health"' in text


def health_evidence(text: str) -> dict[str, Any]:
    """Saved `dcgmi health -c -j` output as the `dcgm_health` facts section."""
    return {"dcgm_health": {"health": parse_dcgm.parse_health(text), "unavailable": {}}}


def health_table_evidence(text: str) -> dict[str, Any]:
    """A pasted `dcgmi health -c` table as the `dcgm_health` facts section."""
    return {"dcgm_health": {"health": parse_dcgm_table.parse_health(text), "unavailable": {}}}


KINDS = (
    Kind("dcgmi diag -j", looks_like_diag, diag_evidence, priority=30, starts=_JSON_START),
    Kind("dcgmi health -c -j", looks_like_health, health_evidence, priority=31, starts=_JSON_START),
    Kind(
        "dcgmi diag",
        parse_dcgm_table.looks_like_diag,
        diag_table_evidence,
        priority=32,
        starts=_DIAG_START,
    ),
    Kind(
        "dcgmi health -c",
        parse_dcgm_table.looks_like_health,
        health_table_evidence,
        priority=33,
        starts=_HEALTH_START,
    ),
)
