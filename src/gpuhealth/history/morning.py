"""The morning answer: what regressed across the fleet since the last run (or a time), one line
per regression, and each node's measured values as one line per metric (`gpuhealth history`).

A regression as the store keeps it holds the one baseline that tripped its rule; this module
puts both baselines beside it, the **reference** (median of the first good nights of the
subject's current identity: after commissioning, a GPU, VBIOS, driver or firmware change, or a
pin) and the **rolling** one (median of the last good nights), computed from the store as the
checks compute them (families/history/checks.py: judge_drift, _gpu_past), with the limits of
the node's profile as recorded (inventory overrides of a single host are not in the store).

GPUs are followed by serial (UUID where there is none) as the store keys them; a GPU with
neither is followed by its index. `_gpu_identity` is where further identity columns of the
store (the GPU's UUID beside its serial, the machine's) are read.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import sqlalchemy as sa

from gpuhealth.config import ConfigError, ProfileSet
from gpuhealth.families.history import metrics
from gpuhealth.families.history.checks import theil_sen
from gpuhealth.families.history.limits import HistoryLimits
from gpuhealth.history.store import (
    ALIASES,
    GPUS,
    HOST,
    MEASUREMENTS,
    NIGHT,
    NODES,
    PINS,
    REGRESSIONS,
    RUNS,
    Store,
)

COUNTER_RULES = ("growth", "rate", "new_events")
DRIFT_RULES = ("drop", "rise", "rise_pct")
_CHUNK = 500  # bounded IN lists
# The last run's night: the runs that started up to this long before the newest (a fleet
# judged as shards or CI groups is several runs a night).
LAST_NIGHT = 12 * 3600.0


def stamp(epoch: float | None) -> str:
    """A night or run time as people read it: UTC to the second (two runs in the same minute,
    e.g. two CI groups, must not look alike)."""
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch))


def number(value: Any) -> str:
    """A measured value for a table: never in exponent notation (a counter of 1.8e9 is
    1800000000), at most one decimal; a non-number as it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-" if value is None else str(value)
    if value == int(value):
        return str(int(value))
    return f"{value:.1f}" if abs(value) >= 0.1 else f"{value:.3g}"


def span_seconds(text: str) -> float | None:
    """`36h`, `7d`, `2w` as seconds; None when the text is no such span."""
    found = re.fullmatch(r"(\d+)([hdw])", text.strip())
    if not found:
        return None
    return float(int(found.group(1)) * {"h": 3600, "d": 86400, "w": 604800}[found.group(2)])


def parse_since(text: str, now: float | None = None) -> float:
    """`--since`: a span back from now (`36h`, `7d`, `2w`) or a UTC date or time
    (`2026-11-26`, `2026-11-26T02:00`), as epoch seconds; ValueError when it is neither."""
    span = span_seconds(text)
    if span is not None:
        return (time.time() if now is None else now) - span
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a span (36h, 7d, 2w) nor a UTC date or time "
            "(2026-11-26, 2026-11-26T02:00)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def lookup(name: str) -> metrics.Metric | None:
    """The metric's declaration (unit, rule, profile key), None for what is no metric (a new
    failure's `verdict`, a stored value that says where a log reading ended, or a name this
    gpuhealth no longer declares)."""
    try:
        return metrics.metric(name)
    except KeyError:
        return None


class Limits:
    """History limits by profile name as the store recorded it (the packaged profiles; a
    profile this gpuhealth does not know gives the family's defaults)."""

    def __init__(self) -> None:
        self._profiles: ProfileSet | None = None
        self._found: dict[str | None, HistoryLimits] = {}

    def of(self, profile: str | None) -> HistoryLimits:
        """The limits of the profile (cached)."""
        if profile not in self._found:
            limits = HistoryLimits()
            if profile:
                try:
                    self._profiles = self._profiles or ProfileSet()
                    limits = self._profiles.get(profile).get(HistoryLimits)
                except (ConfigError, KeyError, TypeError):
                    pass  # unknown here: the family's defaults
            self._found[profile] = limits
        return self._found[profile]


