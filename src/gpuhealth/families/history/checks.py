"""Regression checks: each node and GPU against its own past runs, by the rules of every metric
the families declare (gpuhealth.metrics; found through the registry, none named here).

The `history` section holds the host's machine's complete nights before this one from the
store (under any host name it had), newest first: `{"store", "policy": "fail" | "warn", "now":
this night (epoch), "machine": {"id", "by", "host", "last", "machine_id", "ids"} (what the
store found the machine by: machine_notes), "runs": [sample, ...], "elsewhere": {serial:
[sample, ...]} (this node's GPUs' nights in other machines), "pins": {"node": epoch | None,
"gpus": {serial: epoch}}, "rejudging": {"run", "reported": [{check, gpu, metric}]} (only when
this night was judged before)}`, where a sample is `{"run", "at", "host", "node_id", "verdict",
"driver", "firmware", "regressions": count, "gpus": {index: {uuid, serial, vbios}}, "node":
{metric: value}, "gpu": {index: {metric: value}}}` (gpuhealth.history.store), or `{"skipped":
reason}` without a store. A regression FAILs (WARNs
with `--regressions warn`) and lists itself in the result's `regressions`; an identity change
is a note, and so is a regression already reported for a night judged again.

A night with a regression reported never enters a baseline, whatever the policy: a warned
step must stay a regression, not become the new normal.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import takewhile
from typing import TYPE_CHECKING, Any

from gpuhealth import registry
from gpuhealth.checks import CheckSet, NodeView, Scope, StopCheck, section
from gpuhealth.families.history.limits import HistoryLimits
from gpuhealth.families.history.metrics import cursors, gpu_key, gpu_values, identity, node_values
from gpuhealth.families.history.schema import HISTORY_SECTION
from gpuhealth.metrics import COUNTER_RULES, DRIFT_RULES, Events, Metric, Values
from gpuhealth.results import Action, Detail, Result, Status, passed, skipped

if TYPE_CHECKING:
    from gpuhealth.report import VerdictBook

CHECKS = CheckSet(
    "history",
    added={HISTORY_SECTION: "no run history given (the suite adds it: --history)"},
    # Changes against the node's own history: after what is wrong now, what got worse.
    ranks={"regression": 2},
)
Sample = dict[str, Any]
# One earlier value of a metric: (run time, the run's values, the run counts for baselines).
Past = list[tuple[float, Values, bool]]
# The scope of the GPU regression checks: the GPU slots, which the registry finds (declared
# by the family that knows GPUs, not named here).
GPUS = "gpu"
# The share of a trend window's pairs of runs that must move the slope's way (Kendall's tau
# 0.5: three pairs in four): noise as large as the slope gives a slope, not a direction.
TREND_AGREEMENT = 0.5


def _slots() -> Scope:
    return registry.scope(GPUS)


def when(epoch: float) -> str:
    """A run time as people read it in a message (UTC, to the minute)."""
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(epoch))


def _num(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


@dataclass
class Judgement:
    """What one subject's rules found: regressions, values not judged (and why), notes."""

    label: str
    gpu: int | None
    check: str
    regressions: list[dict[str, Any]] = field(default_factory=list)
    unjudged: list[str] = field(default_factory=list)
    judged: int = 0
    notes: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    # (check, gpu, metric) already reported for this night (it is judged again)
    reported: set[tuple[str, int | None, str]] = field(default_factory=set)

    def regressed(self, m: Metric, name: str, baseline: Any, value: Any, text: str) -> None:
        """Record one regression of metric `name` (the table entry `m`), or a note when it was
        reported for this night already."""
        if (self.check, self.gpu, name) in self.reported:
            self.notes.append(f"already reported for this night: {text}")
            return
        self.regressions.append(
            {
                "check": self.check,
                "gpu": self.gpu,
                "metric": name,
                "baseline": baseline,
                "value": value,
                "message": f"{self.label}: {text}",
                "action": Action.INSPECT.value,
            }
        )
        if m.advice and m.advice not in self.advice:
            self.advice.append(m.advice)

    def result(self, policy: str, runs: int) -> Result:
        """FAIL (WARN under the warn policy) on regressions, else PASS with what was judged;
        SKIP when nothing could be (`runs`: the earlier runs of this node or GPU)."""
        notes = tuple(Note(text) for text in self.notes)
        if self.regressions:
            status = Status.WARN if policy == "warn" else Status.FAIL
            text = "; ".join(r["message"].removeprefix(f"{self.label}: ") for r in self.regressions)
            listed = tuple(Regression(entry) for entry in self.regressions)
            return Result(status, text, Action.INSPECT, "; ".join(self.advice), listed + notes)
        pending = f"; not judged: {'; '.join(self.unjudged)}" if self.unjudged else ""
        said = "".join(f"; {note}" for note in self.notes)
        if not self.judged:
            why = pending if runs else ""
            return Result(Status.SKIP, f"no baseline yet ({runs} runs){why}{said}", details=notes)
        found = passed(
            f"no regression in {self.judged} values against {runs} earlier runs{pending}{said}"
        )
        return Result(found.status, found.message, details=notes)


