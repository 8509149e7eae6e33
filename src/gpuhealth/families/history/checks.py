"""Regression checks: each node and GPU against its own past runs (metrics.py has the rules).

The `history` section holds the host's recent complete runs from the store, newest first:
`{"store", "policy": "fail" | "warn", "now": epoch, "runs": [sample, ...]}`, where a sample is
`{"run", "at", "verdict", "driver", "firmware", "gpus": {index: {uuid, serial, vbios}},
"node": {metric: value}, "gpu": {index: {metric: value}}}` (gpuhealth.history.store), or
`{"skipped": reason}` without a store. A regression FAILs (WARNs with `--regressions warn`)
and lists itself in the result's `regressions`; an identity change is a note.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import takewhile
from typing import Any

from gpuhealth.checks import HISTORY_SECTION, CheckSet, NodeView, StopCheck, gpu_label, section
from gpuhealth.families.history import metrics
from gpuhealth.families.history.limits import HistoryLimits
from gpuhealth.families.history.metrics import KERNEL_LOG_UNTIL, Metric, Values
from gpuhealth.families.nccl.limits import NcclLimits
from gpuhealth.results import Action, Result, Status, passed, skipped

CHECKS = CheckSet("history")
Sample = dict[str, Any]
# One earlier value of a metric: (run time, the run's values, the run counts for baselines).
Past = list[tuple[float, Values, bool]]


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

    def regressed(self, m: Metric, name: str, baseline: Any, value: Any, text: str) -> None:
        """Record one regression of metric `name` (the table entry `m`)."""
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
        notes = tuple(self.notes)
        if self.regressions:
            status = Status.WARN if policy == "warn" else Status.FAIL
            text = "; ".join(r["message"].removeprefix(f"{self.label}: ") for r in self.regressions)
            return Result(
                status, text, Action.INSPECT, "; ".join(self.advice), tuple(self.regressions), notes
            )
        pending = f"; not judged: {'; '.join(self.unjudged)}" if self.unjudged else ""
        said = "".join(f"; {note}" for note in notes)
        if not self.judged:
            why = pending if runs else ""
            return Result(Status.SKIP, f"no baseline yet ({runs} runs){why}{said}", notes=notes)
        found = passed(
            f"no regression in {self.judged} values against {runs} earlier runs{pending}{said}"
        )
        return Result(found.status, found.message, notes=notes)


def _history(node: NodeView, needed: bool = False) -> tuple[dict[str, Any], list[Sample]]:
    """The section and its samples; with `needed`, stop with a SKIP when there are none."""
    record = section(node, HISTORY_SECTION)
    runs = [s for s in record.get("runs") or [] if isinstance(s, dict)]
    if needed and not runs:
        raise StopCheck(skipped("no baseline yet (0 runs)"))
    return record, runs


def _now(record: dict[str, Any]) -> float:
    """The time the rules judge at: the section's `now` (the run's), else the clock's."""
    return float(record.get("now") or time.time())


def _entry(sample: Sample, values: Values) -> tuple[float, Values, bool]:
    """One earlier run's values, as a Past holds them (a PASS or WARN run counts for
    baselines)."""
    return float(sample["at"]), values, sample.get("verdict") in ("PASS", "WARN")


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


def judge_drift(
    m: Metric,
    name: str,
    value: float,
    past: Past,
    lim: HistoryLimits,
    limit: float,
    out: Judgement,
) -> None:
    """A drop, rise or rise_pct rule: `value` against the median of the last good runs."""
    values = [v[name] for _, v, good in past if good and name in v][: lim.history_baseline_runs]
    if len(values) < lim.history_min_runs:
        out.unjudged.append(
            f"{m.what}: a baseline needs {lim.history_min_runs} good runs, has {len(values)}"
        )
        return
    out.judged += 1
    base = statistics.median(values)
    unit = f" {m.unit}" if m.unit else ""
    of = f"its baseline {_num(base)}{unit} (median of {len(values)} good runs)"
    if m.rule == "drop" and value < base * (1 - limit / 100):
        fell = 100 * (base - value) / base
        out.regressed(
            m,
            name,
            base,
            value,
            f"{m.what} {_num(value)}{unit} is {fell:.1f}% below {of}; more than "
            f"{_num(limit)}% is a regression",
        )
    elif m.rule == "rise" and value > base + limit:
        out.regressed(
            m,
            name,
            base,
            value,
            f"{m.what} {_num(value)}{unit} is {_num(value - base)}{unit} above {of}; more than "
            f"{_num(limit)}{unit} is a regression",
        )
    elif m.rule == "rise_pct" and base > 0 and value > base * (1 + limit / 100):
        rose = 100 * (value - base) / base
        out.regressed(
            m,
            name,
            base,
            value,
            f"{m.what} {_num(value)}{unit} is {rose:.1f}% above {of}; more than "
            f"{_num(limit)}% is a regression",
        )