# ------------------------------------------------------------------ a subject's nights


@dataclass
class Point:
    """One night's value of one node or GPU metric."""

    night: float
    value: float
    good: bool  # counts for baselines: node PASS or WARN, no regression that night
    epoch: tuple[Any, ...]  # what restarts a baseline when it changes: driver, firmware, VBIOS
    gpu: int | None  # the index it sat at that night


@dataclass
class Summary:
    """A subject's metric over its nights: the latest value, its baselines and its trend."""

    metric: str
    gpu: int | None
    serial: str | None
    latest: float
    reference: float | None = None
    rolling: float | None = None
    slope: float | None = None  # drift: Theil-Sen slope per run over the trend window
    last: float | None = None  # counters: growth since the night before (a rate's: per day)
    growth: float | None = None  # counters: growth over the nights shown


@dataclass
class HostNights:
    """Every measured value of one host's machine's own nights (complete runs, not
    re-judgements; under earlier host names too), grouped by subject: (metric, GPU serial, or
    `#index` without one, or None for the node)."""

    host: str
    profile: str | None = None
    points: dict[tuple[str, str | None], list[Point]] = field(default_factory=dict)
    node_pins: list[float] = field(default_factory=list)
    gpu_pins: dict[str, list[float]] = field(default_factory=dict)


def _firmware(text: str | None) -> str:
    return json.dumps(json.loads(text), sort_keys=True) if text else ""


def _gpu_identity(row: Any) -> str | None:
    """What follows a GPU from night to night (serial, else UUID); None: only its index."""
    return metrics.gpu_key({"serial": row.serial, "uuid": row.uuid})


def host_nights(
    store: Store, host: str, since: float | None = None, names: Iterable[str] | None = None
) -> HostNights:
    """The host's nights from the store (all of them: a reference formed long ago counts;
    `since` only limits the subjects returned to those measured since), of every metric or
    those `names`."""
    found = fleet_nights(store, [host], names).get(host) or HostNights(host)
    if since is not None:
        found.points = {
            subject: series for subject, series in found.points.items() if series[-1].night >= since
        }
    return found


def fleet_nights(
    store: Store, hosts: Iterable[str], names: Iterable[str] | None = None
) -> dict[str, HostNights]:
    """`host_nights` of many hosts, a few queries per 500 of them (the morning answer of a
    fleet-wide regression reads a thousand hosts' baselines)."""
    wanted = sorted(set(hosts))
    found: dict[str, HostNights] = {}
    for start in range(0, len(wanted), _CHUNK):
        chunk = wanted[start : start + _CHUNK]
        found.update(_nights_of(store, chunk, None if names is None else sorted(set(names))))
    return found


def machines(store: Store, hosts: list[str]) -> dict[str, str]:
    """The machine each host name last belonged to (the store's node_id; a renamed host's
    earlier nights are under its old name), for the names the store has seen."""
    rows = store.read(
        sa.select(ALIASES.c.value, ALIASES.c.node_id).where(
            ALIASES.c.kind == HOST, ALIASES.c.value.in_(hosts)
        )
    )
    return {row.value: row.node_id for row in rows}


