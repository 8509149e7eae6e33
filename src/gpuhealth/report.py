"""Per-node verdicts: PASS / WARN / FAIL / UNREACHABLE with the reasons and actions.

The verdict is what an on-call engineer and a drain script act on, so it is built from the same
findings whether they came from pytest or from `gpuhealth triage`: reasons ordered by severity
(hardware and driver first, then fabric and storage, then configuration and software), one
reason per distinct problem however many GPUs share it, and the action codes to take.
"""

from __future__ import annotations

import html
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

from gpuhealth import registry
from gpuhealth.checks import Finding
from gpuhealth.results import Action, Shared

# NOT_CHECKED: no check passed, warned or failed for the host (all deselected or skipped), so
# nothing vouches for it; it ranks between a healthy and a failing node.
ORDER = {"PASS": 0, "WARN": 1, "NOT_CHECKED": 2, "FAIL": 3, "UNREACHABLE": 4}
VERDICTS = tuple(sorted(ORDER, key=ORDER.__getitem__))  # every verdict a node gets
_UNKNOWN_RANK = (3, 10_000)


@dataclass
class Outcome:
    """What the report knows of one check on one host (and GPU).

    `status` is a check status (PASS, WARN, FAIL, SKIP) or ERROR (the check could not run);
    `message` is what was measured against what was expected, `label` names host and GPU.
    """

    check: str
    status: str
    host: str
    gpu: int | None
    message: str
    label: str
    action: str = Action.NONE.value
    advice: str | None = None

    @classmethod
    def of(cls, finding: Finding) -> Outcome:
        """The report's view of a check's finding."""
        result = finding.result
        return cls(
            finding.check,
            result.status.value,
            finding.host,
            finding.gpu,
            result.message,
            finding.label,
            result.action.value,
            result.advice,
        )

    @property
    def text(self) -> str:
        """Its message after the host and GPU it names (the message alone where its label is
        empty: an answer's own finding names no one)."""
        return f"{self.label}: {self.message}" if self.label else self.message

    def entry(self) -> dict[str, Any]:
        """The outcome as listed under a node in verdicts.json."""
        return {
            "check": self.check,
            "gpu": self.gpu,
            "message": self.text,
            "action": self.action,
            "advice": self.advice,
        }


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
    advice: list[str] = field(default_factory=list)
    # Changes against the node's own history: {"check", "gpu", "metric", "baseline", "value",
    # "message", "action"} (families/history; a node that passed last run and fails now too).
    regressions: list[dict[str, Any]] = field(default_factory=list)
    # How many GPU slots the host was judged on (per-GPU labels and metrics cover each).
    gpu_slots: int | None = None
    # The node state it was judged in (idle: every rule; in-use: fault rules only), and why.
    node_state: str | None = None
    node_state_source: str | None = None


@cache
def _ranks() -> dict[str, tuple[int, int]]:
    ranks = registry.ranks()
    return {chk.name: (ranks[chk.group], i) for i, chk in enumerate(registry.checks().values())}


def _rank(check: str) -> tuple[int, int]:
    """Where a check's findings stand in a node's reasons: by group, then report order."""
    return _ranks().get(check, _UNKNOWN_RANK)


def gpu_ranges(indices: list[int]) -> str:
    """[0, 1, 2, 3, 5] -> "gpu0-3, gpu5"."""
    parts: list[str] = []
    ordered = sorted(set(indices))
    start = 0
    for i in range(1, len(ordered) + 1):
        if i == len(ordered) or ordered[i] != ordered[i - 1] + 1:
            low, high = ordered[start], ordered[i - 1]
            parts.append(f"gpu{low}" if low == high else f"gpu{low}-{high}")
            start = i
    return ", ".join(parts)


