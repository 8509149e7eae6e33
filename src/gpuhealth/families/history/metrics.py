"""What history reads of a facts document through the families' declarations (gpuhealth.
metrics: each family's own metrics.py), naming no family: what it follows a node and its GPUs
by, when a host's night is, and each stored value's metric.

A GPU is followed by its serial (else its UUID), never its index; a node's driver and
firmware (what the families declare as `identity`) restart its baselines when they change.
"""

from __future__ import annotations

from typing import Any

from gpuhealth import registry
from gpuhealth.metrics import Metric, Values, moment


def metric(name: str) -> Metric:
    """The declaration of a stored value's metric, whichever family measures it (KeyError for
    a value none declares)."""
    return registry.metric(name)


def gpu_key(gpu: dict[str, Any]) -> str | None:
    """What identifies a GPU across runs: its serial, else its UUID (never its index)."""
    for key in ("serial", "uuid"):
        value = gpu.get(key)
        if isinstance(value, str) and value.strip() and value.strip() not in ("N/A", "0"):
            return value.strip()
    return None


def collected_at(facts: dict[str, Any]) -> float | None:
    """When the facts were collected (their `collected_at`, epoch seconds): the time a host's
    night is dated by. None when they do not say (pasted evidence, older documents)."""
    return moment(facts.get("collected_at"))


def identity(facts: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The node's identity as the families declare it (its driver, its HCAs' firmware, its
    machine's identities: `ids`), and each GPU's (index, UUID, serial, VBIOS, name)."""
    node: dict[str, Any] = {"driver": None, "firmware": {}, "ids": {}}
    for _, measures in registry.measures():
        if measures.identity is not None:
            node.update(measures.identity(facts))
    gpus = node.pop("gpus", [])
    return node, gpus


def cursors() -> frozenset[str]:
    """Values stored with a node's measurements that say where an event source's reading
    ended: kept for the next run, never judged or exported."""
    return frozenset(m.events.cursor for _, m in registry.measures() if m.events is not None)


def gpu_values(gpu: dict[str, Any], node_in_use: bool) -> Values:
    """A GPU record's passive values, as every family that measures GPUs reads them."""
    found: Values = {}
    for _, measures in registry.measures():
        if measures.gpu is not None:
            found.update(measures.gpu(gpu, node_in_use))
    return found


def node_values(facts: dict[str, Any]) -> Values:
    """A node's passive values, as every family that measures nodes reads them."""
    found: Values = {}
    for _, measures in registry.measures():
        if measures.node is not None:
            found.update(measures.node(facts))
    return found
