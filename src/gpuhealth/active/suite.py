"""The active checks inside the pytest suite: launched once per host, judged like any check.

A test asks for its host's run (`with_active`); the first test of the host launches it, the
others reuse it (all tests of a host share one xdist worker). The run becomes one more section
of the host's facts, so the registered checks judge it exactly as `gpuhealth triage` judges a
saved log. Raw output is kept as evidence: attached to every Allure test that judged it and
written to `reports/evidence/<host>/`.

Load tests must not overlap: a single-node NCCL run on a node while a multi-node run uses it
would make both look slow. Every launch holds a lock file next to the verdicts (shared by
per-node runs, exclusive for the multi-node test), so xdist workers take turns.
"""

from __future__ import annotations

import fcntl
import json
import posixpath
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import allure
import pytest

from gpuhealth import checks
from gpuhealth.active import bisect, runner
from gpuhealth.checks import nccl as nccl_checks
from gpuhealth.config import Profile, resolve_limits
from gpuhealth.plugin import _KEY, Subject
from gpuhealth.targets import Target

Run = tuple[dict[str, Any], list[tuple[str, runner.Outcome]]]

_SLOW_NODE_ACTION = (
    "check this node's NICs (link rate, errors), GPUDirect RDMA (nvidia-peermem), cables and "
    "switch ports; drain it until it passes"
)
_FABRIC_ACTION = "check the fabric (switches, routing) and the NCCL settings, then re-run"