def judge_values(
    current: Values,
    past: Past,
    lim: HistoryLimits,
    now: float,
    out: Judgement,
    names: Callable[[str], bool] = lambda name: True,
) -> None:
    """Every rule whose metric was measured now (and is selected by `names`)."""
    for name, value in sorted(current.items()):
        if name == KERNEL_LOG_UNTIL or not names(name):
            continue
        m = metrics.metric(name)
        limit = getattr(lim, m.key)
        if limit is None:
            continue
        if m.rule in ("growth", "rate"):
            judge_counter(m, name, value, past, float(limit), now, out)
        elif m.rule in ("drop", "rise", "rise_pct"):
            judge_drift(m, name, value, past, lim, float(limit), out)


def _index_of(sample: Sample, key: str) -> str | None:
    """Where the GPU with this serial (or UUID) sat in an earlier run, if it was there."""
    for index, ids in (sample.get("gpus") or {}).items():
        if key in (ids.get("serial"), ids.get("uuid")):
            return str(index)
    return None


def _gpu_notes(runs: list[Sample], gpu: dict[str, Any], key: str | None) -> list[str]:
    """How this GPU slot changed since the last run: another GPU, moved, new VBIOS."""
    if not runs:
        return []
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
        notes.append(
            f"gpu{index} is another GPU since the last run: {now}, was {was}{also}; its "
            "baseline restarts"
        )
    elif before.get("vbios") and gpu.get("vbios_version") not in (None, before.get("vbios")):
        notes.append(
            f"gpu{index} VBIOS changed since the last run: {before['vbios']} -> "
            f"{gpu['vbios_version']}; its baseline restarts"
        )
    return notes


def _same_epoch(node: NodeView) -> Callable[[Sample], bool]:
    """Whether an earlier run had the node's current driver and HCA firmware."""
    now, _ = metrics.identity(node.facts)
    return lambda sample: (
        sample.get("driver") == now["driver"] and (sample.get("firmware") or {}) == now["firmware"]
    )


def _gpu_past(runs: list[Sample], node: NodeView, key: str, vbios: Any, until_change: bool) -> Past:
    """This GPU's earlier values, newest first; with `until_change`, only since its VBIOS or
    the node's driver or firmware last changed (a drift baseline restarts there)."""
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
        past.append(_entry(sample, (sample.get("gpu") or {}).get(index, {})))
    return past


def _node_past(runs: list[Sample], node: NodeView, until_change: bool) -> Past:
    """The node's earlier values, newest first; with `until_change`, only since its driver or
    firmware last changed."""
    kept = takewhile(_same_epoch(node), runs) if until_change else runs
    return [_entry(sample, sample.get("node") or {}) for sample in kept]


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
    key = metrics.gpu_key(gpu)
    if key is None:
        out.unjudged.append(f"gpu{gpu['index']} has no serial or UUID to find its history by")
        return
    counters = {n: v for n, v in current.items() if metrics.metric(n).rule in ("growth", "rate")}
    drifts = {n: v for n, v in current.items() if n not in counters}
    vbios = gpu.get("vbios_version")
    judge_values(counters, _gpu_past(runs, node, key, vbios, False), lim, now, out)
    judge_values(drifts, _gpu_past(runs, node, key, vbios, True), lim, now, out)