def _summarise(outcomes: list[Outcome]) -> tuple[list[str], list[str], list[str]]:
    """One reason per distinct problem, most severe first, naming the checks and GPUs that saw
    it; the distinct action codes, most drastic first; and the advice, in reason order."""
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for outcome in outcomes:
        groups.setdefault((outcome.status, outcome.message), []).append(outcome)

    def order(group: list[Outcome]) -> tuple[Any, ...]:
        first = min(group, key=lambda o: (_rank(o.check), o.gpu if o.gpu is not None else -1))
        return (group[0].status != "FAIL", _rank(first.check), first.gpu or 0)

    reasons: list[str] = []
    advice: list[str] = []
    codes: set[str] = set()
    for group in sorted(groups.values(), key=order):
        checks = list(dict.fromkeys(o.check for o in group))
        gpus = sorted({o.gpu for o in group if o.gpu is not None})
        if len(gpus) > 1:
            where = f"{group[0].host} {gpu_ranges(gpus)}"
        else:
            where = min(group, key=lambda o: o.gpu is None).label
        reasons.append(f"{where}: {group[0].message} [{', '.join(checks)}]")
        for outcome in group:
            codes.add(outcome.action)
            if outcome.advice and outcome.advice not in advice:
                advice.append(outcome.advice)
    ranked = sorted(codes, key=lambda c: Action(c).rank if c in Action.__members__ else 99)
    return reasons, [c for c in ranked if c != Action.NONE.value], advice


def shared_outcomes(reported: list[tuple[str, Shared]]) -> list[Outcome]:
    """Each reporting host's outcome of the fleet checks that compare a value across the nodes
    of one inventory group (results.Shared): PASS when it agrees with the rest of its group;
    FAIL when it differs from the value most of its group reports (FIX_CONFIG), when its group
    has no majority (INSPECT: which node is wrong cannot be told), or when nodes of another
    group report the same value (the inventory splits one domain: FIX_CONFIG). A group of one
    reporting node is a SKIP: nothing to compare."""
    groups: dict[tuple[str, str], dict[str, Shared]] = {}
    for host, shared in reported:
        groups.setdefault((shared.check, shared.group), {})[host] = shared
    owners: dict[tuple[str, str], set[str]] = {}  # (check, value) -> the groups reporting it
    for (check, group), members in groups.items():
        for shared in members.values():
            owners.setdefault((check, shared.value), set()).add(group)
    found: list[Outcome] = []
    for (check, group), members in sorted(groups.items()):
        first = next(iter(members.values()))
        where = f"{first.key} {group}"
        by_value: dict[str, list[str]] = {}
        for host, shared in sorted(members.items()):
            by_value.setdefault(shared.value, []).append(host)
        ranked = sorted(by_value.items(), key=lambda item: -len(item[1]))
        top, top_hosts = ranked[0]
        majority = 2 * len(top_hosts) > len(members)  # more than half, not just the most
        listed = _first([f"{v} ({', '.join(h)})" for v, h in ranked], 3)
        for host, shared in sorted(members.items()):
            own = f"{shared.what} {shared.value}"
            others = sorted(owners[(check, shared.value)] - {group})
            if others:
                text = (
                    f"{own} is also reported by nodes the inventory puts in {first.key} "
                    f"{', '.join(others)}: the inventory splits one {shared.what} over "
                    f"{len(others) + 1} groups; expected {where} to have its own"
                )
                status, action = "FAIL", Action.FIX_CONFIG
            elif len(members) == 1:
                text = f"{own}: the only node of {where} that reported it; nothing to compare"
                status, action = "SKIP", Action.NONE
            elif not majority:
                text = f"the nodes of {where} disagree, with no majority: {listed}"
                status, action = "FAIL", Action.INSPECT
            elif shared.value == top:
                text = f"{own}, as all {len(top_hosts)} reporting nodes of {where}"
                if len(ranked) > 1:
                    text = f"{own}, as {len(top_hosts)} of the {len(members)} reporting nodes "
                    text += f"of {where}"
                status, action = "PASS", Action.NONE
            else:
                text = (
                    f"{own}, but {len(top_hosts)} of the {len(members)} reporting nodes of "
                    f"{where} ({_first(top_hosts, 5)}) report {top}"
                )
                status, action = "FAIL", Action.FIX_CONFIG
            advice = shared.advice if status == "FAIL" else None
            found.append(Outcome(check, status, host, None, text, host, action.value, advice))
    return found


