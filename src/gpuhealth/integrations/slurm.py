"""Slurm: drain the nodes gpuhealth failed, resume the ones it drained that now pass.

The LBNL NHC convention: every drain reason gpuhealth sets starts with `gpuhealth:`, and it
only ever resumes (or rewords) a drain that carries that prefix; a node an admin drained or
took down for another reason is left alone, whatever the verdict. Changes go through
`scontrol update` (as an admin would type them), nodes are read with `sinfo`.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhealth import report as reporting
from gpuhealth.config import ConfigError
from gpuhealth.integrations import verdicts as runs

PREFIX = "gpuhealth:"
# Slurm keeps reasons of any length, but `sinfo -R` and `scontrol show node` are read by
# people: the headline first, cut to a length that stays on one line of either.
REASON_MAX = 200
COMMAND_TIMEOUT_S = 20
# node-check as slurmd's HealthCheckProgram: its probe may take --timeout (40 s) and 5 s more
# to be killed; two Slurm calls of 5 s each keep the whole inside the 60 s slurmd allows.
SELF_TIMEOUT_S = 5
# sinfo's long state names that mean the node takes no new work.
DRAINED = ("drain", "drained", "draining", "down", "fail", "failing")
BAD = ("FAIL", "UNREACHABLE")  # the verdicts that drain a node
NAME_VAR = "slurm_node_name"  # the inventory var naming a host's Slurm node


class SlurmError(Exception):
    """A Slurm command failed or is missing."""


@dataclass(frozen=True)
class SlurmNode:
    """A node as sinfo shows it: its long state (e.g. `drained`, `idle`) and reason."""

    name: str
    state: str
    reason: str

    @property
    def drained(self) -> bool:
        """It takes no new work (drained, draining, down or failing)."""
        return self.state.rstrip("*~#!%$@^-").split("+")[0] in DRAINED

    @property
    def ours(self) -> bool:
        """gpuhealth set its reason (and so may change it)."""
        return self.reason.startswith(PREFIX)


@dataclass(frozen=True)
class Change:
    """One scontrol update to make (or that was made), and why."""

    node: str
    host: str
    state: str  # DRAIN or RESUME
    reason: str | None
    why: str

    def argv(self) -> list[str]:
        """The scontrol command line."""
        args = ["scontrol", "update", f"NodeName={self.node}", f"State={self.state}"]
        return args + ([f"Reason={self.reason}"] if self.reason is not None else [])

    def shown(self) -> str:
        """The command as one would paste it into a shell (quoted: reasons come from
        check messages)."""
        return shlex.join(self.argv())


def reason(headline: str) -> str:
    """gpuhealth's drain reason: the prefix, then the headline on one printable line, within
    REASON_MAX characters."""
    text = "".join(c if c.isprintable() and c != '"' else " " for c in headline)
    return reporting.one_line(f"{PREFIX} {text}", REASON_MAX)


def _run(argv: list[str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    if shutil.which(argv[0]) is None:
        raise SlurmError(f"{argv[0]} not found (install Slurm's client commands)")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv[:3])}: no answer in {timeout_s:g} s") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-500:]
        raise SlurmError(f"{' '.join(argv[:3])} exited {done.returncode}: {said}")
    return done.stdout


def parse_sinfo(text: str) -> dict[str, SlurmNode]:
    """`sinfo -h -N -o '%N|%T|%E'` output -> nodes (a node in several partitions once).
    The reason is the last field, so a `|` inside it is kept."""
    nodes: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        parts = line.split("|", 2)
        if len(parts) != 3 or not parts[0].strip():
            continue
        name, state, why = (p.strip() for p in parts)
        nodes.setdefault(name, SlurmNode(name, state.lower(), "" if why == "none" else why))
    return nodes


def query(
    names: list[str] | None = None, timeout_s: float = COMMAND_TIMEOUT_S
) -> dict[str, SlurmNode]:
    """The nodes Slurm knows (all, or those named), with state and reason."""
    argv = ["sinfo", "-h", "-N", "-o", "%N|%T|%E"]
    if names:
        argv += ["-n", ",".join(names)]
    return parse_sinfo(_run(argv, timeout_s))


def node_name(host: str, host_vars: dict[str, Any]) -> str:
    """A host's Slurm name: inventory var `slurm_node_name`, else its inventory name (as
    `act slurm` maps them; slurmd tells node-check its own name: SLURMD_NODENAME)."""
    return runs.node_name(host, host_vars, NAME_VAR)


def lost(run: runs.Run, names: dict[str, str], known: dict[str, SlurmNode]) -> list[str]:
    """The hosts to drain that Slurm has no node for: they keep taking jobs, a mapping to fix
    and never a success."""
    return [h for h, s in run.nodes.items() if s.verdict in BAD and names[h] not in known]


def plan(
    run: runs.Run, names: dict[str, str], known: dict[str, SlurmNode]
) -> tuple[list[Change], list[str]]:
    """What to change for a run's verdicts, and what is left alone (each with why)."""
    changes: list[Change] = []
    notes: list[str] = []
    for host, state in sorted(run.nodes.items()):
        name = names.get(host, host)
        node = known.get(name)
        where = host if name == host else f"{host} (Slurm {name})"
        bad = state.verdict in BAD
        if node is None:
            if bad or state.verdict == "PASS":
                notes.append(f"{where}: {state.verdict}, but Slurm has no node {name}")
            continue
        if bad:
            wanted = reason(f"{state.verdict} {state.headline}")
            if node.drained and not node.ours:
                notes.append(
                    f"{where}: {state.verdict}, left alone: already {node.state} by "
                    f"someone else ({node.reason or 'no reason'})"
                )
            elif node.drained and node.reason == wanted:
                notes.append(f"{where}: {state.verdict}, already drained by gpuhealth")
            else:
                why = f"{state.verdict}: {state.headline}"
                changes.append(Change(name, host, "DRAIN", wanted, why))
        elif state.verdict == "PASS" and node.drained and node.ours:
            if not run.complete:
                notes.append(f"{where}: PASS, not resumed: the run did not finish")
            elif not state.vouches_for_idle:
                notes.append(
                    f"{where}: PASS judged in use (fault rules only), not resumed: it stays "
                    f"drained until it passes idle ({node.reason})"
                )
            else:
                changes.append(Change(name, host, "RESUME", None, "PASS in this run"))
        elif node.drained and node.ours:
            notes.append(f"{where}: {state.verdict}, kept drained ({node.reason})")
    return changes, notes


