"""Judge the machine this runs on, in one process and without SSH or pytest.

What `gpuhealth node-check` (Slurm's HealthCheckProgram, node-problem-detector) and
`gpuhealth serve` (the node health service ft_launcher asks) answer with: the same probe the
suite ships, run here as a child process (a hung driver call is killed on its deadline instead
of hanging the caller), and the same quick checks, against the inventory's expectations for
this host. Load tests (`--level standard`) and history checks are the suite's business.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuhealth import registry
from gpuhealth import report as reporting
from gpuhealth.checks import NodeView, judged
from gpuhealth.config import Platform, Profile, ProfileSet, resolve_limits
from gpuhealth.documents import FactsError
from gpuhealth.facts import AUTO
from gpuhealth.families.gpu.scope import GPU, none_expected
from gpuhealth.integrations import kubelet
from gpuhealth.results import Action
from gpuhealth.targets import Target, inventory_target
from gpuhealth.transport import ProbeError, parse_output, probe_call

# Slurm kills a HealthCheckProgram after 60 s and ft_launcher gives up after 60 s: stay well
# inside both unless told otherwise.
DEFAULT_TIMEOUT_S = 40.0


@dataclass(frozen=True)
class Selection:
    """Which host this is and what it should be (the suite's selection options)."""

    host: str | None = None
    inventory: str | None = None
    profile: str | None = None
    expected_gpus: int | None = None
    profile_dir: Path | None = None
    root: str = "/"
    timeout_s: float = DEFAULT_TIMEOUT_S
    # idle, in-use or auto; None: the inventory's node_state (the suite's, default idle).
    node_state: str | None = None
    slurm_node: str | None = None  # this node's Slurm name, for auto (default: slurmd's)
    kubelet_socket: str = kubelet.SOCKET  # the kubelet's pod-resources API, for auto

    def name(self) -> str:
        """This host's name in the inventory and the reports (default: the hostname)."""
        return self.host or socket.gethostname()

    def target(self) -> Target:
        """This host with its validated expectations (ConfigError when they are bad)."""
        profiles = ProfileSet(self.profile_dir)
        cli = {
            "inventory": self.inventory,
            "profile": self.profile,
            "expected_gpus": self.expected_gpus,
            "overrides": {"node_state": self.node_state} if self.node_state else {},
        }
        return inventory_target(self.name(), profiles, cli)


@dataclass
class LocalVerdict:
    """One judgement of this host: its verdict, every outcome, when and how long."""

    host: str
    verdict: reporting.NodeVerdict
    outcomes: list[reporting.Outcome]
    checked_at: float
    duration_s: float
    facts: dict[str, Any] | None = None
    limits: Profile | None = None  # what the facts were judged by (exporters read them)

    @property
    def node_state(self) -> str | None:
        """The state the node was judged in (None: the probe failed before deciding)."""
        return self.verdict.node_state

    @property
    def node_state_source(self) -> str | None:
        """Why it was judged in that state, in words."""
        return self.verdict.node_state_source

    def verdict_document(self) -> reporting.VerdictDocument:
        """The judgement as every entry point's verdict document."""
        return reporting.VerdictDocument(
            [self.verdict], self.outcomes, self.checked_at, self.duration_s
        )

    def document(self) -> dict[str, Any]:
        """The JSON answer of node-check --json and of the health service: `fail_count` and
        `failed_checks` as ft_launcher's client reads them, then the verdict and its reasons."""
        return self.verdict_document().node_json()

    def headline(self) -> str:
        """One line: the verdict and its first reason (NPD's message, a drain reason)."""
        return reporting.headline(self.verdict.verdict, self.verdict.reasons)


def run_local_probe(config: dict[str, Any], python: str, timeout_s: float) -> dict[str, Any]:
    """The facts document of this machine from the shipped probe, run as a child process in its
    own session: on the deadline the whole group is killed, whatever it was waiting for."""
    call = probe_call(config, python, timeout_s)
    proc = subprocess.Popen(
        ["/bin/sh", "-c", call.command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(call.stdin, timeout=timeout_s + 5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:  # stuck in the kernel (D state): SIGKILL waits
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
            raise ProbeError(
                f"probe gave no answer within {timeout_s:g} s and could not be killed "
                "(stuck in the kernel?)",
                unreachable=False,
            ) from None
        raise ProbeError(
            f"probe gave no answer within {timeout_s:g} s", unreachable=False
        ) from None
    if proc.returncode == 124:
        raise ProbeError(f"probe killed after {timeout_s:g} s", unreachable=False)
    if proc.returncode != 0:
        raise ProbeError(
            f"probe exited {proc.returncode}: {stderr.strip()[-800:]}", unreachable=False
        )
    return parse_output(stdout)


def quick_checks() -> list[Any]:
    """The checks a node judges on its own: no load test's section, no run history."""
    return [c for c in registry.checks().values() if c.level == "quick" and c.added is None]


def judge_here(selection: Selection, target: Target | None = None) -> LocalVerdict:
    """Probe this machine and judge it; a probe that fails is an ERROR outcome (the node
    fails closed: nothing vouches for it), bad expectations raise ConfigError."""
    target = target or selection.target()
    started, clock = time.time(), time.monotonic()
    profiles = ProfileSet(selection.profile_dir)
    limits = resolve_limits(target.expectations, profiles, None)
    config: dict[str, Any] = {"root": selection.root, "expect": limits.values}
    slurm_node = selection.slurm_node or target.host_vars.get("slurm_node_name")
    if slurm_node:
        config["slurm_node"] = str(slurm_node)
    if limits.values["node_state"] == AUTO:
        hint = kubelet.node_state_hint(selection.kubelet_socket)
        if hint is not None:
            config["node_state_hint"] = hint
    book = reporting.VerdictBook()
    outcomes: list[reporting.Outcome] = []
    facts: dict[str, Any] | None = None
    try:
        facts = run_local_probe(config, target.python, selection.timeout_s)
    except (ProbeError, FactsError) as exc:
        advice = "read the error; re-run, and report it if it is a gpuhealth bug"
        outcomes = [
            reporting.Outcome(
                "probe",
                "ERROR",
                target.name,
                None,
                f"the probe failed: {exc}",
                target.name,
                Action.RERUN.value,
                advice,
            )
        ]
    if facts is not None:
        limits = resolve_limits(target.expectations, profiles, Platform.of(facts))
        verdict, outcomes = judge_facts(target.name, facts, limits)
    else:
        for outcome in outcomes:
            book.add(outcome)
        (verdict,) = book.finish()
    return LocalVerdict(
        target.name, verdict, outcomes, started, time.monotonic() - clock, facts, limits
    )


def judge_facts(
    host: str, facts: dict[str, Any], limits: Profile, state: tuple[str, str] | None = None
) -> tuple[reporting.NodeVerdict, list[reporting.Outcome]]:
    """The quick checks on one node's facts: its verdict and every outcome. `state` (state,
    why) judges them in that node state instead of the one the probe decided."""
    view = NodeView(host, facts, limits, state[0] if state else None)
    book = reporting.VerdictBook()
    book.state(host, view.node_state, state[1] if state else view.node_state_source)
    slots = GPU.slots(view)
    outcomes = [reporting.Outcome.of(f) for f in judged(quick_checks(), view, slots)]
    book.node(host).gpu_slots = slots
    if none_expected(view):
        book.note(host, f"no NVIDIA GPU/driver on {host}; none expected")
    elif limits.note:  # mixed GPUs, a tie, a refused match, a named profile of other GPUs
        book.note(host, limits.note)
    for outcome in outcomes:
        book.add(outcome)
    (verdict,) = book.finish()
    return verdict, outcomes


def rejudged(result: LocalVerdict, state: str, why: str) -> LocalVerdict:
    """`result`'s facts judged again in node state `state` (`why`: the evidence, in words),
    without probing: how serve answers for a job that took the node since its idle verdict
    (in-use rules are a subset of idle ones). A judgement without facts stays as it is."""
    if result.facts is None or result.limits is None:
        return result
    verdict, outcomes = judge_facts(result.host, result.facts, result.limits, (state, why))
    return replace(result, verdict=verdict, outcomes=outcomes)
