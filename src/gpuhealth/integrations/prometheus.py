"""Prometheus textfile output: `DIR/gpuhealth.prom` for node_exporter's textfile collector.

Written by the suite (`pytest --prometheus-textfile-dir DIR`: every host of the run in one
file, told apart by the `host` label) and by `gpuhealth node-check --prometheus-textfile-dir
DIR` (this node only). The exposition text is rendered by prometheus_client from one custom
collector over the run's verdicts, check statuses and measurements; the file is replaced
atomically so a scrape never reads half of it.

Fail closed: a node that nothing vouches for is never PASS (NOT_CHECKED has its own verdict
series), a check that was skipped or could not run never reads 0 (PASS), and a value that
could not be measured has no series at all (never a 0). Labels are bounded: host, gpu, check,
verdict, and a port's device and port; never a message.

What is exported of each measured value is declared by the family that measures it (its
metrics.py: a Metric's `export`); this module iterates the registry and names no family.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)

from gpuhealth import registry
from gpuhealth.checks import NodeView
from gpuhealth.facts import NODE_STATES
from gpuhealth.local import LocalVerdict
from gpuhealth.metrics import COUNTER, PORT, Export, pattern
from gpuhealth.report import VERDICTS, NodeVerdict

FILE_NAME = "gpuhealth.prom"
PREFIX = "gpuhealth_"
# Every verdict a node can get, one series each (one-hot). NOT_CHECKED is a verdict of its
# own: no check passed or failed, so nothing vouches for the node, and it must not read as PASS.
# gpuhealth_check_status: ordered as report.ORDER ranks verdicts (PASS, WARN, not evaluated,
# FAIL, could not run), so `>= 3` is "failing" and only 0 is a pass.
STATUS_CODES = {"PASS": 0, "WARN": 1, "SKIP": 2, "FAIL": 3, "ERROR": 4}
STATUS_HELP = (
    "Status of one check on one host in the last run (gpu: the GPU index, empty for a node "
    "check): 0 PASS, 1 WARN, 2 SKIP (not evaluated: not applicable, below the run's level, "
    "or no data to judge), 3 FAIL, 4 ERROR (the check could not run: probe failed, host "
    "unreachable). Only 0 is a pass; >= 3 needs action."
)
# (host, gpu index or None, check, status): one check's outcome as the output reads it.
CheckOutcome = tuple[str, int | None, str, str]


def labels(name: str, how: Export) -> tuple[str, ...]:
    """A port's value (a metric named by a pattern `prefix.*.counter`) is labelled with its
    device and port number, a GPU's (exported as gpu_...) with its index, a node's with its
    host only."""
    if PORT in name:
        return ("host", "device", "port")
    if how.name.startswith("gpu_"):
        return ("host", "gpu")
    return ("host",)


def exports() -> dict[str, Export]:
    """Every exported metric the families declare, by metric name (in report order)."""
    return {name: m.export for name, m in registry.metrics().items() if m.export is not None}


def exported(name: str) -> Export | None:
    """How a measured value (`ecc_corrected_aggregate`, `ib.mlx5_0.1.symbol_error`) is
    exposed, None for one that is not (kept for history only, or no family's metric)."""
    try:
        return registry.metric(name).export
    except KeyError:
        return None


@dataclass
class Run:
    """One run as the textfile shows it: when it ended, how long it took, whether it ran to
    its end, every node's verdict, every check's status and what each host measured."""

    mode: str  # suite | node-check
    level: str
    finished_at: float
    duration_s: float
    complete: bool
    verdicts: list[NodeVerdict]
    outcomes: Iterable[CheckOutcome] = ()
    # host -> {"rows": [{"gpu", "metric", "value"}], "identity": {...}} (history.run.measured)
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)


def readings(view: NodeView) -> list[dict[str, Any]]:
    """Each GPU's readings (temperature and power draw as the probe read them, busy or idle) as
    the families declare them, as rows like the run store's (history.run.measured keeps only
    idle ones)."""
    rows = []
    for gpu in view.facts.get("gpus") or []:
        if isinstance(gpu, dict) and isinstance(gpu.get("index"), int):
            for _, measures in registry.measures():
                if measures.readings is None:
                    continue
                for name, value in measures.readings(gpu).items():
                    rows.append({"gpu": gpu["index"], "metric": name, "value": value})
    return rows