@CHECKS.gpu("gpu_regression", "regression", severity="normal", section="history", in_use=True)
def gpu_regression(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No error counter of this GPU grew since the last run; idle temperature and power near
    its own baseline."""
    record, runs = _history(node)
    index = gpu["index"]
    out = Judgement(gpu_label(node.host, index, gpu), index, "gpu_regression")
    key = metrics.gpu_key(gpu)
    out.notes = _gpu_notes(runs, gpu, key)
    _judge_gpu_values(node, gpu, record, runs, metrics.gpu_values(gpu, node.in_use), out)
    mine = sum(1 for sample in runs if key is not None and _index_of(sample, key) is not None)
    return out.result(str(record.get("policy")), mine)


def _node_notes(runs: list[Sample], node: NodeView) -> list[str]:
    if not runs:
        return []
    last = runs[0]
    current, _ = metrics.identity(node.facts)
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


def _judge_xids(node: NodeView, runs: list[Sample], out: Judgement) -> None:
    lim = node.limits.get(HistoryLimits)
    if lim.regression_fatal_xid_growth is None:
        return
    m = metrics.metric("xid_fatal_events")
    if metrics.fatal_xid_groups(node.facts) is None:
        out.unjudged.append("XIDs: the kernel log was not read (see kernel_log)")
        return
    earlier = next(
        ((s["at"], s["node"][KERNEL_LOG_UNTIL]) for s in runs if KERNEL_LOG_UNTIL in s["node"]),
        None,
    )
    if earlier is None:
        out.unjudged.append("XIDs: no earlier run read the kernel log")
        return
    out.judged += 1
    count, seen, undated = metrics.new_fatal_xids(node.facts, float(earlier[1]))
    if count > lim.regression_fatal_xid_growth or undated:
        dated = f"{count} new since the last run ({when(earlier[0])})"
        out.regressed(
            m,
            m.name,
            0,
            count,
            f"{m.what}: {dated}{' and some with no time' if undated else ''}: {', '.join(seen)}",
        )


@CHECKS.node("node_regression", "regression", severity="normal", section="history", in_use=True)
def node_regression(node: NodeView) -> Result:
    """No new fatal XID since the last run; no InfiniBand error counter grew past its rate."""
    record, runs = _history(node, needed=True)
    out = Judgement(node.host, None, "node_regression")
    out.notes = _node_notes(runs, node)
    _judge_xids(node, runs, out)
    judge_values(
        metrics.node_values(node.facts),
        _node_past(runs, node, False),
        node.limits.get(HistoryLimits),
        _now(record),
        out,
        lambda name: name.startswith("ib."),
    )
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
    """Single-node NCCL busbw near the node's baseline; no GPU newly fails DCGM's diagnostic."""
    record, runs = _history(node, needed=True)
    out = Judgement(node.host, None, "load_regression")
    nccl = node.facts.get("nccl")
    reference = node.limits.get(NcclLimits).nccl_reference_size_bytes
    busbw = metrics.nccl_values(nccl, reference) if isinstance(nccl, dict) else {}
    if isinstance(nccl, dict) and not busbw:
        out.unjudged.append("busbw: not measured this run (see nccl_bandwidth)")
    judge_values(
        busbw, _node_past(runs, node, True), node.limits.get(HistoryLimits), _now(record), out
    )
    dcgm = node.facts.get("dcgm")
    per_gpu = metrics.dcgm_values(dcgm) if isinstance(dcgm, dict) else {}
    for index, values in sorted(per_gpu.items()):
        gpu = node.gpu(index)
        if gpu is None:
            continue
        mine = Judgement(gpu_label(node.host, index, gpu), index, "load_regression")
        _judge_gpu_values(node, gpu, record, runs, values, mine)
        out.regressions += mine.regressions
        out.advice += [a for a in mine.advice if a not in out.advice]
        # What a GPU could not be judged on stays said: a PASS covers only what was judged.
        out.unjudged += [text for text in mine.unjudged if text not in out.unjudged]
        out.judged += mine.judged
    if not per_gpu and isinstance(dcgm, dict):
        out.unjudged.append("DCGM: no per-GPU results this run (see dcgm_diag)")
    return out.result(str(record.get("policy")), len(runs))
