"""Saved evidence (logs and tool outputs a node left behind) turned into facts documents.

Recognition is by content, not file name: people paste logs into tickets under any name.
Each kind knows how to spot itself and how to become a facts document; later kinds (kernel
logs, fi_info, nccl-tests, DCGM, GPUd) register the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import defusedxml.ElementTree

from gpuhealth.parsers import ParseError, nvidia_smi_text, nvidia_smi_xml
from gpuhealth.probe.schema import PROBE_VERSION, SCHEMA_VERSION


class EvidenceError(ValueError):
    """Evidence that cannot be read or recognised; the message names the file (and line)."""


@dataclass(frozen=True)
class Kind:
    """One kind of evidence: how to recognise it and how to read it into facts."""

    name: str
    source: str
    detect: Callable[[str], bool]
    parse: Callable[[str], dict[str, Any]]


def _looks_like_smi_xml(text: str) -> bool:
    return "<nvidia_smi_log" in text[:4096]


def _looks_like_smi_text(text: str) -> bool:
    head = text[:4096]
    return "NVSMI LOG" in head or ("Driver Version" in head and "Attached GPUs" in head)


def _parse_smi_xml(text: str) -> dict[str, Any]:
    return nvidia_smi_xml.parse(text, fromstring=defusedxml.ElementTree.fromstring)


KINDS: list[Kind] = [
    Kind("nvidia-smi -q -x", "nvidia-smi-xml-file", _looks_like_smi_xml, _parse_smi_xml),
    Kind("nvidia-smi -q", "nvidia-smi-text-file", _looks_like_smi_text, nvidia_smi_text.parse),
]


def recognise(text: str) -> Kind | None:
    """The kind of evidence a text is, or None."""
    return next((kind for kind in KINDS if kind.detect(text)), None)


def facts_from_file(path: Path) -> tuple[Kind, dict[str, Any]]:
    """Read one evidence file into a facts document for the host named after the file."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise EvidenceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    kind = recognise(text)
    if kind is None:
        known = ", ".join(k.name for k in KINDS)
        raise EvidenceError(f"{path}: not a kind of evidence gpuhealth reads ({known})")
    try:
        parsed = kind.parse(text)
    except ParseError as exc:
        raise EvidenceError(f"{path}: {exc}") from exc
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "probe_version": PROBE_VERSION,
        "source": kind.source,
        "collected_at": None,
        "duration_s": None,
        "host": {"hostname": path.stem, "kernel": None, "arch": None, "os": None},
        "errors": parsed.pop("errors", []),
        "pci": {"nvidia_gpus": None},
        **parsed,
    }
    return kind, doc