class VerdictBook:
    """Accumulates outcomes and turns them into per-node verdicts."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeVerdict] = {}
        self._bad: dict[str, list[Outcome]] = {}
        self._soft: dict[str, list[Outcome]] = {}
        # Values each host's inventory group must agree on (results.Shared), compared at the
        # end (shared_outcomes), and the test file each fleet check is reported in.
        self.shared: list[tuple[str, Shared]] = []
        self.shared_files: dict[str, str] = {}

    def node(self, host: str) -> NodeVerdict:
        """The verdict record of a host, created on first use."""
        node = self.nodes.get(host)
        if node is None:
            node = self.nodes[host] = NodeVerdict(host)
        return node

    def count(self, host: str, status: str) -> None:
        """Count an outcome that is only counted (PASS, SKIP), as `add` would: most of a
        fleet's outcomes, so without building one."""
        counts = self.node(host).counts
        counts[status] = counts.get(status, 0) + 1

    def add(self, outcome: Outcome) -> None:
        """Record one check outcome."""
        self.count(outcome.host, outcome.status)
        node = self.nodes[outcome.host]
        if outcome.status in ("FAIL", "ERROR"):
            self._bad.setdefault(outcome.host, []).append(outcome)
            node.failed.append(outcome.entry())
        elif outcome.status == "WARN":
            self._soft.setdefault(outcome.host, []).append(outcome)
            node.warnings.append(outcome.entry())

    def error(self, host: str, check: str, gpu: int | None, message: str) -> None:
        """A check that could not run (a bug or a broken document), not a health verdict."""
        advice = "read the error; re-run, and report it if it is a gpuhealth bug"
        self.add(Outcome(check, "ERROR", host, gpu, message, host, Action.RERUN.value, advice))

    def unreachable(self, host: str, reason: str) -> None:
        """The host could not be probed at all."""
        node = self.node(host)
        node.verdict = "UNREACHABLE"
        if reason not in node.reasons:
            node.reasons.append(reason)

    def regression(self, host: str, entry: dict[str, Any]) -> None:
        """A change against the host's history (its test outcome is added like any other)."""
        self.node(host).regressions.append(entry)

    def share(self, host: str, value: Shared, nodeid: str) -> None:
        """A value the host's group must agree on, stated by test `nodeid` (its fleet check is
        reported in the same test file)."""
        self.shared.append((host, value))
        self.shared_files[value.check] = nodeid.partition("::")[0]

    def findings(self) -> list[Outcome]:
        """Every outcome that was not a PASS or SKIP (what the run store keeps)."""
        return [o for found in (self._bad, self._soft) for group in found.values() for o in group]

    def state(self, host: str, state: str, source: str) -> None:
        """The node state the host was judged in (every verdict says it)."""
        node = self.node(host)
        node.node_state, node.node_state_source = state, source

    def note(self, host: str, text: str) -> None:
        """Context for the verdict that is not a finding (e.g. no GPU on this host)."""
        node = self.node(host)
        if text not in node.notes:
            node.notes.append(text)

    def finish(self) -> list[NodeVerdict]:
        """Decide every node's verdict; most severe first, then by host name."""
        for host, node in self.nodes.items():
            if node.verdict == "UNREACHABLE":
                node.actions = [Action.DRAIN.value]
                node.advice = ["check that the node is up and reachable over SSH, then re-run"]
                continue
            if self._bad.get(host):
                node.verdict = "FAIL"
                node.reasons, node.actions, node.advice = _summarise(self._bad[host])
            elif self._soft.get(host):
                node.verdict = "WARN"
                node.reasons, node.actions, node.advice = _summarise(self._soft[host])
            elif not node.counts["PASS"]:
                node.verdict = "NOT_CHECKED"
                skipped = node.counts["SKIP"]
                node.reasons = [
                    f"no check passed or failed on {host}"
                    + (f" ({skipped} skipped)" if skipped else " (none was run)")
                ]
                node.actions = [Action.RERUN.value]
                node.advice = [
                    "run the checks this host needs: see the test selection (-k, -m, paths) "
                    "and --level"
                ]
            else:
                node.verdict = "PASS"
                node.reasons = list(node.notes) or [
                    f"{node.counts['PASS']} checks passed, {node.counts['SKIP']} skipped"
                ]
        return sorted(self.nodes.values(), key=lambda n: (-ORDER[n.verdict], n.host))