@dataclass(frozen=True)
class Regression(Detail):
    """A change against the node's own history: an entry of its verdict's `regressions` in
    verdicts.json (check, gpu, metric, baseline, value, message, action), which the run store
    keeps; the regression checks' findings list them."""

    entry: dict[str, Any]

    def reach(self, host: str, nodeid: str, book: VerdictBook) -> None:
        """Listed in the node's verdict."""
        book.regression(host, self.entry)


@dataclass(frozen=True)
class Note(Detail):
    """Context for the node's verdict that is no finding (a GPU replaced, a driver changed, a
    regression already reported for this night)."""

    text: str

    def reach(self, host: str, nodeid: str, book: VerdictBook) -> None:
        """Among the verdict's notes (its reasons when it passes)."""
        book.note(host, self.text)


def regressions_of(result: Result) -> list[dict[str, Any]]:
    """The regression entries a result lists."""
    return [found.entry for found in result.of(Regression)]


def notes_of(result: Result) -> list[str]:
    """The notes a result carries."""
    return [found.text for found in result.of(Note)]


def _history(node: NodeView, needed: bool = False) -> tuple[dict[str, Any], list[Sample]]:
    """The section and its samples; with `needed`, stop with a SKIP when there are none."""
    record = section(node, HISTORY_SECTION)
    runs = [s for s in record.get("runs") or [] if isinstance(s, dict)]
    if needed and not runs:
        raise StopCheck(skipped("no baseline yet (0 runs)"))
    return record, runs


def _now(record: dict[str, Any]) -> float:
    """The time the rules judge at: the section's `now` (this night's), else the clock's."""
    return float(record.get("now") or time.time())


def _judgement(record: dict[str, Any], label: str, gpu: int | None, check: str) -> Judgement:
    """A subject's judgement, knowing what was reported for this night if it is judged again."""
    again = record.get("rejudging")
    out = Judgement(label, gpu, check)
    if isinstance(again, dict):
        out.reported = {(r["check"], r["gpu"], r["metric"]) for r in again.get("reported") or []}
    return out


def _rejudging(record: dict[str, Any]) -> list[str]:
    """The note that this night was judged before (its regressions are not reported twice)."""
    again = record.get("rejudging")
    if not isinstance(again, dict):
        return []
    return [
        f"the night of {when(_now(record))} judged again (first by run {again.get('run')}): "
        "what was reported for it then is not reported twice"
    ]


def _entry(sample: Sample, values: Values) -> tuple[float, Values, bool]:
    """One earlier run's values, as a Past holds them: a PASS or WARN night with no
    regression reported counts for baselines."""
    good = sample.get("verdict") in ("PASS", "WARN") and not sample.get("regressions")
    return float(sample["at"]), values, good


