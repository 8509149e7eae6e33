"""Trend plots that serve a fleet of a thousand nodes: per metric, the fleet's spread (the
median and the 10th-90th percentile band over every node or GPU, night by night) with the worst
series drawn over it, the metric's unit, the fleet's reference level and the band where its
rule's limit lies, and a marker on every night a regression was reported.

Counters are drawn as their rule judges them: growth per day (correctable ECC, replays) or per
night (uncorrectable ECC, remapped rows) since the night before, a reset counter counting from
zero; never as lifetime totals, which only say how old a GPU is.

Which series are worst: those with a regression reported in the nights shown first, then the
furthest from their own first nights (the drop or rise rules' way), or for counters the
fastest growth. The panel's title says how many series there are and how many are drawn.

matplotlib draws them (the Agg backend: a PNG, no display), imported only when a plot is asked
for; it comes with `pip install 'gpuhealth[plot]'`.
"""

from __future__ import annotations

import io
import itertools
import statistics
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlalchemy as sa

from gpuhealth.families.history.limits import HistoryLimits
from gpuhealth.history.morning import COUNTER_RULES, lookup, regressions_of_nights
from gpuhealth.history.store import MEASUREMENTS, NIGHT, NODES, REGRESSIONS, RUNS, Store

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# What a nightly report plots when the store has it: the trends people ask about first.
KEY_METRICS = (
    "nccl_busbw_gbps",
    "ecc_corrected_aggregate",
    "remapped_rows_correctable",
    "idle_temperature_c",
)
WORST = 5  # series drawn over the fleet's band: a legend people can still read
BAND = (10, 90)  # the fleet's percentile band
# The worst series' colours: none of the band's blue, the reference's green, the limit's red.
COLORS = ("tab:orange", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "black")
REFERENCE_NIGHTS = 5  # a series' own first nights shown, its level to compare with
Subject = tuple[str, str | None]  # host, and the GPU's serial (or #index); None: the node


@dataclass
class Series:
    """One node's or GPU's values of a metric over the nights shown (oldest first)."""

    label: str
    nights: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    regressed: list[tuple[float, float]] = field(default_factory=list)  # (night, value)


# night, host, GPU index, the GPU's serial (a port's name: `mlx5_0.1`), value, stored name
Value = tuple[float, str, "int | None", "str | None", float, str]


def values(
    store: Store,
    names: list[str],
    since: float | None = None,
    host: str | None = None,
    gpu: int | None = None,
) -> dict[str, list[Value]]:
    """Each metric's stored values (complete runs, their nights), oldest first, by metric (a
    port metric's, `ib.*.symbol_error`, holding every port's: a panel each). The nights
    are read apart and joined here: a fleet's 30 nights of four metrics are 750,000 values,
    and a join per value in the database costs more than the scan."""
    hosts = sa.select(NODES.c.run_id, NODES.c.host, NIGHT.label("night")).join(
        RUNS, NODES.c.run_id == RUNS.c.id
    )
    hosts = hosts.where(RUNS.c.complete)
    if since is not None:
        hosts = hosts.where(NIGHT >= since)
    if host is not None:
        hosts = hosts.where(NODES.c.host == host)
    nights = {(row.run_id, row.host): row.night for row in store.read(hosts)}
    query = sa.select(
        MEASUREMENTS.c.run_id,
        MEASUREMENTS.c.host,
        MEASUREMENTS.c.gpu,
        MEASUREMENTS.c.gpu_key,
        MEASUREMENTS.c.value,
        MEASUREMENTS.c.metric,
    ).where(MEASUREMENTS.c.metric.in_(names))
    if host is not None:
        query = query.where(MEASUREMENTS.c.host == host)
    if gpu is not None:
        query = query.where(MEASUREMENTS.c.gpu == gpu)
    found: dict[str, list[Value]] = {}
    for row in store.read(query):
        night = nights.get((row.run_id, row.host))
        if night is None:
            continue
        panel, key = row.metric, row.gpu_key
        m = lookup(row.metric)
        if m is not None and m.name != row.metric:  # a port's: one panel for every port
            head, _, tail = m.name.partition("*")
            panel, key = m.name, row.metric.removeprefix(head).removesuffix(tail)
        found.setdefault(panel, []).append((night, row.host, row.gpu, key, row.value, row.metric))
    for rows in found.values():
        rows.sort(key=lambda row: row[0])
    return found


def names_like(store: Store, pattern: str) -> list[str]:
    """The stored metric names a `*` glob matches (`ib.*`), sorted."""
    like = pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    query = sa.select(MEASUREMENTS.c.metric).distinct()
    query = query.where(MEASUREMENTS.c.metric.like(like.replace("*", "%"), escape="\\"))
    return sorted(row.metric for row in store.read(query))


