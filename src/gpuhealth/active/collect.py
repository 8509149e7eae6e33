"""Load tests at fleet scale: run on the nodes by the fleet recipes, carried in the facts.

`pytest --hosts` launches a load test from the controller (gpuhealth.plugin.with_active).
Fleets gathered with collect.yml or srun run them on the nodes instead, with the same code:
`plan` asks each family's load test (its registry ActiveRun) for its launches at the level,
noting the commands a live run would launch; the node runs them (gpuhealth.active.node); then
`load_results` runs the family's code again, answering each launch with what the node
reported, so the outputs are read exactly as a live run reads its own. The facts document
carries each section (`nccl`, `dcgm`) with its raw outputs under `launches`, and `load_level`
says what was asked for: `pytest --facts` judges, records and attaches them as a live run
does (`saved_run`), and facts that claim a level without its results fail, never pass.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuhealth import registry
from gpuhealth.active import LEVELS, level_allows, node
from gpuhealth.active.runner import ActiveContext, Outcome, Run
from gpuhealth.checks import NodeView
from gpuhealth.config import (
    Platform,
    Profile,
    ProfileSet,
    expectations_from_vars,
    limits_model,
    resolve_limits,
)
from gpuhealth.documents import MAX_TEXT
from gpuhealth.facts import skipped
from gpuhealth.results import Action

LEVEL_KEY = "load_level"  # the level the facts were collected at (quick: no load tests)
RAW_KEY = "launches"  # a section's raw outputs, as gpuhealth.active.node reports them
IN_USE = "not run: the node is in use (load tests run on idle nodes only)"
# Each output kept in the facts: its start and end, within a facts document's text limit.
KEPT_CHARS = MAX_TEXT - 4096
# The controller's bound on the whole node run, past every launch's own bound.
TRANSPORT_GRACE_S = 60


@dataclass(frozen=True)
class Planned:
    """One launch for the node to run: what a live run would launch, and for which section."""

    section: str
    name: str
    command: str
    timeout_s: float


def runs_at(level: str) -> list[registry.ActiveRun]:
    """The load tests a run at `level` includes."""
    if level not in LEVELS:
        raise ValueError(f"level {level!r}: use one of {', '.join(LEVELS)}")
    return [
        run
        for family in registry.families()
        for run in family.active
        if level_allows(level, run.level)
    ]


def plan(view: NodeView, level: str) -> list[Planned]:
    """The launches of every load test at `level` for this node (none on a node in use)."""
    planned: list[Planned] = []
    if view.in_use:
        return planned
    for run in runs_at(level):

        def note(name: str, command: str, timeout_s: float, section: str = run.section) -> Outcome:
            planned.append(Planned(section, name, command, float(timeout_s)))
            return Outcome(command, None, "", "", None, "planned, not run")

        run.launch(ActiveContext(view, level, note))
    return planned


def load_results(
    view: NodeView, level: str, done: list[dict[str, Any]], failure: str | None = None
) -> dict[str, Any]:
    """What the facts document gets: `load_level` and every load test's section at `level`,
    read from the node's records (`done`, gpuhealth.active.node.run_plan's). A launch the
    node did not report is a failed one, with `failure` (why the node reported nothing)."""
    outcomes = {str(r.get("name")): outcome_of(r) for r in done}

    def replay(name: str, command: str, timeout_s: float) -> Outcome:
        got = outcomes.get(name)
        if got is not None and got.command == command:
            return got
        why = failure or "the node reported no outcome of this launch"
        return Outcome(command, None, "", "", None, why)

    found: dict[str, Any] = {LEVEL_KEY: level}
    for run in runs_at(level):
        if view.in_use:
            found[run.section] = skipped(IN_USE)
            continue
        section, kept = run.launch(ActiveContext(view, level, replay))
        if kept:
            section = {**section, RAW_KEY: [raw(name, outcome) for name, outcome in kept]}
        found[run.section] = section
    return found


def outcome_of(record: dict[str, Any]) -> Outcome:
    """A launch's Outcome from its record (the node's report, or a saved facts document)."""
    rc = record.get("rc")
    took = record.get("duration_s")
    return Outcome(
        str(record.get("command") or ""),
        rc if isinstance(rc, int) and not isinstance(rc, bool) else None,
        str(record.get("stdout") or ""),
        str(record.get("stderr") or ""),
        float(took) if isinstance(took, (int, float)) and not isinstance(took, bool) else None,
        None if record.get("error") is None else str(record["error"]),
        record.get("timed_out") is True,
    )


def raw(name: str, outcome: Outcome) -> dict[str, Any]:
    """A launch as the facts carry it, each output cut to its start and end if it is long."""
    return {
        "name": name,
        "command": outcome.command,
        "rc": outcome.rc,
        "stdout": _cut(outcome.stdout),
        "stderr": _cut(outcome.stderr),
        "duration_s": outcome.duration_s,
        "error": outcome.error,
        "timed_out": outcome.timed_out,
    }


def _cut(text: str) -> str:
    if len(text) <= KEPT_CHARS:
        return text
    head = KEPT_CHARS // 4
    tail = KEPT_CHARS - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n... gpuhealth: {cut} characters cut ...\n{text[-tail:]}"


# ---------------------------------------------------------------- collect.yml


def host_limits(hostvars: dict[str, Any], facts: dict[str, Any]) -> Profile:
    """The limits of an inventory host as the suite resolves them once its facts are in: its
    inventory vars (the gpuhealth ones) over its profile, named or matched from the facts."""
    host = str(hostvars.get("inventory_hostname", "host"))
    names = (*limits_model().model_fields, "gpu_profile", "nvidia_driver_branch")
    known = {key: hostvars[key] for key in names if key in hostvars}
    profiles = ProfileSet()
    expectations = expectations_from_vars(host, known, profiles)
    return resolve_limits(expectations, profiles, Platform.of(facts))


def node_call(view: NodeView, level: str, python: str = "python3") -> dict[str, Any]:
    """How collect.yml runs the load tests on a node: `argv` (the node runner's source as
    `python -c`), `stdin` (the plan, JSON) and `timeout_s` (the controller's bound)."""
    planned = plan(view, level)
    bound = TRANSPORT_GRACE_S + sum(
        node.wrap(p.command, p.timeout_s)[1] + node.KILL_GRACE_S + node.PIPE_GRACE_S
        for p in planned
    )
    return {
        "argv": [python, "-c", Path(node.__file__).read_text()],
        "stdin": json.dumps([asdict(p) for p in planned]),
        "timeout_s": bound,
    }


def node_report(stdout: str) -> list[dict[str, Any]]:
    """The records the node runner printed (its marked JSON line; login banners precede)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                found = json.loads(line).get(node.MARK)
            except (ValueError, AttributeError):
                continue
            if isinstance(found, list) and all(isinstance(r, dict) for r in found):
                return found
    raise ValueError("the node printed no load-test report")


# ---------------------------------------------------------------- on the node (srun)


def on_this_node(facts: dict[str, Any], limits: Profile, level: str) -> dict[str, Any]:
    """The load tests at `level` run here, on the node the facts describe (`gpuhealth probe
    --level`, as an srun task): what its facts document gets."""
    host = str((facts.get("host") or {}).get("hostname") or "localhost")
    view = NodeView(host, facts, limits)
    done = node.run_plan([asdict(p) for p in plan(view, level)])
    return load_results(view, level, done)


# ---------------------------------------------------------------- judging saved facts


def saved_run(view: NodeView, section: str, level: str) -> Run | str:
    """A saved facts document's load test `section` as a live run at `level` would have it:
    the section and its raw outputs, a failed section where the facts claim its level without
    it, or why there is nothing to judge (a reason to skip): no load tests in the facts, or
    those of a lower level than `level` runs (`dcgmi diag -r 2` judged at --level full)."""
    facts = view.facts
    value = facts.get(section)
    claimed = facts.get(LEVEL_KEY)
    if isinstance(value, dict):
        kept = value.get(RAW_KEY) or []
        run = [(str(r.get("name")), outcome_of(r)) for r in kept if isinstance(r, dict)]
        if claimed in LEVELS and not level_allows(claimed, level):
            carried = [outcome.command for _, outcome in run]
            wanted = [p.command for p in plan(view, level) if p.section == section]
            if wanted != carried:
                return (
                    f"these facts carry `{'`, `'.join(carried)}` (collected at level {claimed}); "
                    f"level {level} runs `{'`, `'.join(wanted)}`: collect with -e level={level}"
                )
        return value, run
    needed = registry.active_run(section).level
    if claimed in LEVELS and level_allows(claimed, needed):
        failed = {
            "error": f"the facts were collected at level {claimed} but carry no {section} results",
            "action": Action.RERUN.value,
            "advice": "collect them again at that level and read what the collection said "
            "about this node",
        }
        return failed, []
    return (
        f"active checks need a live host, or facts collected at level {needed} "
        f"(collect.yml -e level={needed}, or gpuhealth probe --level {needed}); these facts "
        f"were collected at level {claimed or 'quick'}"
    )
