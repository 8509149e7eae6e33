"""Saved evidence (logs and tool outputs a node left behind) turned into facts documents.

Recognition is by content, not file name: people paste logs into tickets under any name.
Each family declares the kinds of evidence it reads (`families/<name>/evidence.py`); each kind
knows how to spot itself and how to become facts sections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuhealth import registry
from gpuhealth.documents import read_bounded
from gpuhealth.facts import PROBE_VERSION, SCHEMA_VERSION
from gpuhealth.parsing import ParseError
from gpuhealth.registry import Kind

# Pasted logs are kilobytes to megabytes; a kernel log of a whole boot is rarely 100 MB.
MAX_BYTES = 256 * 1024 * 1024


class EvidenceError(ValueError):
    """Evidence that cannot be read or recognised; the message names the file (and line)."""


def recognise(path: Path, text: str | None) -> Kind | None:
    """The kind of evidence a file (text) or directory (text None) is, or None."""
    for kind in registry.evidence_kinds():
        if kind.directory == (text is None) and kind.detect(path if text is None else text):
            return kind
    return None


def _read(path: Path) -> tuple[Kind, dict[str, Any]]:
    text = None
    if not path.is_dir():
        try:
            text = read_bounded(path, MAX_BYTES)
        except OSError as exc:
            raise EvidenceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    kind = recognise(path, text)
    if kind is None:
        known = ", ".join(k.name for k in registry.evidence_kinds())
        raise EvidenceError(f"{path}: not a kind of evidence gpuhealth reads ({known})")
    try:
        return kind, kind.parse(path if text is None else text)
    except ParseError as exc:
        raise EvidenceError(f"{path}: {exc}") from exc


def facts_from_files(paths: list[Path], host: str) -> tuple[list[Kind], dict[str, Any]]:
    """One facts document for `host` from evidence files of one node.

    Sections no file provides stay null, so their checks report "not evaluated".
    """
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "probe_version": PROBE_VERSION,
        "source": "evidence-file",
        "collected_at": None,
        "duration_s": None,
        "host": {"hostname": host, "kernel": None, "arch": None, "os": None},
        "errors": [],
        "evidence": [],
        "driver": None,
        "pci": {"nvidia_gpus": None},
        "gpu_count": None,
        "gpus": None,
    }
    kinds = []
    provided: dict[str, Path] = {}
    for path in paths:
        kind, parts = _read(path)
        kinds.append(kind)
        doc["errors"].extend(parts.pop("errors", []))
        for key, value in parts.items():
            if key in provided and key != "driver":
                raise EvidenceError(
                    f"{path}: {key} data for {host} already came from {provided[key]}"
                )
            provided.setdefault(key, path)
            doc[key] = value
        doc["evidence"].append({"file": str(path), "kind": kind.name})
    return kinds, doc


def facts_from_file(path: Path) -> tuple[Kind, dict[str, Any]]:
    """One evidence file as the facts document of a host named after the file."""
    kinds, doc = facts_from_files([path], path.stem)
    return kinds[0], doc
