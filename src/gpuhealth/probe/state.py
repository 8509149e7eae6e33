"""The node state a node is judged in: `idle` or `in-use` (a job owns the GPUs).

Idle rules (stray processes, idle memory and the reclaim wait, idle temperature and power,
load tests) only mean something on an idle node; judged on a node that runs a job they fail a
healthy node and drain it. `auto` decides where the node can tell: the scheduler first
(Slurm's view of this node: allocated, mixed or completing is in use; the controller passes
what the kubelet says in `node_state_hint`), and on any node the compute processes on its GPUs.
The section says which state was used and why, and every verdict repeats it.

Node side: Python 3.6 and the standard library.
"""

import os
import re
import shutil
import socket
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpuhealth.facts import AUTO, IDLE, IN_USE, NODE_STATES
from gpuhealth.parsing import ParseError
from gpuhealth.probe.command import run

# Slurm states (`scontrol show node`: `State=ALLOCATED+DRAIN`, the base state then flags) in
# which a job owns some or all of the node. COMPLETING is a flag: the job's epilog still runs.
SLURM_BUSY = ("ALLOCATED", "MIXED", "COMPLETING")
SCONTROL_TIMEOUT_S = 5.0

_STATE = re.compile(r"(?:^|\s)State=([A-Z_+*~#!%$@^-]{1,120})(?=\s|$)")


def slurm_node_state(text: str) -> List[str]:
    """The words of a node's State= in `scontrol show node -o NAME` (["ALLOCATED", "DRAIN"]);
    ParseError when there is not exactly one State= field."""
    found = _STATE.findall(text)
    if len(found) != 1:
        raise ParseError(
            f"scontrol show node: expected one State= field, found {len(found)}: {text[:120]!r}"
        )
    words = [w.strip("*~#!%$@^-") for w in found[0].split("+")]
    if not words or not all(re.match(r"^[A-Z_]{2,30}$", w) for w in words):
        raise ParseError(f"scontrol show node: not a Slurm node state: {found[0]!r}")
    return words


def slurm_view(name: Optional[str], runner: Callable[..., Any]) -> Optional[Tuple[str, str]]:
    """(state, why) from Slurm's view of this node, or None when Slurm cannot say (also what
    `gpuhealth serve` asks at request time, with no NVML call)."""
    if shutil.which("scontrol") is None:
        return None
    node = name or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    result = runner(["scontrol", "show", "node", "-o", node], SCONTROL_TIMEOUT_S)
    if result.failure() is not None:  # no munge, an unknown node name, slurmctld down
        return None
    try:
        words = slurm_node_state(result.stdout)
    except ParseError:
        return None
    shown = "+".join(words)
    busy = [w for w in words if w in SLURM_BUSY]
    if busy:
        return IN_USE, f"Slurm: node {node} is {shown}"
    return IDLE, f"Slurm: node {node} is {shown} (no job)"


def _processes(gpus: Any) -> Tuple[str, str]:
    """(state, why) from the compute processes the NVML pass listed on each GPU."""
    records = [g for g in gpus or [] if isinstance(g, dict)]
    busy = [
        "gpu{}".format(g.get("index"))
        for g in records
        if isinstance(g.get("processes"), list) and g["processes"]
    ]
    if busy:
        return IN_USE, "compute processes on {}".format(", ".join(busy))
    if not records:
        return IDLE, "no GPU listed, so no job on one"
    if any(g.get("processes") is None for g in records):
        return IDLE, "no compute process seen (some GPUs' process lists could not be read)"
    return IDLE, "no compute process on any GPU"


def decide(
    requested: Any,
    hint: Any,
    gpus: Any,
    slurm_node: Optional[str] = None,
    runner: Callable[..., Any] = run,
) -> Dict[str, Any]:
    """The `node_state` section: `state` (idle or in-use), what was `requested`, and `source`,
    the evidence in words. An unknown request is judged idle (the strictest rules) and said."""
    if requested in NODE_STATES:
        return {"state": requested, "requested": requested, "source": "requested"}
    if requested != AUTO:
        return {
            "state": IDLE,
            "requested": str(requested),
            "source": f"unknown node state {requested!r} requested: judged idle",
        }
    said = ""
    if isinstance(hint, dict) and hint.get("state") == IN_USE:
        return {"state": IN_USE, "requested": AUTO, "source": str(hint.get("source"))}
    if isinstance(hint, dict) and hint.get("state") == IDLE:
        # No pod holds a GPU, but a job the kubelet does not see (outside Kubernetes, or a pod
        # given every GPU by NVIDIA_VISIBLE_DEVICES) may: Slurm and the GPUs still have a say.
        said = f"{hint.get('source')}; "
    found = slurm_view(slurm_node, runner)
    if found is None:
        found = _processes(gpus)
    return {"state": found[0], "requested": AUTO, "source": said + found[1]}
