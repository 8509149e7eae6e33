"""Reading a run's verdicts.json back, for the commands that act on it (`gpuhealth act`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuhealth.targets import host_vars_of

VERDICTS = ("PASS", "WARN", "NOT_CHECKED", "FAIL", "UNREACHABLE")


class VerdictsError(Exception):
    """verdicts.json is missing, unreadable or not what a gpuhealth run writes."""


@dataclass(frozen=True)
class NodeState:
    """One node of the run as an action sees it."""

    host: str
    verdict: str
    reasons: list[str]
    actions: list[str]
    failed: list[dict[str, Any]] = field(default_factory=list)
    gpu_slots: int | None = None

    @property
    def headline(self) -> str:
        """The node's first reason (what a drain reason or a condition message says)."""
        return self.reasons[0] if self.reasons else self.verdict

    def bad_gpus(self) -> set[int]:
        """GPU indices with a failed check (or one that could not run)."""
        return {e["gpu"] for e in self.failed if isinstance(e.get("gpu"), int)}


@dataclass(frozen=True)
class Run:
    """The verdicts of one run: when, whether it finished, each node."""

    path: Path
    generated_at: str
    complete: bool
    nodes: dict[str, NodeState]


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def load(path: Path) -> Run:
    """The run in `path`, validated enough to act on (VerdictsError otherwise)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise VerdictsError(f"{path}: no such file (run the suite first)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise VerdictsError(f"{path}: cannot read it: {exc}") from None
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, dict):
        raise VerdictsError(f"{path}: not a gpuhealth verdicts.json (no 'nodes' object)")
    found: dict[str, NodeState] = {}
    for host, node in nodes.items():
        verdict = node.get("verdict") if isinstance(node, dict) else None
        if verdict not in VERDICTS:
            raise VerdictsError(f"{path}: node {host!r} has no valid verdict ({verdict!r})")
        slots = node.get("gpu_slots")
        found[str(host)] = NodeState(
            str(host),
            verdict,
            _strings(node.get("reasons")),
            _strings(node.get("actions")),
            [e for e in node.get("failed") or [] if isinstance(e, dict)],
            slots if isinstance(slots, int) and slots >= 0 else None,
        )
    return Run(path, str(doc.get("generated_at") or "?"), doc.get("complete") is not False, found)


def node_names(hosts: list[str], inventory: str | None, var: str) -> dict[str, str]:
    """Inventory name -> the scheduler's name for it: the host's `var` (e.g. slurm_node_name)
    where the inventory sets one, else the inventory name itself."""
    found = host_vars_of(inventory, hosts)
    names = {}
    for host in hosts:
        value = found.get(host, {}).get(var)
        names[host] = str(value) if value not in (None, "") else host
    return names
