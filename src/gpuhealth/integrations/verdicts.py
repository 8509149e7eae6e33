"""Reading a run's verdicts.json back, for the commands that act on it (`gpuhealth act`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuhealth.config import ConfigError
from gpuhealth.facts import IN_USE, NODE_STATES
from gpuhealth.report import VERDICTS
from gpuhealth.targets import host_vars_of

# More GPU slots than any node has: a larger count (or index) is a broken file, and would
# otherwise become that many node labels.
MAX_GPU_SLOTS = 1024


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
    node_state: str | None = None  # idle or in-use; None: a run from before node states

    @property
    def vouches_for_idle(self) -> bool:
        """Whether a PASS of this node vouches for every rule: one judged in use (fault rules
        only) does not, so it never undoes a drain or taint an idle rule may have set."""
        return self.node_state != IN_USE

    @property
    def headline(self) -> str:
        """The node's first reason (what a drain reason or a condition message says)."""
        return self.reasons[0] if self.reasons else self.verdict

    def bad_gpus(self) -> set[int]:
        """GPU indices with a failed check (or one that could not run)."""
        return {e["gpu"] for e in self.failed if _whole(e.get("gpu"), MAX_GPU_SLOTS - 1)}


@dataclass(frozen=True)
class Run:
    """The verdicts of one run: when, whether it finished, each node."""

    path: Path
    generated_at: str
    complete: bool
    nodes: dict[str, NodeState]

    @property
    def title(self) -> str:
        """The run in one line, as each action's output starts: file, time, incomplete."""
        return f"{self.path} ({self.generated_at}{'' if self.complete else ', incomplete run'})"


def _whole(value: Any, most: int) -> bool:
    """Whether `value` is a whole number from 0 to `most` (a bool is not, though Python
    counts it an int)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _node(path: Path, host: str, node: Any) -> NodeState:
    """One node's entry, or VerdictsError naming what in it is not what a run writes: an
    action must not label GPU "-1" or a million slots, nor skip a failure it cannot read."""
    verdict = node.get("verdict") if isinstance(node, dict) else None
    if verdict not in VERDICTS:
        raise VerdictsError(f"{path}: node {host!r} has no valid verdict ({verdict!r})")
    slots = node.get("gpu_slots")
    if slots is not None and not _whole(slots, MAX_GPU_SLOTS):
        raise VerdictsError(f"{path}: node {host!r} has an invalid gpu_slots ({slots!r})")
    failed = node.get("failed", [])
    if not isinstance(failed, list) or not all(isinstance(e, dict) for e in failed):
        raise VerdictsError(f"{path}: node {host!r}: 'failed' is not a list of objects")
    for entry in failed:
        if entry.get("gpu") is not None and not _whole(entry["gpu"], MAX_GPU_SLOTS - 1):
            raise VerdictsError(
                f"{path}: node {host!r} has a failure on an invalid GPU ({entry['gpu']!r})"
            )
    return NodeState(
        host,
        verdict,
        _strings(node.get("reasons")),
        _strings(node.get("actions")),
        failed,
        slots,
        node.get("node_state") if node.get("node_state") in NODE_STATES else None,
    )


def load(path: Path) -> Run:
    """The run in `path`, validated enough to act on (VerdictsError otherwise). A run that
    does not say it finished counts as one that did not: nothing is resumed or untainted on
    the word of a file that may be partial."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise VerdictsError(f"{path}: no such file (run the suite first)") from None
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise VerdictsError(f"{path}: cannot read it: {exc}") from None
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, dict):
        raise VerdictsError(f"{path}: not a gpuhealth verdicts.json (no 'nodes' object)")
    found = {host: _node(path, host, node) for host, node in nodes.items()}
    return Run(path, str(doc.get("generated_at") or "?"), doc.get("complete") is True, found)


def node_name(host: str, host_vars: dict[str, Any], var: str) -> str:
    """A host's name to a scheduler: its inventory var `var` (e.g. slurm_node_name) where set,
    else its inventory name."""
    value = host_vars.get(var)
    return str(value) if value not in (None, "") else host


def node_names(hosts: list[str], inventory: str | None, var: str) -> dict[str, str]:
    """Inventory name -> the scheduler's name for it: the host's `var` (e.g. slurm_node_name)
    where the inventory sets one, else the inventory name itself. Two hosts mapped to one
    node are a ConfigError: the second's verdict would undo the first's (a PASS untainting
    a FAIL)."""
    found = host_vars_of(inventory, hosts)
    names = {host: node_name(host, found.get(host, {}), var) for host in hosts}
    by_name: dict[str, list[str]] = {}
    for host, name in names.items():
        by_name.setdefault(name, []).append(host)
    shared = {name: named for name, named in by_name.items() if len(named) > 1}
    if shared:
        said = "; ".join(f"{', '.join(sorted(h))} -> {n}" for n, h in sorted(shared.items()))
        raise ConfigError(f"inventory {inventory}: {var} names one node for several hosts: {said}")
    return names