def collect(
    rows: list[Value], regressed: set[tuple[str, int | None, str, float]], metric: str
) -> dict[Subject, Series]:
    """A metric's series per node, GPU or port (its values from `values`), counters as their rule
    judges them (growth per day, or since the night before); `regressed`: (host, GPU index,
    metric, night) reported as regressions."""
    m = lookup(metric)
    rule = m.rule if m else ""
    found: dict[Subject, Series] = {}
    last: dict[Subject, tuple[float, float]] = {}
    for night, host, gpu, key, value, name in rows:
        subject = (host, key or (None if gpu is None else f"#{gpu}"))
        series = found.get(subject)
        if series is None:
            label = f"{host} gpu{gpu}" if gpu is not None else f"{host} {key or ''}".strip()
            series = found[subject] = Series(label)
        if rule in ("growth", "rate"):
            before = last.get(subject)
            last[subject] = (night, value)
            if before is None:
                continue
            grown = value - before[1]
            if grown < 0:
                if not (m and m.resets):
                    continue  # a lifetime counter went down: its own regression, no rate
                grown = value
            # As the rule judges it: a rate per day (a gap under a day counts as one), growth
            # per night.
            value = grown / max((night - before[0]) / 86400, 1.0) if rule == "rate" else grown
        series.nights.append(night)
        series.values.append(value)
        if (host, gpu, name, night) in regressed:
            series.regressed.append((night, value))
    return {subject: series for subject, series in found.items() if series.values}


def _reference(series: Series) -> float:
    return statistics.median(series.values[:REFERENCE_NIGHTS])


def worst(found: dict[Subject, Series], metric: str, count: int = WORST) -> list[Series]:
    """The series to draw over the band: regressed ones first, then the furthest the rule's
    way from their own first nights (counters: the fastest growth)."""
    m = lookup(metric)
    rule = m.rule if m else "growth"

    def badness(series: Series) -> tuple[bool, float]:
        latest, reference = series.values[-1], _reference(series)
        if rule in COUNTER_RULES:
            score = max(series.values)
        elif rule == "drop":
            score = (reference - latest) / reference if reference else 0.0
        elif rule == "rise":
            score = latest - reference
        else:
            score = (latest - reference) / reference if reference else 0.0
        return bool(series.regressed), score

    ranked = sorted(found.values(), key=lambda s: (*badness(s), s.label), reverse=True)
    return ranked[:count]