def judge_counter(
    m: Metric, name: str, value: float, past: Past, limit: float, now: float, out: Judgement
) -> None:
    """A growth or rate rule: `value` against the last run that measured `name`."""
    earlier = next(((at, values[name]) for at, values, _ in past if name in values), None)
    if earlier is None:
        out.unjudged.append(f"{m.what}: no earlier value")
        return
    at, before = earlier
    if m.saturates is not None and max(value, before) >= m.saturates:
        out.unjudged.append(
            f"{name} stuck at its maximum {m.saturates}: clear the port's counters (perfquery -x)"
        )
        return
    out.judged += 1
    growth = value - before
    reset = ""
    if growth < 0:
        if not m.resets:
            out.regressed(
                m,
                name,
                before,
                value,
                f"{m.what} went down from {_num(before)} to {_num(value)} on the same GPU since "
                f"{when(at)}: the counter or its record is wrong (never a pass)",
            )
            return
        growth, reset = value, " (the counter was reset since, e.g. by a reboot)"
    if m.rule == "growth":
        if growth > limit:
            out.regressed(
                m,
                name,
                before,
                value,
                f"{m.what} {_num(before)} -> {_num(value)} since the last run ({when(at)}), "
                f"+{_num(growth)} > {_num(limit)} allowed{reset}",
            )
        return
    days = (now - at) / 86400
    if growth > limit * max(days, 1.0):
        span = f"{days:.1f} days" if days >= 1 else "under a day, counted as one"
        out.regressed(
            m,
            name,
            before,
            value,
            f"{m.what} +{_num(growth)} since the last run ({when(at)}; {span}), "
            f"> {_num(limit)} per day{reset}",
        )


def _beyond(m: Metric, value: float, base: float, limit: float) -> str | None:
    """How far `value` is past `base` the rule's way, when more than `limit` (else None)."""
    unit = f" {m.unit}" if m.unit else ""
    if m.rule == "drop" and value < base * (1 - limit / 100):
        return f"{100 * (base - value) / base:.1f}% below"
    if m.rule == "rise" and value > base + limit:
        return f"{_num(value - base)}{unit} above"
    if m.rule == "rise_pct" and base > 0 and value > base * (1 + limit / 100):
        return f"{100 * (value - base) / base:.1f}% above"
    return None


def judge_drift(
    m: Metric,
    name: str,
    value: float,
    past: Past,
    lim: HistoryLimits,
    limit: float,
    out: Judgement,
) -> None:
    """A drop, rise or rise_pct rule: `value` against the median of the last good runs (the
    rolling baseline), then the median of the first ones (the reference, which a slow decay
    cannot drag along), then the trend of the last ones."""
    goods = [(at, v[name]) for at, v, good in past if good and name in v]
    if len(goods) < lim.history_min_runs:
        out.unjudged.append(
            f"{m.what}: a baseline needs {lim.history_min_runs} good runs, has {len(goods)}"
        )
        return
    out.judged += 1
    unit = f" {m.unit}" if m.unit else ""
    more = f"more than {_num(limit)}{'%' if m.rule != 'rise' else unit} is a regression"
    rolling = [v for _, v in goods[: lim.history_baseline_runs]]
    base = statistics.median(rolling)
    far = _beyond(m, value, base, limit)
    if far:
        of = f"its baseline {_num(base)}{unit} (median of {len(rolling)} good runs)"
        out.regressed(m, name, base, value, f"{m.what} {_num(value)}{unit} is {far} {of}; {more}")
        return
    if lim.history_reference_runs is not None:
        first = goods[-lim.history_reference_runs :]
        reference = statistics.median(v for _, v in first)
        far = _beyond(m, value, reference, limit)
        if far:
            of = (
                f"its reference {_num(reference)}{unit} (median of the first {len(first)} good "
                f"runs, from {when(first[-1][0])})"
            )
            text = f"{m.what} {_num(value)}{unit} is {far} {of}; {more}"
            out.regressed(m, name, reference, value, text)
            return
    slope = getattr(lim, m.trend_key) if m.trend_key else None
    if slope is not None:
        judge_trend(m, name, value, [v for _, v in goods], lim, float(slope), out)


