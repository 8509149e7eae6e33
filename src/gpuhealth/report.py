"""Per-node verdicts: PASS / WARN / FAIL / UNREACHABLE with the reasons and actions.

The verdict is what an on-call engineer acts on (drain, reset, RMA), so it is built from the
same findings whether they came from pytest or from `gpuhealth triage`.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ORDER = {"PASS": 0, "WARN": 1, "FAIL": 2, "UNREACHABLE": 3}


@dataclass
class Finding:
    """One check's outcome on one host (and GPU)."""

    check: str
    status: str
    host: str
    gpu: int | None
    message: str
    action: str | None = None


@dataclass
class NodeVerdict:
    """The verdict for one host and everything that led to it."""

    host: str
    verdict: str = "PASS"
    reasons: list[str] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(
        default_factory=lambda: {"PASS": 0, "WARN": 0, "FAIL": 0, "SKIP": 0, "ERROR": 0}
    )
    notes: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)


class VerdictBook:
    """Accumulates findings and turns them into per-node verdicts."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeVerdict] = {}

    def node(self, host: str) -> NodeVerdict:
        """The verdict record of a host, created on first use."""
        return self.nodes.setdefault(host, NodeVerdict(host))

    def add(self, finding: Finding) -> None:
        """Record one check outcome."""
        node = self.node(finding.host)
        node.counts[finding.status] = node.counts.get(finding.status, 0) + 1
        entry = {k: v for k, v in asdict(finding).items() if k not in ("host", "status")}
        if finding.status == "FAIL":
            node.failed.append(entry)
        elif finding.status == "WARN":
            node.warnings.append(entry)

    def error(self, host: str, check: str, gpu: int | None, message: str) -> None:
        """A check that could not run (a bug or a broken document), not a health verdict."""
        node = self.node(host)
        node.counts["ERROR"] += 1
        node.failed.append({"check": check, "gpu": gpu, "message": message, "action": None})

    def unreachable(self, host: str, reason: str) -> None:
        """The host could not be probed at all."""
        node = self.node(host)
        node.verdict = "UNREACHABLE"
        if reason not in node.reasons:
            node.reasons.append(reason)

    def note(self, host: str, text: str) -> None:
        """Context for the verdict that is not a finding (e.g. no GPU on this host)."""
        node = self.node(host)
        if text not in node.notes:
            node.notes.append(text)

    def finish(self) -> list[NodeVerdict]:
        """Decide every node's verdict; most severe first, then by host name."""
        for node in self.nodes.values():
            if node.verdict == "UNREACHABLE":
                continue
            if node.failed:
                node.verdict = "FAIL"
                node.reasons, node.actions = _summarise(node.failed)
            elif node.warnings:
                node.verdict = "WARN"
                node.reasons, node.actions = _summarise(node.warnings)
            else:
                node.verdict = "PASS"
                node.reasons = list(node.notes) or [
                    f"{node.counts['PASS']} checks passed, {node.counts['SKIP']} skipped"
                ]
        return sorted(self.nodes.values(), key=lambda n: (-ORDER[n.verdict], n.host))


def _summarise(entries: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """One reason per distinct problem (a missing GPU fails every check of its index the same
    way), naming the checks that saw it; and the distinct actions, in order."""
    by_message: dict[str, list[str]] = {}
    actions: list[str] = []
    ordered = sorted(entries, key=lambda e: (e.get("gpu") is not None, e.get("gpu") or 0))
    for entry in ordered:
        message = entry["message"].split(". Action: ")[0]
        by_message.setdefault(message, []).append(entry["check"])
        if entry.get("action") and entry["action"] not in actions:
            actions.append(entry["action"])
    reasons = [f"{message} [{', '.join(checks)}]" for message, checks in by_message.items()]
    return reasons, actions


def overall(verdicts: list[NodeVerdict]) -> str:
    """The worst node verdict of a run."""
    return max((v.verdict for v in verdicts), key=ORDER.__getitem__, default="PASS")


def write_json(verdicts: list[NodeVerdict], path: Path, extra: dict[str, Any]) -> None:
    """Write reports/verdicts.json: one entry per node, for dashboards and drain scripts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "overall": overall(verdicts),
        **extra,
        "nodes": {
            v.host: {k: val for k, val in asdict(v).items() if k != "host"} for v in verdicts
        },
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def table(verdicts: list[NodeVerdict], width: int = 120) -> list[str]:
    """Terminal lines: one per node with its verdict and first reason."""
    if not verdicts:
        return ["no hosts were checked"]
    host_w = max(4, *(len(v.host) for v in verdicts))
    lines = [f"{'HOST':<{host_w}}  {'VERDICT':<11}  REASON"]
    for v in verdicts:
        first = v.reasons[0] if v.reasons else ""
        more = f" (+{len(v.reasons) - 1} more)" if len(v.reasons) > 1 else ""
        text = first + more
        room = max(20, width - host_w - 15)
        if len(text) > room:
            text = text[: room - 3] + "..."
        lines.append(f"{v.host:<{host_w}}  {v.verdict:<11}  {text}")
    return lines