def apply(
    changes: list[Change],
    say: Callable[[str], None] = print,
    timeout_s: float = COMMAND_TIMEOUT_S,
) -> int:
    """Run each change; how many failed (each failure said, the rest still made)."""
    failed = 0
    for change in changes:
        try:
            _run(change.argv(), timeout_s)
            say(f"done: {change.shown()}")
        except SlurmError as exc:
            failed += 1
            say(f"FAILED: {change.shown()}: {exc}")
    return failed


def _act(args: argparse.Namespace) -> int:
    try:
        run = runs.load(args.verdicts)
        names = runs.node_names(list(run.nodes), args.inventory, NAME_VAR)
        known = query(sorted(set(names.values())))
    except (runs.VerdictsError, SlurmError, ConfigError) as exc:
        print(f"gpuhealth act slurm: {exc}")
        return 2
    changes, notes = plan(run, names, known)
    print(f"{run.title}: {len(run.nodes)} nodes, {len(changes)} changes")
    for note in notes:
        print(f"  {note}")
    unmapped = lost(run, names, known)
    if not args.apply:
        for change in changes:
            print(f"would run: {change.shown()}    # {change.host}: {change.why}")
        if changes:
            print("dry run: nothing changed (--apply makes these changes)")
        return 1 if unmapped else 0
    return 1 if apply(changes) or unmapped else 0


def act_on_self(
    name: str,
    verdict: reporting.NodeVerdict,
    apply_changes: bool,
    say: Callable[[str], None] = print,
) -> int:
    """node-check --slurm: drain this node on FAIL, resume it on PASS if gpuhealth drained
    it; 0, or 1 when Slurm could not be read or changed (each step said through `say`)."""
    state = runs.NodeState(
        name,
        verdict.verdict,
        verdict.reasons,
        verdict.actions,
        verdict.failed,
        verdict.gpu_slots,
        verdict.node_state,
    )
    run = runs.Run(Path("node-check"), "now", True, {name: state})
    try:
        known = query([name], SELF_TIMEOUT_S)
    except SlurmError as exc:
        say(f"slurm: {reporting.one_line(str(exc), 300)}")
        return 1
    changes, notes = plan(run, {name: name}, known)
    for note in notes:
        say(f"slurm: {note}")
    if lost(run, {name: name}, known):
        return 1
    if not apply_changes:
        for change in changes:
            say(f"slurm: would run: {change.shown()}")
        return 0
    return 1 if apply(changes, lambda text: say(f"slurm: {text}"), SELF_TIMEOUT_S) else 0


def add_parser(targets: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """`gpuhealth act slurm`."""
    parser = targets.add_parser(
        "slurm",
        parents=[common],
        help="drain FAIL/UNREACHABLE nodes, resume the ones gpuhealth drained that now PASS",
        description=__doc__.splitlines()[0],
    )
    parser.set_defaults(func=_act)
