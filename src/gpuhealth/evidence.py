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

from gpuhealth.parsers import (
    ParseError,
    dcgm,
    gpud,
    kernel_log,
    nccl_tests,
    nvidia_smi_text,
    nvidia_smi_xml,
)
from gpuhealth.probe import fabric as fabric_evidence
from gpuhealth.probe.schema import PROBE_VERSION, SCHEMA_VERSION


class EvidenceError(ValueError):
    """Evidence that cannot be read or recognised; the message names the file (and line)."""


@dataclass(frozen=True)
class Kind:
    """One kind of evidence: how to recognise it and how to read it into facts sections.

    Text kinds get the file's text; directory kinds (a copied /sys tree) get the path.
    `parse` returns top-level sections of a facts document (plus optional `errors`).
    """

    name: str
    detect: Callable[[Any], bool]
    parse: Callable[[Any], dict[str, Any]]
    directory: bool = False


def _looks_like_smi_xml(text: str) -> bool:
    return "<nvidia_smi_log" in text[:4096]


def _looks_like_smi_text(text: str) -> bool:
    head = text[:4096]
    return "NVSMI LOG" in head or ("Driver Version" in head and "Attached GPUs" in head)


def _parse_smi_xml(text: str) -> dict[str, Any]:
    return nvidia_smi_xml.parse(text, fromstring=defusedxml.ElementTree.fromstring)


# Most specific first: the first kind whose `detect` accepts the evidence reads it.
KINDS: list[Kind] = [
    Kind("nvidia-smi -q -x", _looks_like_smi_xml, _parse_smi_xml),
    Kind("nvidia-smi -q", _looks_like_smi_text, nvidia_smi_text.parse),
    Kind("fi_info", fabric_evidence.looks_like_fi_info, fabric_evidence.from_fi_info_text),
    Kind("dcgmi diag -j", dcgm.looks_like_diag, dcgm.diag_evidence),
    Kind("dcgmi health -c -j", dcgm.looks_like_health, dcgm.health_evidence),
    Kind("GPUd /v1/states", gpud.looks_like_states, gpud.states_evidence),
    Kind("GPUd /v1/events", gpud.looks_like_events, gpud.events_evidence),
    Kind("nccl-tests output", nccl_tests.looks_like, nccl_tests.evidence),
    Kind(
        "/sys/class/infiniband copy",
        fabric_evidence.looks_like_class_dir,
        fabric_evidence.from_class_dir,
        directory=True,
    ),
    Kind(
        "nvidia-fabricmanager log",
        kernel_log.detect_fabric_manager,
        kernel_log.fabric_manager_evidence,
    ),
    # Kernel logs (dmesg, journalctl -k, /dev/kmsg...) are generic timestamped lines: keep last.
    *(
        Kind(name, kernel_log.detector(name), kernel_log.kernel_log_evidence)
        for name in kernel_log.FORMATS
    ),
]


def recognise(path: Path, text: str | None) -> Kind | None:
    """The kind of evidence a file (text) or directory (text None) is, or None."""
    for kind in KINDS:
        if kind.directory == (text is None) and kind.detect(path if text is None else text):
            return kind
    return None


def _read(path: Path) -> tuple[Kind, dict[str, Any]]:
    text = None
    if not path.is_dir():
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            raise EvidenceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    kind = recognise(path, text)
    if kind is None:
        known = ", ".join(k.name for k in KINDS)
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
