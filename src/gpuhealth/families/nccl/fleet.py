"""Multi-node NCCL (`--level full`): one all_reduce over every host, bisection when it is slow;
or, with `--nccl-log FILE`, the logs of runs the scheduler launched across an allocation.

A set of nodes is as fast as its slowest member, so a slow run names no one: bisection
(gpuhealth.active.bisect) measures subsets until the slow node(s) stand out. Each node's
verdict gets its part (a FAIL for a slow node, a note for the others) through the test's
`fleet` entry of its record (gpuhealth.plugin.record).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuhealth.active import bisect
from gpuhealth.active.runner import Outcome
from gpuhealth.checks import NodeView, evaluate
from gpuhealth.config import Profile, resolve_limits
from gpuhealth.documents import MAX_BYTES, FactsError, read_bounded
from gpuhealth.families.nccl import active
from gpuhealth.families.nccl.checks import best_busbw, internode_floor, nodes_of
from gpuhealth.families.nccl.evidence import evidence
from gpuhealth.families.nccl.limits import NcclLimits
from gpuhealth.limits import SharedLimits
from gpuhealth.plugin import RunState, record, redact, run_state
from gpuhealth.registry import check
from gpuhealth.results import Action, Result, Status
from gpuhealth.targets import Target

_SLOW_NODE_ADVICE = (
    "check this node's NICs (link rate, errors), GPUDirect RDMA (nvidia-peermem), cables and "
    "switch ports; drain it until it passes"
)
_FABRIC_ADVICE = "check the fabric (switches, routing) and the NCCL settings, then re-run"


class _Fleet:
    """Launches nccl-tests over subsets of the hosts, each judged by the NCCL checks."""

    def __init__(self, state: RunState, item: pytest.Item, limits: Profile, gpus: int) -> None:
        self.state = state
        self.item = item
        self.limits = limits
        self.gpus = gpus
        self.trials: list[tuple[tuple[str, ...], str]] = []

    def run(self, nodes: tuple[str, ...]) -> tuple[list[Result], dict[str, Any]]:
        lim = self.limits.get(NcclLimits)
        command = active.multi_command(
            lim.nccl_launcher,
            lim.nccl_launcher_args,
            active.binary(lim),
            lim.nccl_sizes,
            list(nodes),
            self.gpus,
        )
        launcher = self.state.targets[nodes[0]]
        name = f"nccl-multinode-{'+'.join(nodes)}"
        outcome = self.state.launch(launcher, name, command, lim.nccl_timeout_s, locked=True)
        self.state.attach(self.item, f"{name}.log", redact(outcome.log), "text")
        section = active.section_of(outcome, list(nodes), "nccl_timeout_s")
        section["nvlink_domains"] = self.domains(nodes)
        return self.judged("+".join(nodes), nodes, section), section

    def judged(self, label: str, nodes: tuple[str, ...], section: dict[str, Any]) -> list[Result]:
        """The NCCL checks on one run's section, the run noted among the trials."""
        view = NodeView(label, {"source": "active", "nccl": section}, self.limits)
        results = [
            evaluate(check(name), view).result for name in ("nccl_bandwidth", "nccl_data_integrity")
        ]
        self.trials.append((nodes, self.short(section)))
        return results

    def domains(self, nodes: tuple[str, ...]) -> int | None:
        """How many NVLink domains (inventory nvlink_domain) the nodes span; None when a node
        has none (its NVLink domain unknown), which leaves a per-domain floor unjudged."""
        found = set()
        for name in nodes:
            target = self.state.targets[name]
            limits = resolve_limits(target.expectations, self.state.profiles, None)
            found.add(limits.get(SharedLimits).nvlink_domain)
        return None if None in found else len(found)

    def short(self, section: dict[str, Any]) -> str:
        if section.get("error"):
            return str(section["error"])[:120]
        reference = self.limits.get(NcclLimits).nccl_reference_size_bytes
        best = best_busbw(section["run"]["rows"], reference)
        return f"{best[0]:.1f} GB/s" if best else "no busbw"

    def fast(self, nodes: tuple[str, ...]) -> bool:
        results, _ = self.run(nodes)
        return all(r.status is Status.PASS for r in results)