def theil_sen(points: list[float]) -> tuple[float, float]:
    """The Theil-Sen slope of points in run order (the median of every pair's slope) and
    Kendall's tau (the share of pairs rising minus the share falling).

    Why Theil-Sen, not a one-sided CUSUM: its limit is a slope people can read and set per
    profile (% or C per run); a single bad night moves it little (it ignores up to 29 % of
    outliers); and it is a pure function of the window, where a CUSUM's sum depends on where
    it started and was last reset, which pruning, pins and re-judged nights would change.
    Kendall's tau comes from the same pairs and gates it (TREND_AGREEMENT): run-to-run noise
    as large as the slope gives a slope but no consistent direction."""
    slopes: list[float] = []
    for i, first in enumerate(points):
        for j in range(i + 1, len(points)):
            slopes.append((points[j] - first) / (j - i))
    if not slopes:
        return 0.0, 0.0
    tau = (sum(1 for s in slopes if s > 0) - sum(1 for s in slopes if s < 0)) / len(slopes)
    return statistics.median(slopes), tau


def judge_trend(
    m: Metric,
    name: str,
    value: float,
    goods: list[float],
    lim: HistoryLimits,
    limit: float,
    out: Judgement,
) -> None:
    """A steady drift the rule's way over this run and the last good ones (newest first in
    `goods`), at least `limit` per run (% of the window's median level, or the unit for
    `rise`), before the level itself crosses its limit."""
    earlier = goods[: lim.history_trend_runs - 1]
    if len(earlier) < lim.history_trend_min_runs:
        out.unjudged.append(
            f"{m.what} trend: needs {lim.history_trend_min_runs} earlier good runs, has "
            f"{len(earlier)}"
        )
        return
    points = [*reversed(earlier), value]
    slope, tau = theil_sen(points)
    way = -1.0 if m.rule == "drop" else 1.0
    level = statistics.median(points)
    if m.rule == "rise":
        rate, unit = way * slope, f" {m.unit}"
    elif level > 0:
        rate, unit = 100 * way * slope / level, "%"
    else:
        return
    if rate >= limit and way * tau >= TREND_AGREEMENT:
        unit_of = f" {m.unit}" if m.unit else ""
        moves = "falls" if m.rule == "drop" else "rises"
        agree = round(100 * (1 + way * tau) / 2)
        out.regressed(
            m,
            name,
            points[0],
            value,
            f"{m.what} {moves} steadily: {rate:.1f}{unit} a run over the last {len(points)} good "
            f"runs ({_num(points[0])} -> {_num(value)}{unit_of}; Theil-Sen slope, {agree}% of "
            f"pairs of runs agree); {_num(limit)}{unit} a run or more is a regression",
        )


def judge_values(
    current: Values,
    past: Past,
    lim: HistoryLimits,
    now: float,
    out: Judgement,
    names: Callable[[str], bool] = lambda name: True,
) -> None:
    """Every rule whose metric was measured now (and is selected by `names`); an event count
    has its own rule (_judge_events) and a reading's cursor none."""
    skip = cursors()
    for name, value in sorted(current.items()):
        if name in skip or not names(name):
            continue
        m = registry.metric(name)
        limit = getattr(lim, m.key) if m.rule in (*COUNTER_RULES, *DRIFT_RULES) else None
        if limit is None:
            continue
        if m.rule in COUNTER_RULES:
            judge_counter(m, name, value, past, float(limit), now, out)
        else:
            judge_drift(m, name, value, past, lim, float(limit), out)


def _index_of(sample: Sample, key: str) -> str | None:
    """Where the GPU with this serial (or UUID) sat in an earlier run, if it was there."""
    for index, ids in (sample.get("gpus") or {}).items():
        if key in (ids.get("serial"), ids.get("uuid")):
            return str(index)
    return None


def _elsewhere(record: dict[str, Any], key: str | None) -> list[Sample]:
    """The GPU's nights in other machines (a GPU moved in from another node), newest first."""
    found = (record.get("elsewhere") or {}).get(key) if key is not None else None
    return [s for s in found or [] if isinstance(s, dict)]


def _came_from(record: dict[str, Any], runs: list[Sample], key: str | None) -> str | None:
    """Where the GPU was before it came to this node, if its last night was in another one:
    `n5 gpu2 until <time>`."""
    before = _elsewhere(record, key)
    own = next((s for s in runs if key is not None and _index_of(s, key) is not None), None)
    if not before or key is None or (own is not None and own["at"] > before[0]["at"]):
        return None
    return f"{before[0].get('host')} gpu{_index_of(before[0], key)} until {when(before[0]['at'])}"


