"""The toolkit of what a family measures over time: its metrics, the rules history judges them
by, how exporters show them, and how to read them from a facts document.

A family declares its `MEASURES` in its own `metrics.py`; the registry finds it there (as it
finds `limits.py` and `checks.py`), and the run store, the regression checks and the
Prometheus textfile iterate the registry: none of them knows a family by name. Values are
numbers; what cannot be read is left out (unknown), never stored as zero.

Rules (families/history/checks.py applies them):
- growth: a counter that must not grow; compared with the last run that measured the same GPU
  (by serial) or port. A lower value of a counter that resets (`resets`: PCIe replays, IB
  counters, on a reboot or driver reload) means it was reset: its growth is then the value.
- rate: a counter that may grow slowly; growth since the last run per day, a gap shorter than a
  day counted as a day (a run repeated in the morning has a day's allowance, not a minute's).
- drop / rise / rise_pct: a measurement against two baselines of the good runs (node PASS or
  WARN, and no regression reported for the night) since the GPU's, driver's and firmware's
  identity last changed or the node (or GPU) was pinned: the rolling one, the median of the
  last good runs, and the reference, the median of the first ones, which stays put so that a
  slow decay cannot drag it down; and a trend (`trend_key`): a steady slope over the last good
  runs.
- new_events: events (kernel log lines) after where the last run's reading ended (`Events`).
- reading: not judged nor stored, only exported (what a GPU reads now, busy or idle).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuhealth.checks import NodeView

Values = dict[str, float]
Record = dict[str, Any]
GAUGE, COUNTER = "gauge", "counter"
# The rules a history baseline judges; `new_events` has its own reader, `reading` none.
COUNTER_RULES = ("growth", "rate")
DRIFT_RULES = ("drop", "rise", "rise_pct")
RULES = (*COUNTER_RULES, *DRIFT_RULES, "new_events", "reading")
# A port metric's name is a pattern `<prefix>.*.<counter>`; its stored values are named
# `<prefix>.<device>.<port>.<counter>` (e.g. `ib.mlx5_0.1.symbol_error`).
PORT = ".*."


@dataclass(frozen=True)
class Export:
    """How a metric is exposed to Prometheus: its name after `gpuhealth_` (a counter's without
    the `_total` the exposition adds; units in the name), its type and its HELP text."""

    name: str  # a GPU's value: gpu_... (labelled by GPU index)
    kind: str  # GAUGE or COUNTER: a counter is one the hardware keeps counting
    help: str


@dataclass(frozen=True)
class Metric:
    """One measured value, the history rule that judges it and the profile key of its limit."""

    name: str  # a port metric's is a pattern: ib.*.<counter>
    what: str
    rule: str  # one of RULES
    key: str = ""  # the profile key with the rule's limit ("" for a reading)
    unit: str = ""
    resets: bool = False  # a since-boot counter: lower than last time means reset
    saturates: int | None = None  # a counter that sticks at this value (IB PortCounters)
    advice: str = ""
    trend_key: str = ""  # drop / rise / rise_pct: the profile key of the trend rule's slope
    export: Export | None = None  # None: kept for history only

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"metric {self.name}: unknown rule {self.rule!r}")
        if self.rule != "reading" and not self.key:
            raise ValueError(f"metric {self.name}: the {self.rule} rule needs a profile key")


@dataclass(frozen=True)
class EventCount:
    """Events found after a time: at least how many, their descriptions, and whether some
    could not be placed in time (which counts as new: never a pass)."""

    count: int
    seen: list[str]
    undated: bool


@dataclass(frozen=True)
class Events:
    """A `new_events` metric's reader. `cursor` names the value stored with the node's
    measurements that says where this run's reading ended (stored, never judged); `read`
    gives the events after an epoch, where `readable` says the source was read; `source`
    names it in messages (`the kernel log`), `label` the events (`XIDs`) and `check` the
    check that reports the source's own failure."""

    metric: str
    cursor: str
    read: Callable[[Record, float], EventCount]
    readable: Callable[[Record], bool]
    label: str
    source: str
    check: str


@dataclass(frozen=True)
class Measures:
    """Everything one family measures, declared in its `metrics.py` as `MEASURES`.

    `node(facts)`: the node's passive values; `gpu(record, node_in_use)`: one GPU record's
    passive values (a node in use gives no idle readings); `readings(record)`: a GPU's values
    for exporters only; `load(view, section)`: the values of the family's load-test section,
    by GPU index (None: the node's), with `unmeasured` said when the section gives none;
    `identity(facts)`: what identifies the node's hardware and software (driver, firmware, GPU
    serials), merged over the families; `events`: the reader of a `new_events` metric.
    """

    metrics: tuple[Metric, ...] = ()
    node: Callable[[Record], Values] | None = None
    gpu: Callable[[Record, bool], Values] | None = None
    readings: Callable[[Record], Values] | None = None
    load: Callable[[NodeView, Record], dict[int | None, Values]] | None = None
    unmeasured: str = ""
    identity: Callable[[Record], dict[str, Any]] | None = None
    events: Events | None = None


def number(value: Any) -> float | None:
    """A measured number; booleans, negatives and non-numbers are unknown."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return float(value)


def known(found: dict[str, float | None]) -> Values:
    """The values that were read (None: unknown, left out)."""
    return {name: value for name, value in found.items() if value is not None}


def pattern(name: str) -> str:
    """The metric name a stored value is declared under: a port value's pattern
    (`ib.mlx5_0.1.symbol_error` -> `ib.*.symbol_error`), any other value's own name."""
    parts = name.split(".")
    return f"{parts[0]}{PORT}{parts[-1]}" if len(parts) == 4 else name


def moment(text: Any) -> float | None:
    """A time in facts (`2024-11-15T12:02:03.47Z`; naive times are UTC) as epoch seconds, None
    for anything else."""
    if not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()