def headline(verdict: str, reasons: list[str]) -> str:
    """A node's verdict and its first (most severe) reason: what a drain reason, a node
    condition or a one-line answer says."""
    if not reasons:
        return verdict
    more = f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
    return f"{verdict}: {reasons[0]}{more}"


def one_line(text: str, limit: int) -> str:
    """`text` on one line (whitespace collapsed), cut to `limit` characters with "..."."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


# The verdicts that let a node take work: node-check's exit 0, serve's and the API's healthy.
HEALTHY = ("PASS", "WARN")


def overall(verdicts: list[NodeVerdict]) -> str:
    """The worst node verdict of a run; a run that judged no host checked nothing."""
    return max((v.verdict for v in verdicts), key=ORDER.__getitem__, default="NOT_CHECKED")


def write_private(path: Path, text: str) -> None:
    """Write a report atomically (temp file + rename) and readable by its owner only: reports
    name hosts and may quote launcher arguments."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    tmp.replace(path)


def write_json(verdicts: list[NodeVerdict], path: Path, extra: dict[str, Any]) -> None:
    """Write reports/verdicts.json (VerdictDocument.run_json): one entry per node, for
    dashboards and drain scripts; `extra` says what the run was (hosts, source, complete)."""
    VerdictDocument(verdicts, run=extra).write(path)