def _fleet_limits(state: RunState, targets: list[Target]) -> Profile:
    """The first host's limits, without probing (a second probe of a host breaks the rule of
    one probe per host): the inventory must name the profile or the thresholds."""
    return resolve_limits(targets[0].expectations, state.profiles, None)


def run_fleet_nccl(item: pytest.Item) -> None:
    """All hosts in one nccl-tests run; below threshold, bisect to name the slow nodes."""
    state = run_state(item.config)
    targets = list(state.targets.values())
    logs = item.config.option.nccl_log
    if logs:
        _judge_logs(item, state, [Path(log) for log in logs])
        return
    if any(t.host is None for t in targets):
        pytest.skip(
            "active checks need live hosts: not run on saved facts (--facts); judge the log "
            "of a multi-node run the scheduler launched with --nccl-log FILE"
        )
    if len(targets) < 2:
        pytest.skip(f"multi-node NCCL needs at least 2 hosts; this run has {len(targets)}")
    limits = _fleet_limits(state, targets)
    gpus = limits.values.get("gpu_count")
    if not gpus:
        pytest.skip(
            "GPUs per node unknown: set gpu_profile or gpu_count in the inventory (the rank "
            "layout of a multi-node run comes from it, not from probing)"
        )
    names = [t.name for t in targets]
    fleet = _Fleet(state, item, limits, gpus)
    with state.load_lock(exclusive=True):
        results, section = fleet.run(tuple(names))
        bad = [r for r in results if r.status is Status.FAIL]
        found = None
        if bad and not str(section.get("error") or "").startswith("not found"):
            found = bisect.bisect(names, fleet.fast)
    nodes = nodes_of(section)
    threshold = internode_floor(limits, nodes or len(names))[1]
    _report(item, names, results, found, fleet.trials, threshold, nodes)


def _judge_logs(item: pytest.Item, state: RunState, paths: list[Path]) -> None:
    """Multi-node runs the scheduler launched across an allocation (srun or mpirun, README
    "Fleets beyond one controller"), judged from their logs: each log is one node group,
    judged by the same checks and floors as a run launched here; every node of a group gets
    its part (a note, or a warning when the group is slow: a log cannot be bisected)."""
    targets = list(state.targets.values())
    limits = _fleet_limits(state, targets)
    fleet = _Fleet(state, item, limits, 0)
    known = {t.name: t.name for t in targets}
    known.update((t.name.split(".")[0], t.name) for t in targets)
    findings: list[dict[str, Any]] = []
    failed, judged = [], []
    unjudged = True  # every check of every log skipped
    for path in paths:
        try:
            text = read_bounded(path, MAX_BYTES)
        except OSError as exc:
            raise FactsError(f"--nccl-log {path}: cannot read: {exc.strerror or exc}") from None
        section = evidence(text)["nccl"]
        hosts = section["hosts"] or []
        found = [known.get(h, known.get(h.split(".")[0])) for h in hosts]
        members = tuple(dict.fromkeys(name for name in found if name))
        section["nvlink_domains"] = fleet.domains(members) if members else None
        name = f"nccl-multinode-{path.stem}"
        outcome = Outcome(f"# saved log {path}", None, text, "", None)
        state.attach(item, f"{name}.log", redact(outcome.log), "text")
        if members:
            state.keep(members[0], name, outcome)
        results = fleet.judged(path.name, members, section)
        bad = [r for r in results if r.status is Status.FAIL]
        unjudged = unjudged and all(r.status is Status.SKIP for r in results)
        nodes = nodes_of(section)
        headline = "; ".join(r.message for r in (bad or results))
        group = f"{path.name} ({f'{nodes} nodes' if nodes else 'node count unknown'})"
        outside = sorted({h for h, n in zip(hosts, found, strict=True) if n is None})
        if outside:
            headline += f"; its hosts not in this run: {', '.join(outside)}"
        judged.append(f"{group}: {headline}")
        for member in members:
            if not bad:
                findings.append(_finding(member, "NOTE", f"{group}: {headline}"))
                continue
            message = (
                f"multi-node all_reduce of {group} failed: {headline}; a saved log names no "
                "slow node: run the group again in halves to find it"
            )
            findings.append(_finding(member, "WARN", message, Action.INSPECT, _FABRIC_ADVICE))
        if bad:
            failed.append(f"{group}: {headline}")
    _finish(item, findings, " | ".join(failed) or None, " | ".join(judged) if unjudged else None)