def statuses(outcomes: Iterable[CheckOutcome]) -> dict[tuple[str, str, str], int]:
    """(host, gpu label, check) -> status code; a check seen twice for the same host and GPU
    keeps its worst status (one series each, and never the better of two answers). An
    unknown status counts as ERROR."""
    found: dict[tuple[str, str, str], int] = {}
    for host, gpu, check, status in outcomes:
        key = (host, "" if gpu is None else str(gpu), check)
        code = STATUS_CODES.get(status, STATUS_CODES["ERROR"])
        found[key] = max(code, found.get(key, code))
    return found


class RunCollector:
    """A prometheus_client collector over one Run (registered once, collected once)."""

    def __init__(self, run: Run) -> None:
        self.run = run

    def collect(self) -> Iterator[Metric]:
        """The run's metric families: run, verdicts, check statuses, identities, values."""
        yield from self._run_families()
        yield self._verdicts()
        yield self._node_states()
        yield self._statuses()
        yield from self._identities()
        yield from self._measurements()

    def _run_families(self) -> Iterator[Metric]:
        run = self.run
        yield GaugeMetricFamily(
            PREFIX + "last_run_timestamp_seconds",
            "Unix time the last gpuhealth run ended (its verdicts were decided).",
            value=run.finished_at,
        )
        yield GaugeMetricFamily(
            PREFIX + "run_duration_seconds",
            "Wall time of the last gpuhealth run.",
            value=run.duration_s,
        )
        yield GaugeMetricFamily(
            PREFIX + "run_complete",
            "1 when the last run ran every test to its end, 0 when it was cut short "
            "(interrupted, a worker lost, pytest stopped early): its verdicts are partial.",
            value=1.0 if run.complete else 0.0,
        )
        info = InfoMetricFamily(
            PREFIX + "run",
            "The last run: mode (suite or node-check), level and gpuhealth version.",
            labels=["mode", "level", "version"],
        )
        info.add_metric([run.mode, run.level, _version()], {})
        yield info

    def _verdicts(self) -> Metric:
        family = GaugeMetricFamily(
            PREFIX + "node_verdict",
            "The node's verdict in the last run, one-hot: 1 for its verdict, 0 for the others "
            "(PASS, WARN, NOT_CHECKED: nothing vouches for the node, FAIL, UNREACHABLE).",
            labels=["host", "verdict"],
        )
        for node in sorted(self.run.verdicts, key=lambda v: v.host):
            # A verdict outside the known ones (none today) is shown as FAIL: never as PASS.
            _one_hot(
                family, node.host, VERDICTS, node.verdict if node.verdict in VERDICTS else "FAIL"
            )
        return family

    def _node_states(self) -> Metric:
        family = GaugeMetricFamily(
            PREFIX + "node_state",
            "The state the node was judged in, one-hot: idle, or in-use (a job owns the GPUs: "
            "fault rules only).",
            labels=["host", "state"],
        )
        for node in sorted(self.run.verdicts, key=lambda v: v.host):
            if node.node_state in NODE_STATES:
                _one_hot(family, node.host, NODE_STATES, node.node_state)
        return family

    def _statuses(self) -> Metric:
        family = GaugeMetricFamily(
            PREFIX + "check_status", STATUS_HELP, labels=["host", "gpu", "check"]
        )
        for (host, gpu, check), code in sorted(statuses(self.run.outcomes).items(), key=_order):
            family.add_metric([host, gpu, check], float(code))
        return family

    def _identities(self) -> Iterator[Metric]:
        nodes = InfoMetricFamily(
            PREFIX + "node",
            "What the node was judged by and runs: its profile and NVIDIA driver version.",
            labels=["host"],
        )
        gpus = InfoMetricFamily(
            PREFIX + "gpu",
            "Each GPU's identity (to tell a swapped GPU): product name, UUID and serial.",
            labels=["host", "gpu"],
        )
        for host in sorted(self.run.measured):
            ident = self.run.measured[host].get("identity")
            if not isinstance(ident, dict):
                continue
            nodes.add_metric(
                [host],
                {"profile": _text(ident.get("profile")), "driver": _text(ident.get("driver"))},
            )
            seen = set()
            for gpu in ident.get("gpus") or []:
                if gpu["idx"] in seen:
                    continue
                seen.add(gpu["idx"])
                labels = {k: _text(gpu.get(k)) for k in ("name", "uuid", "serial")}
                gpus.add_metric([host, str(gpu["idx"])], labels)
        yield nodes
        yield gpus

    def _measurements(self) -> Iterator[Metric]:
        # family name -> label values -> value; a series reported twice (a broken document
        # with a GPU index twice) keeps its highest value: never hide an error count.
        values: dict[str, dict[tuple[str, ...], float]] = {}
        for host, kept in self.run.measured.items():
            for row in kept.get("rows") or []:
                how = exported(row["metric"])
                key = None if how is None else _labels(how, host, row)
                if how is None or key is None:
                    continue
                series = values.setdefault(how.name, {})
                series[key] = max(float(row["value"]), series.get(key, float("-inf")))
        for name, how in exports().items():
            samples = values.get(how.name) or {}
            if not samples:
                continue
            kind = CounterMetricFamily if how.kind == COUNTER else GaugeMetricFamily
            family = kind(PREFIX + how.name, how.help, labels=labels(name, how))
            for key in sorted(samples):
                family.add_metric(list(key), samples[key])
            yield family