@dataclass
class VerdictDocument:
    """One judgement's verdicts as every entry point hands them out: built once from the
    verdicts (and, where the caller lists them, every outcome), serialised for its reader.

    `run_json` is verdicts.json (the suite, merged shards); `findings_json` is `gpuhealth
    triage --json`; `node_json` is one node's answer (node-check --json, serve, a bundle),
    with `fail_count` and `failed_checks` as ft_launcher's client reads them. `refused`
    makes an answer that nothing vouches for (serve's: no verdict yet, too old, judging
    again).
    """

    verdicts: list[NodeVerdict]
    outcomes: list[Outcome] = field(default_factory=list)
    checked_at: float | None = None  # when the judgement began (None: none made yet)
    duration_s: float | None = None
    run: dict[str, Any] = field(default_factory=dict)  # verdicts.json: hosts, source, complete

    @property
    def overall(self) -> str:
        """The worst node verdict (NOT_CHECKED when no node was judged)."""
        return overall(self.verdicts)

    @property
    def failures(self) -> list[Outcome]:
        """The outcomes that make a node unhealthy (FAIL, and checks that could not run)."""
        return [o for o in self.outcomes if o.status in ("FAIL", "ERROR")]

    def run_json(self) -> dict[str, Any]:
        """verdicts.json: the run, then every node's verdict and what led to it."""
        return {
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "overall": self.overall,
            "action_codes": {a.value: a.meaning for a in Action},
            **self.run,
            "nodes": {
                v.host: {k: val for k, val in asdict(v).items() if k != "host"}
                for v in self.verdicts
            },
        }

    def write(self, path: Path) -> None:
        """Write verdicts.json (owner-only, atomically)."""
        write_private(path, json.dumps(self.run_json(), indent=2) + "\n")

    def findings_json(
        self, profiles: dict[str, str], evidence: Callable[[Outcome], str | None]
    ) -> dict[str, Any]:
        """`gpuhealth triage --json`: the verdict, every finding (with the ticket part its
        evidence came from) and each node's verdict, actions, profile and state."""
        findings = []
        for o in self.outcomes:
            entry = {
                "check": o.check,
                "status": o.status,
                "host": o.host,
                "gpu": o.gpu,
                "message": o.text,
                "action": o.action,
            }
            if o.advice:
                entry["advice"] = o.advice
            source = evidence(o)
            if source:
                entry["evidence"] = source
            findings.append(entry)
        return {
            "verdict": self.overall,
            "findings": findings,
            "nodes": {
                v.host: {
                    "verdict": v.verdict,
                    "actions": v.actions,
                    "profile": profiles[v.host],
                    "node_state": v.node_state,
                }
                for v in self.verdicts
            },
        }

    def node_json(self) -> dict[str, Any]:
        """One node's answer: `fail_count` and `failed_checks` first, then the verdict, its
        reasons, actions and warnings, and when it was judged (if it was)."""
        (node,) = self.verdicts
        failed = self.failures
        doc: dict[str, Any] = {
            "fail_count": len(failed),
            "failed_checks": [
                {"check": o.check, "gpu": o.gpu, "message": o.text, "action": o.action}
                for o in failed
            ],
            "verdict": node.verdict,
            "host": node.host,
            "node_state": node.node_state,
            "node_state_source": node.node_state_source,
            "reasons": node.reasons,
            "actions": node.actions,
            "warnings": [w["message"] for w in node.warnings],
        }
        if self.checked_at is not None:
            doc["checked_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.checked_at))
        if self.duration_s is not None:
            doc["duration_s"] = round(self.duration_s, 3)
        return doc

    @classmethod
    def unjudged(cls, host: str, node_state: str | None, source: str | None) -> VerdictDocument:
        """A node's document before any judgement: NOT_CHECKED, nothing found."""
        node = NodeVerdict(host, "NOT_CHECKED", node_state=node_state, node_state_source=source)
        return cls([node])

    def refused(self, check: str, message: str, action: Action) -> VerdictDocument:
        """This node's document with one more failed check (`check`, named by no label) saying
        why nothing vouches for the node now: its verdict no better than NOT_CHECKED, the
        message its first reason, `action` among its actions."""
        (node,) = self.verdicts
        verdict = node.verdict if ORDER[node.verdict] > ORDER["WARN"] else "NOT_CHECKED"
        codes = {action.value, *node.actions}
        closed = replace(
            node,
            verdict=verdict,
            reasons=[message, *node.reasons],
            actions=sorted(codes, key=lambda code: Action(code).rank),
        )
        why = Outcome(check, "ERROR", node.host, None, message, "", action.value)
        return replace(self, verdicts=[closed], outcomes=[why, *self.outcomes])


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


@dataclass
class FleetSummary:
    """What a fleet's run comes to, read before any single test: nodes by verdict, the worst
    nodes (NOT_CHECKED and worse) and the failed checks with how many nodes and GPUs each."""

    line: str
    worst: list[NodeVerdict]
    checks: list[str]
    regressions: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, verdicts: list[NodeVerdict]) -> FleetSummary:
        """The summary of verdicts sorted most severe first (as VerdictBook.finish gives)."""
        counts: dict[str, int] = {}
        for v in verdicts:
            counts[v.verdict] = counts.get(v.verdict, 0) + 1
        parts = ", ".join(f"{counts[k]} {k}" for k in ORDER if k in counts)
        line = f"{_plural(len(verdicts), 'node')}: {parts or 'none checked'}"
        by_check: dict[str, tuple[set[str], set[tuple[str, int]]]] = {}
        for v in verdicts:
            for entry in v.failed:
                nodes, gpus = by_check.setdefault(entry["check"], (set(), set()))
                nodes.add(v.host)
                if entry["gpu"] is not None:
                    gpus.add((v.host, entry["gpu"]))
        ranked = sorted(by_check.items(), key=lambda kv: (-len(kv[1][0]), _rank(kv[0])))
        checks = [
            f"{check}: {_plural(len(nodes), 'node')}"
            + (f", {_plural(len(gpus), 'GPU')}" if gpus else "")
            for check, (nodes, gpus) in ranked
        ]
        worst = [v for v in verdicts if ORDER[v.verdict] > ORDER["WARN"]]
        # Each entry's message names its host and GPU.
        regressions = [entry["message"] for v in verdicts for entry in v.regressions]
        return cls(line, worst, checks, regressions)

    def lines(self, top: int = 10) -> list[str]:
        """For the terminal: the worst `top` nodes with their first reason, every check."""
        lines = [self.line]
        if self.worst:
            lines.append(f"worst nodes ({min(top, len(self.worst))} of {len(self.worst)}):")
            for v in self.worst[:top]:
                action = v.actions[0] if v.actions else ""
                reason = v.reasons[0] if v.reasons else ""
                lines.append(f"  {v.host}  {v.verdict} {action}: {reason}")
        if self.checks:
            lines.append("failed checks:")
            lines += [f"  {check}" for check in self.checks]
        if self.regressions:
            shown = self.regressions[: top * 3]
            lines.append(f"regressions against the nodes' own history ({len(self.regressions)}):")
            lines += [f"  {text}" for text in shown]
            if len(shown) < len(self.regressions):
                lines.append(f"  ... and {len(self.regressions) - len(shown)} more (verdicts.json)")
        return lines

    def metadata(self, top: int = 10) -> list[tuple[str, str]]:
        """One-line (key, value) pairs: the Allure report's metadata, at the top of its page."""
        pairs = [("verdicts", self.line)]
        if self.worst:
            named = [
                f"{v.host} {v.verdict} {v.actions[0] if v.actions else ''}".strip()
                for v in self.worst
            ]
            pairs.append(("worst nodes", _first(named, top)))
        if self.checks:
            pairs.append(("failed checks", _first(self.checks, top)))
        if self.regressions:
            pairs.append(("regressions", _first(self.regressions, top)))
        return pairs