def _gpu_notes(
    record: dict[str, Any], runs: list[Sample], gpu: dict[str, Any], key: str | None
) -> list[str]:
    """How this GPU slot changed since the last run: another GPU, moved (within the node or
    from another one), new VBIOS."""
    came = _came_from(record, runs, key)
    moved_in = (
        [f"this GPU was in {came}: its counters continue from there, its idle baselines restart"]
        if came
        else []
    )
    if not runs:
        return moved_in
    last, index = runs[0], str(gpu["index"])
    before = (last.get("gpus") or {}).get(index)
    notes = []
    if before is None:
        notes.append(f"gpu{index} was not seen in the last run ({when(last['at'])})")
    elif key is not None and key not in (before.get("serial"), before.get("uuid")):
        moved = _index_of(last, key)
        was = before.get("serial") or before.get("uuid")
        now = f"serial {gpu.get('serial')}" if gpu.get("serial") else f"UUID {gpu.get('uuid')}"
        also = f"; this GPU was gpu{moved} then" if moved is not None else " (a new GPU)"
        also = also if came is None else ""
        notes.append(
            f"gpu{index} is another GPU since the last run: {now}, was {was}{also}; its "
            "baseline restarts"
        )
    elif before.get("vbios") and gpu.get("vbios_version") not in (None, before.get("vbios")):
        notes.append(
            f"gpu{index} VBIOS changed since the last run: {before['vbios']} -> "
            f"{gpu['vbios_version']}; its baseline restarts"
        )
    return notes + moved_in


def _same_epoch(node: NodeView) -> Callable[[Sample], bool]:
    """Whether an earlier run had the node's current driver and HCA firmware."""
    now, _ = identity(node.facts)
    return lambda sample: (
        sample.get("driver") == now["driver"] and (sample.get("firmware") or {}) == now["firmware"]
    )


def _pinned(record: dict[str, Any], key: str | None = None) -> float | None:
    """When the node (with `key`: the node or that GPU) was last pinned, if it was."""
    pins = record.get("pins")
    if not isinstance(pins, dict):
        return None
    found = [pins.get("node"), (pins.get("gpus") or {}).get(key) if key else None]
    return max((float(at) for at in found if at is not None), default=None)


def _gpu_past(
    runs: list[Sample],
    node: NodeView,
    key: str,
    vbios: Any,
    until_change: bool,
    pinned: float | None = None,
) -> Past:
    """This GPU's earlier values, newest first; with `until_change`, only since its VBIOS or
    the node's driver or firmware last changed, or it was `pinned` (a drift baseline restarts
    there)."""
    past: Past = []
    same = _same_epoch(node)
    for sample in runs:
        index = _index_of(sample, key)
        if index is None:
            continue
        if until_change:
            seen = (sample.get("gpus") or {}).get(index, {}).get("vbios")
            if not same(sample) or (vbios and seen and seen != vbios):
                break
            if pinned is not None and float(sample["at"]) <= pinned:
                break
        past.append(_entry(sample, (sample.get("gpu") or {}).get(index, {})))
    return past


def _node_past(
    runs: list[Sample], node: NodeView, until_change: bool, pinned: float | None = None
) -> Past:
    """The node's earlier values, newest first; with `until_change`, only since its driver or
    firmware last changed or it was `pinned`."""
    same = _same_epoch(node)
    after = (lambda s: float(s["at"]) > pinned) if pinned is not None else (lambda s: True)
    kept = takewhile(lambda s: same(s) and after(s), runs) if until_change else runs
    return [_entry(sample, sample.get("node") or {}) for sample in kept]


def _split(current: Values) -> tuple[Values, Values]:
    """Counters (judged against the last run, whatever changed since) and the rest (drifts:
    judged only since the identity last changed or a pin)."""
    skip = cursors()
    counters = {
        n: v
        for n, v in current.items()
        if n not in skip and registry.metric(n).rule in COUNTER_RULES
    }
    return counters, {n: v for n, v in current.items() if n not in counters}