def _nights_of(store: Store, hosts: list[str], names: list[str] | None) -> dict[str, HostNights]:
    """host_nights of up to _CHUNK hosts: each host's machine's nights under any name."""
    owners = {node_id: host for host, node_id in machines(store, hosts).items()}
    unknown = [host for host in hosts if host not in owners.values()]
    own = sa.and_(
        sa.or_(NODES.c.node_id.in_(list(owners)), NODES.c.host.in_(unknown)),
        NODES.c.rejudges.is_(None),
        RUNS.c.complete,
    )
    nodes = store.read(
        sa.select(
            RUNS.c.id,
            NODES.c.host,
            NODES.c.node_id,
            NIGHT.label("night"),
            NODES.c.verdict,
            NODES.c.driver,
            NODES.c.firmware,
            NODES.c.profile,
        )
        .join(RUNS, NODES.c.run_id == RUNS.c.id)
        .where(own)
        .order_by(NIGHT, RUNS.c.id)
    )
    owner = {
        (row.id, row.host): owners.get(row.node_id, row.host)
        for row in nodes
        if row.node_id in owners or row.host in unknown
    }
    names_seen = sorted({row.host for row in nodes})
    found = {host: HostNights(host) for host in set(owner.values())}
    for row in nodes:
        if (row.id, row.host) in owner:
            found[owner[(row.id, row.host)]].profile = row.profile  # the latest night's
    bad = {
        (row.host, row.night)
        for row in store.read(
            sa.select(REGRESSIONS.c.host, NIGHT.label("night"))
            .select_from(regressions_of_nights())
            .where(REGRESSIONS.c.host.in_(names_seen), RUNS.c.complete)
            .distinct()
        )
    }
    runs = {
        (row.id, row.host): (
            found[owner[(row.id, row.host)]],
            row.night,
            row.verdict in ("PASS", "WARN") and (row.host, row.night) not in bad,
            (row.driver, _firmware(row.firmware)),
        )
        for row in nodes
        if (row.id, row.host) in owner
    }
    gpus = {
        (row.run_id, row.host, row.idx): (_gpu_identity(row), row.vbios)
        for row in store.read(
            sa.select(
                GPUS.c.run_id, GPUS.c.host, GPUS.c.idx, GPUS.c.serial, GPUS.c.uuid, GPUS.c.vbios
            ).where(GPUS.c.host.in_(names_seen))
        )
    }
    query = sa.select(
        MEASUREMENTS.c.run_id,
        MEASUREMENTS.c.host,
        MEASUREMENTS.c.gpu,
        MEASUREMENTS.c.gpu_key,
        MEASUREMENTS.c.metric,
        MEASUREMENTS.c.value,
    ).where(MEASUREMENTS.c.host.in_(names_seen))
    if names is not None:
        query = query.where(MEASUREMENTS.c.metric.in_(names))
    declared: dict[str, bool] = {}
    for row in store.read(query):
        if row.metric not in declared:
            declared[row.metric] = lookup(row.metric) is not None
        night_of = runs.get((row.run_id, row.host))
        if night_of is None or not declared[row.metric]:
            # An incomplete run or one that only judged again; or a value no metric declares
            # (where a log reading ended), which is no measurement.
            continue
        mine, night, good, epoch = night_of
        key, vbios = row.gpu_key, None
        if row.gpu is not None:
            known, vbios = gpus.get((row.run_id, row.host, row.gpu), (None, None))
            key = key or known or f"#{row.gpu}"
        point = Point(night, row.value, good, (*epoch, vbios), row.gpu)
        mine.points.setdefault((row.metric, key), []).append(point)
    for nights in found.values():
        for series in nights.points.values():
            series.sort(key=lambda p: p.night)
    pins = store.read(
        sa.select(PINS).where(sa.or_(PINS.c.node_id.in_(list(owners)), PINS.c.host.in_(unknown)))
    )
    for pin in pins:
        pinned = found.get(owners.get(pin.node_id, pin.host))
        if pinned is None:
            continue
        if pin.gpu_key is None:
            pinned.node_pins.append(pin.at)
        else:
            pinned.gpu_pins.setdefault(pin.gpu_key, []).append(pin.at)
    return found


def _pinned(nights: HostNights, key: str | None, before: float) -> float | None:
    pins = nights.node_pins + (nights.gpu_pins.get(key, []) if key else [])
    return max((at for at in pins if at < before), default=None)