@contextmanager
def _load_lock(state: dict[str, Any], exclusive: bool) -> Iterator[None]:
    path = Path(state["verdicts"]).with_name(".gpuhealth-active.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _keep(state: dict[str, Any], host: str, name: str, outcome: runner.Outcome) -> None:
    """Write a run's raw output to reports/evidence/<host>/<name>.log (triage reads it back)."""
    folder = Path(state["save_facts"]).parent / "evidence" / host
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.log").write_text(outcome.log)


def _attach(name: str, outcome: runner.Outcome) -> None:
    allure.attach(outcome.log, name=f"{name}.log", attachment_type=allure.attachment_type.TEXT)


def _launch(state: dict[str, Any], host: Any, command: str, timeout_s: float) -> runner.Outcome:
    with _load_lock(state, exclusive=False):
        return runner.run_on(host, command, timeout_s)


def _nccl(state: dict[str, Any], target: Target, view: checks.NodeView, level: str) -> Run:
    limits = view.limits
    gpus = view.expected_gpus or view.facts.get("gpu_count") or len(view.facts.get("gpus") or [])
    if not gpus:
        return {"skip": f"no NVIDIA GPU on {view.host} and none expected"}, []
    binary = posixpath.join(limits["nccl_tests_dir"], "all_reduce_perf")
    command = runner.nccl_single_command(binary, limits["nccl_sizes"], gpus)
    outcome = _launch(state, target.host, command, limits["nccl_timeout_s"])
    _keep(state, view.host, "nccl-all_reduce_perf", outcome)
    section = runner.nccl_section(outcome, [view.host], "nccl_timeout_s")
    return section, [(f"nccl all_reduce_perf {view.host}", outcome)]


def dcgm_level(limits: Profile, level: str) -> int:
    """`dcgm_diag_level` when set, else 2 at --level standard and 3 at --level full."""
    configured = limits["dcgm_diag_level"]
    return configured if configured is not None else (3 if level == "full" else 2)


def _dcgm(state: dict[str, Any], target: Target, view: checks.NodeView, level: str) -> Run:
    limits = view.limits
    if not limits["dcgm_installed"]:
        return {"skip": "DCGM not expected on this host (dcgm_installed: false)"}, []
    diag_level = dcgm_level(limits, level)
    if diag_level not in runner.DCGM_TIMEOUTS_S:
        return {
            "level": diag_level,
            "error": f"dcgm_diag_level {diag_level} is not a DCGM run level",
            "action": "set dcgm_diag_level to 1, 2, 3 or 4 (or null: 2 at standard, 3 at full)",
            "diag": None,
        }, []
    timeout = limits["dcgm_diag_timeout_s"] or runner.DCGM_TIMEOUTS_S[diag_level]
    command = f"dcgmi diag -r {diag_level} -j"
    outcome = _launch(state, target.host, command, timeout)
    _keep(state, view.host, f"dcgmi-diag-r{diag_level}", outcome)
    section = runner.dcgm_section(outcome, diag_level, "dcgm_diag_timeout_s")
    return section, [(f"dcgmi diag -r {diag_level} {view.host}", outcome)]


_RUNNERS: dict[str, Callable[[dict[str, Any], Target, checks.NodeView, str], Run]] = {
    "nccl": _nccl,
    "dcgm": _dcgm,
}


def with_active(subject: Subject, kind: str) -> Subject:
    """The subject with its host's active run (`nccl` or `dcgm`) added to its facts."""
    item = subject.item
    state = item.config.stash[_KEY]
    view = subject.view
    target: Target = state["targets"][view.host]
    if target.host is None:
        pytest.skip("active checks need a live host: not run on saved facts (--facts)")
    cache = state.setdefault("active", {})
    if (view.host, kind) not in cache:
        cache[(view.host, kind)] = _RUNNERS[kind](state, target, view, item.config.option.level)
    section, outcomes = cache[(view.host, kind)]
    for name, outcome in outcomes:
        _attach(name, outcome)
    facts = {**view.facts, kind: section}
    return Subject(checks.NodeView(view.host, facts, view.limits), subject.index, item)


def attach_json(name: str, value: Any) -> None:
    """Attach structured evidence (GPUd events, DCGM incidents) to the current Allure test."""
    allure.attach(
        json.dumps(value, indent=2), name=name, attachment_type=allure.attachment_type.JSON
    )


# ---------------------------------------------------------------- multi-node NCCL


class _Fleet:
    """Launches nccl-tests over subsets of the hosts, each judged by the NCCL checks."""

    def __init__(self, state: dict[str, Any], limits: Profile, gpus: int) -> None:
        self.state = state
        self.limits = limits
        self.gpus = gpus
        self.trials: list[tuple[tuple[str, ...], str]] = []

    def run(self, nodes: tuple[str, ...]) -> tuple[list[checks.Result], dict[str, Any]]:
        limits = self.limits
        binary = posixpath.join(limits["nccl_tests_dir"], "all_reduce_perf")
        command = runner.nccl_multi_command(
            limits["nccl_launcher"],
            limits["nccl_launcher_args"],
            binary,
            limits["nccl_sizes"],
            list(nodes),
            self.gpus,
        )
        launcher = self.state["targets"][nodes[0]].host
        outcome = runner.run_on(launcher, command, limits["nccl_timeout_s"])
        name = f"nccl-multinode-{'+'.join(nodes)}"
        _keep(self.state, nodes[0], name, outcome)
        _attach(name, outcome)
        section = runner.nccl_section(outcome, list(nodes), "nccl_timeout_s")
        view = checks.NodeView("+".join(nodes), {"source": "active", "nccl": section}, limits)
        results = [
            checks.evaluate(check, view) for check in ("nccl_bandwidth", "nccl_data_integrity")
        ]
        self.trials.append((nodes, self.short(section)))
        return results, section

    def short(self, section: dict[str, Any]) -> str:
        if section.get("error"):
            return section["error"][:120]
        reference = self.limits["nccl_reference_size_bytes"]
        best = nccl_checks.best_busbw(section["run"]["rows"], reference)
        return f"{best[0]:.1f} GB/s" if best else "no busbw"

    def fast(self, nodes: tuple[str, ...]) -> bool:
        results, _ = self.run(nodes)
        return all(r.status == checks.PASS for r in results)


def _fleet_limits(state: dict[str, Any], targets: list[Target]) -> Profile:
    """The first host's limits, without probing (a second probe of a host breaks the rule of
    one probe per host): the inventory must name the profile or the thresholds."""
    return resolve_limits(targets[0].expectations, state["profiles"], None)


def run_fleet_nccl(item: pytest.Item) -> None:
    """All hosts in one nccl-tests run; below threshold, bisect to name the slow nodes.

    The verdict of each node gets its part through the `gpuhealth.fleet` user property: a
    FAIL for each slow node, a note for the others.
    """
    state = item.config.stash[_KEY]
    targets: list[Target] = list(state["targets"].values())
    allure.dynamic.parent_suite("fleet")
    allure.dynamic.suite("nccl")
    allure.dynamic.label("check", "nccl_multinode")
    if any(t.host is None for t in targets):
        pytest.skip("active checks need live hosts: not run on saved facts (--facts)")
    if len(targets) < 2:
        pytest.skip(f"multi-node NCCL needs at least 2 hosts; this run has {len(targets)}")
    limits = _fleet_limits(state, targets)
    gpus = limits["gpu_count"]
    if not gpus:
        pytest.skip(
            "GPUs per node unknown: set gpu_profile or gpu_count in the inventory (the rank "
            "layout of a multi-node run comes from it, not from probing)"
        )
    names = [t.name for t in targets]
    fleet = _Fleet(state, limits, gpus)
    with _load_lock(state, exclusive=True):
        results, section = fleet.run(tuple(names))
        bad = [r for r in results if r.status == checks.FAIL]
        found = None
        if bad and not str(section.get("error") or "").startswith("not found"):
            found = bisect.bisect(names, fleet.fast)
    _report(item, names, results, found, fleet.trials, limits[nccl_checks.INTER_KEY])


def _why_unnamed(found: bisect.Bisection | None, count: int) -> str:
    if found is None:
        return "not bisected: the launch itself failed"
    if count == 2:
        return "two nodes cannot be told apart; add a third"
    if found.unresolved:
        return "no subset tried was fast: suspect the fabric as a whole"
    return "no node was slow with a fast partner: the set is slow only together (spine, routing)"


def _finding(host: str, status: str, message: str, action: str | None = None) -> dict[str, Any]:
    entry = {"check": "nccl_multinode", "host": host, "status": status, "message": message}
    return {**entry, "action": action}


def _report(
    item: pytest.Item,
    names: list[str],
    results: list[checks.Result],
    found: bisect.Bisection | None,
    trials: list[tuple[tuple[str, ...], str]],
    threshold: float | None,
) -> None:
    """Per-node findings for the verdicts (gpuhealth.fleet property), then the test outcome."""
    bad = [r for r in results if r.status == checks.FAIL]
    headline = "; ".join(r.message.split(". Action: ")[0] for r in (bad or results))
    whole = f"all {len(names)} nodes: {trials[0][1]}"
    if threshold is not None:
        whole += f" (expected >= {threshold:g} GB/s)"
    bisected = trials[1:]
    findings = []
    for name in names:
        if not bad:
            findings.append(_finding(name, "NOTE", headline))
        elif found and name in found.slow:
            seen = "; ".join(f"{'+'.join(n)}: {text}" for n, text in bisected if name in n)
            message = f"{name} is slow in multi-node all_reduce ({seen}); {whole}"
            findings.append(_finding(name, checks.FAIL, message, _SLOW_NODE_ACTION))
        elif found and found.slow:
            slow = ", ".join(found.slow)
            message = f"multi-node all_reduce below threshold ({whole}); bisection named {slow}"
            findings.append(_finding(name, "NOTE", f"{message}; {name} was fast"))
        else:
            why = _why_unnamed(found, len(names))
            message = f"multi-node all_reduce failed: {headline}; bisection named no node ({why})"
            findings.append(_finding(name, checks.WARN, message, _FABRIC_ACTION))
    item.user_properties.append(("gpuhealth.fleet", json.dumps(findings)))
    if bad:
        named = f" | slow node(s): {', '.join(found.slow)}" if found and found.slow else ""
        runs = "; ".join(f"{'+'.join(n)}: {text}" for n, text in bisected)
        pytest.fail(f"{headline}{named}" + (f" | bisection runs: {runs}" if runs else ""), False)
    if all(r.status == checks.SKIP for r in results):
        pytest.skip(headline)