def _first(items: list[str], top: int) -> str:
    """The first `top` of `items` on one line, and how many more there are."""
    more = f" (+{len(items) - top} more)" if len(items) > top else ""
    return "; ".join(items[:top]) + more


def overview_html(verdicts: list[NodeVerdict], title: str) -> str:
    """A self-contained page: the fleet summary, then every node, worst first, with its
    verdict, actions and reasons (the full table a large fleet's terminal leaves out)."""
    esc = html.escape
    lines = FleetSummary.of(verdicts).lines()
    summary = "".join(f"<li>{esc(line.strip())}</li>" for line in lines)
    rows = "".join(
        f"<tr class={v.verdict}><td>{esc(v.host)}</td><td>{v.verdict}</td>"
        f"<td>{esc(' '.join(v.actions))}</td>"
        f"<td>{'<br>'.join(esc(r) for r in v.reasons)}</td></tr>"
        for v in verdicts
    )
    style = (
        "body{font:14px sans-serif;margin:1em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top;text-align:left}"
        ".FAIL td:nth-child(2),.UNREACHABLE td:nth-child(2){color:#c00;font-weight:bold}"
        ".WARN td:nth-child(2){color:#b60}.PASS td:nth-child(2){color:#080}"
    )
    return (
        f"<!doctype html><html><head><meta charset=utf-8><title>{esc(title)}</title>"
        f"<style>{style}</style></head><body><h1>{esc(title)}</h1><ul>{summary}</ul>"
        "<table><tr><th>host</th><th>verdict</th><th>actions</th><th>reasons</th></tr>"
        f"{rows}</table></body></html>\n"
    )


def table(verdicts: list[NodeVerdict], width: int = 120) -> list[str]:
    """Terminal lines: one per node with its verdict, first action and first reason."""
    if not verdicts:
        return ["no hosts were checked"]
    host_w = max(4, *(len(v.host) for v in verdicts))
    lines = [f"{'HOST':<{host_w}}  {'VERDICT':<11}  {'ACTION':<11}  REASON"]
    for v in verdicts:
        first = v.reasons[0] if v.reasons else ""
        more = f" (+{len(v.reasons) - 1} more)" if len(v.reasons) > 1 else ""
        text = first + more
        room = max(20, width - host_w - 28)
        if len(text) > room:
            text = text[: room - 3] + "..."
        action = v.actions[0] if v.actions else ""
        lines.append(f"{v.host:<{host_w}}  {v.verdict:<11}  {action:<11}  {text}")
    return lines