def baselines(
    series: list[Point], at: float, lim: HistoryLimits, pinned: float | None
) -> tuple[float | None, float | None, list[float]]:
    """The reference and rolling baselines of a subject's night at `at`, and its good values
    before it (newest first), from the nights before `at` of the same identity since its pin
    (as checks.judge_drift forms them)."""
    current = next((p for p in reversed(series) if p.night <= at), None)
    if current is None:
        return None, None, []
    goods: list[float] = []
    for point in reversed(series):
        if point.night >= at:
            continue
        if point.epoch != current.epoch or (pinned is not None and point.night <= pinned):
            break
        if point.good:
            goods.append(point.value)
    if len(goods) < lim.history_min_runs:
        return None, None, goods
    rolling = statistics.median(goods[: lim.history_baseline_runs])
    runs = lim.history_reference_runs
    reference = statistics.median(goods[-runs:]) if runs else None
    return reference, rolling, goods


def _grown(m: metrics.Metric | None, before: Point, after: Point) -> float:
    """A counter's growth from one night to the next; one that resets (a reboot) and went
    down counts from zero."""
    grown = after.value - before.value
    return after.value if grown < 0 and m is not None and m.resets else grown


def summarise(nights: HostNights, lim: HistoryLimits) -> list[Summary]:
    """Every subject's metric at its latest night: baselines and trend for drift metrics;
    for counters, the growth since the night before (per day for a rate rule) and over the
    nights."""
    found = []
    for (name, key), series in sorted(
        nights.points.items(), key=lambda kv: (kv[0][0], kv[1][-1].gpu or -1)
    ):
        last = series[-1]
        out = Summary(name, last.gpu, None if key and key.startswith("#") else key, last.value)
        m = lookup(name)
        rule = m.rule if m else "growth"
        if rule in DRIFT_RULES:
            out.reference, out.rolling, goods = baselines(
                series, last.night, lim, _pinned(nights, key, last.night)
            )
            window = [*reversed(goods[: lim.history_trend_runs - 1]), last.value]
            if len(window) > lim.history_trend_min_runs:
                out.slope = theil_sen(window)[0]
        elif len(series) > 1:
            steps = [_grown(m, a, b) for a, b in itertools.pairwise(series)]
            days = max((last.night - series[-2].night) / 86400, 1.0) if rule == "rate" else 1.0
            out.last = steps[-1] / days
            out.growth = sum(steps)
        found.append(out)
    return found


# ------------------------------------------------------------------ the fleet's regressions


@dataclass
class Regression:
    """One regression reported for a night, with both baselines beside its value."""

    night: float
    run: str
    host: str
    gpu: int | None
    serial: str | None
    metric: str
    unit: str
    check: str
    rule: str  # what tripped, in words: "rise > 10 C above the reference"
    key: str | None  # the profile key of its limit
    value: Any
    baseline: Any  # as stored: the baseline that tripped (a counter: its last value)
    reference: float | None
    rolling: float | None
    message: str


@dataclass
class Scope:
    """Which nights the morning answer covers and how many nodes they judged."""

    text: str
    nodes: int
    runs: list[str] | None = None  # the runs' uids; None: every night since `since`
    since: float | None = None


def regressions_of_nights() -> Any:
    """Regressions joined with their host's row of their run (its night) and the run."""
    return REGRESSIONS.join(
        NODES, sa.and_(NODES.c.run_id == REGRESSIONS.c.run_id, NODES.c.host == REGRESSIONS.c.host)
    ).join(RUNS, RUNS.c.id == NODES.c.run_id)


def last_runs(store: Store) -> list[Any]:
    """The last night's complete runs: the newest and those that started up to LAST_NIGHT
    before it (the shards of `--shard K/N`, CI groups), newest first; empty in an empty
    store."""
    columns = (RUNS.c.id, RUNS.c.uid, RUNS.c.started_at, RUNS.c.inventory, RUNS.c.level)
    newest = store.read(
        sa.select(RUNS.c.started_at)
        .where(RUNS.c.complete)
        .order_by(RUNS.c.started_at.desc(), RUNS.c.id.desc())
        .limit(1)
    )
    if not newest:
        return []
    return store.read(
        sa.select(*columns)
        .where(RUNS.c.complete, RUNS.c.started_at >= newest[0].started_at - LAST_NIGHT)
        .order_by(RUNS.c.started_at.desc(), RUNS.c.id.desc())
    )