def _one_hot(family: GaugeMetricFamily, host: str, names: Iterable[str], chosen: str) -> None:
    """One series per name for `host`: 1 for the chosen one, 0 for the others."""
    for name in names:
        family.add_metric([host, name], 1.0 if name == chosen else 0.0)


def _labels(how: Export, host: str, row: dict[str, Any]) -> tuple[str, ...] | None:
    """A measured row's label values as `how` names them (a port row's device and port from
    its name, `<prefix>.<device>.<port>.<counter>`); None for a GPU's value without a GPU."""
    names = labels(pattern(row["metric"]), how)
    if names[-1] == "port":
        _, device, port, _ = row["metric"].split(".")
        return (host, device, port)
    if names[-1] == "gpu":
        return None if row.get("gpu") is None else (host, str(row["gpu"]))
    return (host,)


def _order(item: tuple[tuple[str, str, str], int]) -> tuple[str, int, str]:
    """Check statuses by host, then node checks before GPU 0, 1, ... 10, then check."""
    (host, gpu, check), _ = item
    return (host, int(gpu) if gpu else -1, check)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _version() -> str:
    try:
        return metadata.version("gpuhealth")
    except metadata.PackageNotFoundError:
        return "unknown"


def render(run: Run) -> bytes:
    """The run in Prometheus text exposition format (HELP and TYPE lines, final newline)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(run))
    return generate_latest(registry)


def write(directory: Path, run: Run) -> Path:
    """Replace DIR/gpuhealth.prom with the run (OSError when it cannot be written).

    A temp file in the same directory, flushed to disk, made readable by node_exporter
    whatever the caller's umask (it often runs as another user than root's cron or slurmd),
    then renamed over the old file: a scrape sees the old file or the new one, never part of
    one. The temp file's name does not end in .prom, so the collector never reads it.
    """
    directory = Path(directory)
    if not directory.is_dir():
        if directory.exists():
            raise NotADirectoryError(f"not a directory: {directory}")
        raise FileNotFoundError(f"no such directory: {directory}")
    text = render(run)
    fd, temp = tempfile.mkstemp(prefix=f".{FILE_NAME}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), 0o644)
            os.fsync(handle.fileno())
        path = directory / FILE_NAME
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def write_node_check(directory: Path, result: LocalVerdict) -> int:
    """This node's textfile from a judgement made in process (gpuhealth.local.judge_here), as
    `node-check --prometheus-textfile-dir DIR` writes it: node-check's sinks, this one alone;
    0, or 1 after an error on stderr (stdout stays the verdict's: node-problem-detector reads
    it)."""
    from gpuhealth.integrations import nodecheck
    from gpuhealth.sinks.prometheus import PrometheusSink

    options = argparse.Namespace(prometheus_textfile_dir=Path(directory))
    return 1 if nodecheck.deliver(result, options, (PrometheusSink,)).problems else 0