def _band(
    found: dict[Subject, Series],
) -> tuple[list[float], list[float], list[float], list[float]]:
    """Per UTC day (a night's runs fall on one), the median night and the fleet's median and
    percentile band over each series' value that day."""
    import numpy

    days: dict[int, dict[Subject, tuple[float, float]]] = {}
    for subject, series in found.items():
        for night, value in zip(series.nights, series.values, strict=True):
            days.setdefault(int(night // 86400), {})[subject] = (night, value)
    when, low, middle, high = [], [], [], []
    for day in sorted(days):
        nights = [night for night, _ in days[day].values()]
        values = numpy.array([value for _, value in days[day].values()])
        when.append(_date(statistics.median(nights)))
        low.append(float(numpy.percentile(values, BAND[0])))
        middle.append(float(numpy.median(values)))
        high.append(float(numpy.percentile(values, BAND[1])))
    return when, low, middle, high


def _date(epoch: float) -> float:
    """A time as matplotlib's dates are (days since 1970-01-01 UTC, its default epoch)."""
    return epoch / 86400.0


def axis_label(metric: str) -> str:
    """The y axis's label: what is drawn and its unit."""
    m = lookup(metric)
    if m is None:
        return metric
    if m.rule == "rate":
        return f"{m.what} per day"
    if m.rule == "growth":
        return f"{m.what}: growth since the night before"
    return f"{m.what} ({m.unit})" if m.unit else m.what


def limit_band(metric: str, reference: float, lim: HistoryLimits) -> tuple[float, str] | None:
    """Where the rule's limit lies against the fleet's reference level: (the level, whether
    the regression side is "below" or "above"); None when the rule is off."""
    m = lookup(metric)
    if m is None:
        return None
    limit = getattr(lim, m.key, None)
    if limit is None:
        return None
    if m.rule == "drop":
        return reference * (1 - limit / 100), "below"
    if m.rule == "rise":
        return reference + limit, "above"
    if m.rule == "rise_pct":
        return reference * (1 + limit / 100), "above"
    return float(limit), "above"  # a counter's allowance: per day, or per night for growth


def panel(
    axis: Axes, metric: str, found: dict[Subject, Series], lim: HistoryLimits, count: int
) -> None:
    """One metric's panel: band, median, reference and limit, the worst series, markers."""
    from matplotlib.dates import DateFormatter

    m = lookup(metric)
    drawn = worst(found, metric, count)
    when, low, middle, high = _band(found)
    if len(found) > len(drawn):
        label = f"fleet {BAND[0]}th-{BAND[1]}th percentile"
        axis.fill_between(when, low, high, color="tab:blue", alpha=0.2, label=label)
        axis.plot(when, middle, color="tab:blue", linewidth=2, label="fleet median")
    reference = statistics.median(_reference(s) for s in found.values())
    counter = m is not None and m.rule in COUNTER_RULES
    if not counter:
        axis.axhline(reference, color="tab:green", linestyle="--", label="fleet reference")
    for series, color in zip(drawn, itertools.cycle(COLORS), strict=False):
        when_of = [_date(t) for t in series.nights]
        axis.plot(when_of, series.values, marker=".", color=color, label=series.label)
    marks = [point for series in found.values() for point in series.regressed]
    if marks:
        axis.scatter(
            [_date(t) for t, _ in marks],
            [v for _, v in marks],
            marker="x",
            color="red",
            s=60,
            zorder=5,
            label=f"regression reported ({len(marks)})",
        )
    bottom, top = axis.get_ylim()
    limit = limit_band(metric, reference, lim)
    if limit is not None:
        level, side = limit
        name = f"beyond the limit ({m.key})" if m else "beyond the limit"
        if side == "above":
            top = max(top, level + abs(level) * 0.05 + 1e-9)
            axis.axhspan(level, top, color="tab:red", alpha=0.08, label=name)
        else:
            bottom = min(bottom, level - abs(level) * 0.05)
            axis.axhspan(bottom, level, color="tab:red", alpha=0.08, label=name)
        axis.set_ylim(bottom, top)
    shown = (
        f"{len(drawn)} worst of {len(found)} series"
        if len(found) > len(drawn)
        else (f"all {len(found)} series")
    )
    axis.set_title(f"{metric}: {shown}", fontsize="medium")
    axis.set_ylabel(textwrap.fill(axis_label(metric), 36), fontsize="small")
    axis.set_xlabel("night (UTC)")
    axis.xaxis_date(tz="UTC")
    axis.xaxis.set_major_formatter(DateFormatter("%m-%d"))
    axis.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="small")


def figure(
    rows: dict[str, list[Value]],
    regressed: set[tuple[str, int | None, str, float]],
    metric_names: list[str],
    title: str,
    lim: HistoryLimits | None = None,
    count: int = WORST,
) -> Figure:
    """The figure: one panel per metric (`rows`: each metric's values from `values`)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    lim = lim or HistoryLimits()
    made = Figure(figsize=(12, 3.6 * len(metric_names)), layout="constrained")
    axes = made.subplots(len(metric_names), 1, squeeze=False)[:, 0]
    for axis, metric in zip(axes, metric_names, strict=True):
        found = collect(rows.get(metric, []), regressed, metric)
        if found:
            panel(axis, metric, found, lim, count)
        else:
            axis.set_title(f"{metric}: no values in the nights shown", fontsize="medium")
    made.suptitle(title)
    return made


def png(made: Figure) -> bytes:
    """The figure as a PNG."""
    buffer = io.BytesIO()
    made.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def regressed_nights(
    store: Store, since: float | None, host: str | None = None
) -> set[tuple[str, int | None, str, float]]:
    """(host, GPU index, metric, night) of every regression reported for the nights shown."""
    query = (
        sa.select(REGRESSIONS.c.host, REGRESSIONS.c.gpu, REGRESSIONS.c.metric, NIGHT.label("n"))
        .select_from(regressions_of_nights())
        .where(RUNS.c.complete)
    )
    if since is not None:
        query = query.where(NIGHT >= since)
    if host is not None:
        query = query.where(REGRESSIONS.c.host == host)
    return {(row.host, row.gpu, row.metric, row.n) for row in store.read(query)}


def trends_png(store: Store, since: float) -> bytes | None:
    """The nightly report's trend plot of the key metrics the store has (None: none yet, or
    matplotlib is not installed)."""
    rows = values(store, list(KEY_METRICS), since)
    found = [m for m in KEY_METRICS if rows.get(m)]
    if not found or len({night for m in found for night, *_ in rows[m]}) < 2:
        return None
    try:
        made = figure(
            rows, regressed_nights(store, since), found, f"gpuhealth trends ({store.name})"
        )
    except ModuleNotFoundError:
        return None
    return png(made)