def _why_unnamed(found: bisect.Bisection | None, count: int) -> str:
    if found is None:
        return "not bisected: the launch itself failed"
    if count == 2:
        return "two nodes cannot be told apart; add a third"
    if found.unresolved:
        return "no subset tried was fast: suspect the fabric as a whole"
    return "no node was slow with a fast partner: the set is slow only together (spine, routing)"


def _finding(
    host: str, status: str, message: str, action: Action = Action.NONE, advice: str | None = None
) -> dict[str, Any]:
    return {
        "check": "nccl_multinode",
        "host": host,
        "status": status,
        "message": message,
        "action": action.value,
        "advice": advice,
    }


def _report(
    item: pytest.Item,
    names: list[str],
    results: list[Result],
    found: bisect.Bisection | None,
    trials: list[tuple[tuple[str, ...], str]],
    threshold: float | None,
    nodes: int | None,
) -> None:
    """Per-node findings for the verdicts (the `fleet` entry of its record), then the outcome."""
    bad = [r for r in results if r.status is Status.FAIL]
    headline = "; ".join(r.message for r in (bad or results))
    whole = f"all {nodes or len(names)} nodes: {trials[0][1]}"
    if threshold is not None:
        whole += f" (expected >= {threshold:g} GB/s)"
    bisected = trials[1:]
    findings = []
    for name in names:
        if not bad:
            findings.append(_finding(name, "NOTE", headline))
        elif found and name in found.slow:
            seen = "; ".join(f"{'+'.join(n)}: {text}" for n, text in bisected if name in n)
            message = f"slow in multi-node all_reduce ({seen}); {whole}"
            findings.append(_finding(name, "FAIL", message, Action.DRAIN, _SLOW_NODE_ADVICE))
        elif found and found.slow:
            slow = ", ".join(found.slow)
            message = f"multi-node all_reduce below threshold ({whole}); bisection named {slow}"
            findings.append(_finding(name, "NOTE", f"{message}; {name} was fast"))
        else:
            why = _why_unnamed(found, len(names))
            message = f"multi-node all_reduce failed: {headline}; bisection named no node ({why})"
            findings.append(_finding(name, "WARN", message, Action.INSPECT, _FABRIC_ADVICE))
    failure = None
    if bad:
        named = f" | slow node(s): {', '.join(found.slow)}" if found and found.slow else ""
        runs = "; ".join(f"{'+'.join(n)}: {text}" for n, text in bisected)
        failure = f"{headline}{named}" + (f" | bisection runs: {runs}" if runs else "")
    _finish(
        item, findings, failure, headline if all(r.status is Status.SKIP for r in results) else None
    )


def _finish(
    item: pytest.Item, findings: list[dict[str, Any]], failure: str | None, skip: str | None
) -> None:
    """Each node's part to the verdicts (the `fleet` entry of the test's record), then the
    test's outcome: failed, skipped (nothing was judged) or passed."""
    record(item).fleet = findings
    if failure:
        pytest.fail(failure, False)
    if skip:
        pytest.skip(skip)