def _judge_gpu_values(
    node: NodeView,
    gpu: dict[str, Any],
    record: dict[str, Any],
    runs: list[Sample],
    current: Values,
    out: Judgement,
) -> None:
    lim = node.limits.get(HistoryLimits)
    now = _now(record)
    key = gpu_key(gpu)
    if key is None:
        out.unjudged.append(f"gpu{gpu['index']} has no serial or UUID to find its history by")
        return
    counters, drifts = _split(current)
    vbios = gpu.get("vbios_version")
    # Counters follow the GPU wherever it was; drift baselines only on this node.
    travels = sorted([*runs, *_elsewhere(record, key)], key=lambda s: float(s["at"]), reverse=True)
    judge_values(counters, _gpu_past(travels, node, key, vbios, False), lim, now, out)
    pinned = _pinned(record, key)
    judge_values(drifts, _gpu_past(runs, node, key, vbios, True, pinned), lim, now, out)


def _judge_node_values(
    node: NodeView,
    record: dict[str, Any],
    runs: list[Sample],
    current: Values,
    out: Judgement,
    names: Callable[[str], bool] = lambda name: True,
) -> None:
    lim = node.limits.get(HistoryLimits)
    counters, drifts = _split(current)
    judge_values(counters, _node_past(runs, node, False), lim, _now(record), out, names)
    past = _node_past(runs, node, True, _pinned(record))
    judge_values(drifts, past, lim, _now(record), out, names)