def scope_of(store: Store, since: float | None) -> Scope | None:
    """The nights of the last night's runs (`last_runs`), or every night since `since`; None
    when there are none (nothing was judged: the answer is unknown, not "no regression")."""
    if since is not None:
        count = store.read(
            sa.select(sa.func.count(sa.distinct(NODES.c.host)))
            .join(RUNS, NODES.c.run_id == RUNS.c.id)
            .where(RUNS.c.complete, NIGHT >= since)
        )[0][0]
        if not count:
            return None
        return Scope(f"nights since {stamp(since)} UTC", int(count), since=since)
    runs = last_runs(store)
    if not runs:
        return None
    ids = [run.id for run in runs]
    count = store.read(
        sa.select(sa.func.count(sa.distinct(NODES.c.host))).where(NODES.c.run_id.in_(ids))
    )[0][0]
    described = [
        f"{run.uid[:8]} ({stamp(run.started_at)} UTC, {run.level}"
        + (f", {run.inventory})" if run.inventory else ")")
        for run in runs
    ]
    text = (
        f"the last run {described[0]}"
        if len(runs) == 1
        else f"the last night's {len(runs)} runs: {'; '.join(described)}"
    )
    return Scope(text, int(count), runs=[run.uid for run in runs])


def _rule(m: metrics.Metric | None, message: str, lim: HistoryLimits) -> tuple[str, str | None]:
    """What tripped, in words, and its profile key. Which baseline tripped a drift rule is read
    from the message checks.judge_drift / judge_trend wrote ("its reference", "steadily")."""
    if m is None:
        return "new failure: passed in its last run, fails now", None
    limit = getattr(lim, m.key, None)
    shown = "off" if limit is None else number(limit)
    unit_of = f" {m.unit}" if m.unit else ""
    if m.rule in DRIFT_RULES:
        if " steadily: " in message and m.trend_key:
            per_run = "%" if m.rule != "rise" else unit_of
            slope = getattr(lim, m.trend_key, None)
            way = "falls" if m.rule == "drop" else "rises"
            return f"trend: {way} >= {number(slope)}{per_run} a run", m.trend_key
        which = "reference" if "its reference " in message else "rolling baseline"
        way, by = {
            "drop": ("below", "%"),
            "rise": ("above", unit_of),
            "rise_pct": ("above", "%"),
        }[m.rule]
        return f"{shown}{by} {way} the {which}", m.key
    if m.rule == "rate":
        return f"> {shown} a day", m.key
    if m.rule == "new_events":
        return f"> {shown} new since the last run", m.key
    return f"growth > {shown} since the last run", m.key


def _json(text: str | None) -> Any:
    return json.loads(text) if text is not None else None