@CHECKS.per(GPUS, "gpu_regression", "regression", severity="normal", section="history", in_use=True)
def gpu_regression(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No error counter of this GPU grew since the last run; idle temperature and power near
    its own baseline."""
    record, runs = _history(node)
    index = gpu["index"]
    out = _judgement(record, _slots().label(node.host, index, gpu), index, "gpu_regression")
    key = gpu_key(gpu)
    out.notes = _rejudging(record) + _gpu_notes(record, runs, gpu, key)
    _judge_gpu_values(node, gpu, record, runs, gpu_values(gpu, node.in_use), out)
    seen = [*runs, *_elsewhere(record, key)]
    mine = sum(1 for sample in seen if key is not None and _index_of(sample, key) is not None)
    return out.result(str(record.get("policy")), mine)


def _node_notes(runs: list[Sample], node: NodeView) -> list[str]:
    if not runs:
        return []
    last = runs[0]
    current, _ = identity(node.facts)
    notes = []
    if last.get("driver") and current["driver"] and last["driver"] != current["driver"]:
        notes.append(
            f"driver changed since the last run: {last['driver']} -> {current['driver']}; "
            "baselines restart"
        )
    before = last.get("firmware") or {}
    changed = sorted(
        f"{name} {before[name]} -> {fw}"
        for name, fw in current["firmware"].items()
        if name in before and before[name] != fw
    )
    if changed:
        notes.append(f"HCA firmware changed since the last run: {', '.join(changed)}")
    return notes


def machine_notes(record: dict[str, Any], host: str) -> list[str]:
    """What the store found the machine by, where people should know: a renamed host
    (`host n7 was n3 until ...`), a re-imaged one, a history that follows the host name
    because the facts name no machine (older facts, nothing readable)."""
    machine = record.get("machine")
    if not isinstance(machine, dict):
        return []
    ids, by = machine.get("ids") or {}, machine.get("by")
    notes = []
    if not ids:
        notes.append(
            "the facts name no machine (no DMI serial or machine id): its history "
            "follows the host name"
        )
    # A night judged again from before the machine's latest: its names since are no news.
    if by in (None, "new") or float(machine.get("last") or 0) >= _now(record):
        return notes
    last = when(float(machine.get("last") or 0))
    if machine.get("host") != host:
        notes.append(
            f"host {host} was {machine.get('host')} until {last}: its history continues "
            f"(machine {machine.get('id')})"
        )
    old, new = machine.get("machine_id"), ids.get("machine_id")
    if old and new and old != new:
        how = (
            f"its {by} {ids.get(by)} keeps its history"
            if by != "host"
            else "no hardware serial could be read (the probe reads DMI as root), so its "
            "history follows the host name"
        )
        notes.append(f"re-imaged since {last} (machine id {old} -> {new}): {how}")
    if by == "host" and ids and str(machine.get("id", "")).startswith("host:"):
        kind = next(iter(ids))
        notes.append(
            f"its history so far was kept by host name; it now follows its {kind} {ids[kind]}"
        )
    return notes


def _judge_events(node: NodeView, runs: list[Sample], events: Events, out: Judgement) -> None:
    """A new_events rule: the events after where the last run's reading of the source ended."""
    m = registry.metric(events.metric)
    limit = getattr(node.limits.get(HistoryLimits), m.key)
    if limit is None:
        return
    if not events.readable(node.facts):
        out.unjudged.append(f"{events.label}: {events.source} was not read (see {events.check})")
        return
    earlier = next(
        ((s["at"], s["node"][events.cursor]) for s in runs if events.cursor in s["node"]),
        None,
    )
    if earlier is None:
        out.unjudged.append(f"{events.label}: no earlier run read {events.source}")
        return
    found = events.read(node.facts, float(earlier[1]))
    out.judged += 1
    if found.count > limit or found.undated:
        dated = f"{found.count} new since the last run ({when(earlier[0])})"
        no_time = " and some with no time" if found.undated else ""
        out.regressed(
            m, m.name, 0, found.count, f"{m.what}: {dated}{no_time}: {', '.join(found.seen)}"
        )


@CHECKS.node("node_regression", "regression", severity="normal", section="history", in_use=True)
def node_regression(node: NodeView) -> Result:
    """No new fatal XID since the last run; no InfiniBand error counter grew past its rate
    (every node value the families measure, against the node's past)."""
    record, runs = _history(node, needed=True)
    out = _judgement(record, node.host, None, "node_regression")
    out.notes = _rejudging(record) + _node_notes(runs, node) + machine_notes(record, node.host)
    events = {}
    for _, measures in registry.measures():
        if measures.events is not None:
            _judge_events(node, runs, measures.events, out)
            events[measures.events.metric] = measures.events
    current = {name: value for name, value in node_values(node.facts).items() if name not in events}
    _judge_node_values(node, record, runs, current, out)
    return out.result(str(record.get("policy")), len(runs))


@CHECKS.node(
    "load_regression",
    "regression",
    severity="normal",
    section="history",
    level="standard",
    in_use=False,
)
def load_regression(node: NodeView) -> Result:
    """Single-node NCCL busbw near the node's baseline; no GPU newly fails DCGM's diagnostic
    (every load test's values the families measure)."""
    record, runs = _history(node, needed=True)
    out = _judgement(record, node.host, None, "load_regression")
    out.notes = _rejudging(record)
    for family, measures in registry.measures():
        if measures.load is None:
            continue
        for run in family.active:
            data = node.facts.get(run.section)
            if isinstance(data, dict):
                found = measures.load(node, data)
                if not found and measures.unmeasured:
                    out.unjudged.append(measures.unmeasured)
                _judge_load(node, record, runs, found, out)
    return out.result(str(record.get("policy")), len(runs))


def _judge_load(
    node: NodeView,
    record: dict[str, Any],
    runs: list[Sample],
    found: dict[int | None, Values],
    out: Judgement,
) -> None:
    """One load test's values: the node's against its past, each GPU's against the GPU's."""
    _judge_node_values(node, record, runs, found.get(None) or {}, out)
    for index, values in sorted((i, v) for i, v in found.items() if i is not None):
        gpu = _slots().record(node, index)
        if gpu is None:
            continue
        mine = _judgement(record, _slots().label(node.host, index, gpu), index, "load_regression")
        _judge_gpu_values(node, gpu, record, runs, values, mine)
        out.regressions += mine.regressions
        out.notes += mine.notes
        out.advice += [a for a in mine.advice if a not in out.advice]
        # What a GPU could not be judged on stays said: a PASS covers only what was judged.
        out.unjudged += [text for text in mine.unjudged if text not in out.unjudged]
        out.judged += mine.judged