def regressions(
    store: Store, scope: Scope, limits: Limits | None = None, host: str | None = None
) -> list[Regression]:
    """Every regression reported for the scope's nights (by the run that judged them or a
    re-judgement since; of one host, or all), oldest night first, with its GPU's serial and
    both baselines."""
    limits = limits or Limits()
    query = (
        sa.select(
            NIGHT.label("night"),
            RUNS.c.uid,
            RUNS.c.id.label("run_id"),
            REGRESSIONS.c.host,
            REGRESSIONS.c.gpu,
            REGRESSIONS.c.check,
            REGRESSIONS.c.metric,
            REGRESSIONS.c.baseline,
            REGRESSIONS.c.value,
            REGRESSIONS.c.message,
            NODES.c.profile,
        )
        .select_from(regressions_of_nights())
        .where(RUNS.c.complete)
        .order_by(NIGHT, REGRESSIONS.c.host, REGRESSIONS.c.gpu, REGRESSIONS.c.id)
    )
    if scope.runs is not None:
        query = query.where(RUNS.c.uid.in_(scope.runs))
    else:
        query = query.where(NIGHT >= scope.since)
    if host is not None:
        query = query.where(REGRESSIONS.c.host == host)
    rows = store.read(query)
    serials = _serials(store, [(r.run_id, r.host, r.gpu) for r in rows if r.gpu is not None])
    drifting = {r.host for r in rows if (m := lookup(r.metric)) and m.rule in DRIFT_RULES}
    nights = fleet_nights(store, drifting, {r.metric for r in rows if r.host in drifting})
    found = []
    for row in rows:
        m = lookup(row.metric)
        lim = limits.of(row.profile)
        rule, key = _rule(m, row.message, lim)
        baseline, value = _json(row.baseline), _json(row.value)
        serial = serials.get((row.run_id, row.host, row.gpu))
        reference = rolling = None
        if m is not None and m.rule in DRIFT_RULES:
            past = nights.get(row.host) or HostNights(row.host)
            subject = serial or (f"#{row.gpu}" if row.gpu is not None else None)
            series = past.points.get((row.metric, subject), [])
            pinned = _pinned(past, subject, row.night)
            reference, rolling, _ = baselines(series, row.night, lim, pinned)
            # What tripped is exact as stored; the other baseline is computed.
            if "rolling" in rule:
                rolling = baseline
            elif "reference" in rule:
                reference = baseline
        elif m is not None:
            rolling = baseline  # a counter: its last run's value
        found.append(
            Regression(
                night=row.night,
                run=row.uid,
                host=row.host,
                gpu=row.gpu,
                serial=serial,
                metric=row.metric,
                unit=m.unit if m else "",
                check=row.check,
                rule=rule,
                key=key,
                value=value,
                baseline=baseline,
                reference=reference,
                rolling=rolling,
                message=row.message,
            )
        )
    return found


def _serials(
    store: Store, wanted: Iterable[tuple[int, str, int]]
) -> dict[tuple[int, str, int], str]:
    """The serial (UUID where none) of each GPU (run, host, index) asked for."""
    by_run: dict[int, set[str]] = {}
    for run_id, host, _ in wanted:
        by_run.setdefault(run_id, set()).add(host)
    found = {}
    for run_id, hosts in by_run.items():
        names = sorted(hosts)
        for start in range(0, len(names), _CHUNK):
            for row in store.read(
                sa.select(GPUS.c.host, GPUS.c.idx, GPUS.c.serial, GPUS.c.uuid).where(
                    GPUS.c.run_id == run_id, GPUS.c.host.in_(names[start : start + _CHUNK])
                )
            ):
                key = _gpu_identity(row)
                if key:
                    found[(run_id, row.host, row.idx)] = key
    return found


def table(found: list[Regression]) -> list[str]:
    """The regressions as an aligned table: one line each."""
    header = (
        "night (UTC)",
        "node",
        "gpu",
        "serial",
        "metric",
        "value",
        "reference",
        "rolling",
        "rule",
    )
    rows = [
        (
            stamp(r.night),
            r.host,
            "-" if r.gpu is None else str(r.gpu),
            r.serial or "-",
            f"{r.metric} [{r.unit}]" if r.unit else r.metric,
            number(r.value),
            number(r.reference),
            number(r.rolling),
            f"{r.rule} ({r.key})" if r.key else r.rule,
        )
        for r in found
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    return [
        "  ".join([*(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)), row[-1]])
        for row in [header, *rows]
    ]


def document(store: Store, scope: Scope, found: list[Regression], policy: str) -> dict[str, Any]:
    """The answer as JSON (`--json`)."""
    return {
        "store": store.name,
        "scope": {"text": scope.text, "runs": scope.runs, "since": scope.since},
        "nodes_judged": scope.nodes,
        "policy": policy,
        "regressions": [{**asdict(r), "night_utc": stamp(r.night)} for r in found],
    }


def hosts(store: Store) -> list[str]:
    """Every host the store has a night of."""
    return [
        row.host for row in store.read(sa.select(NODES.c.host).distinct().order_by(NODES.c.host))
    ]
