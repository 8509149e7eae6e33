"""A suite run's side of the history: the store opened once per process, each host's recent
runs handed to its checks as the `history` facts section, what each host measured, and the
run written to the store at the end (with nodes that passed last run and fail now named).

A host's night is its facts' collection time (`collected_at`; the run's start where the facts
do not say): per host, not one time for the run, because facts gathered by collect.yml across
a fleet, or a folder of saved facts, need not share a night. The section holds only what came
before the night, so old facts judged again (`pytest --facts`) are judged against their own
past, and the store records them as a re-judgement of that night.

A host's history is its machine's (store.resolve_machine: the system or board serial, system
UUID or machine id its facts give, else its name), under whatever name it had; a GPU's is its
serial's (else UUID's), in whatever slot or node it sat: a GPU moved in from another node
brings its counters' past (`elsewhere`).

Workers only read (one query set per host, when its first test starts); the controller writes
the whole run in one transaction when the run ends.
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from gpuhealth import registry
from gpuhealth.checks import NodeView
from gpuhealth.config import Profile
from gpuhealth.families.history import metrics
from gpuhealth.families.history.checks import CHECKS, GPUS
from gpuhealth.families.history.limits import HistoryLimits
from gpuhealth.families.history.schema import HISTORY_SECTION
from gpuhealth.history.store import RunRecord, Store, StoreError, describe, engine_url

DEFAULT_STORE = "reports/history.sqlite"
POLICIES = ("fail", "warn")
START = 0.0  # before any night: a baseline that began with the host's first night


def missing_store(spec: str, base: Path) -> Path | None:
    """The SQLite file `--history` names when it does not exist (else None): a mistyped path
    must not start an empty history in which every regression test skips."""
    url = engine_url(spec, base)
    if not url.startswith("sqlite:"):
        return None
    path = Path(sa.make_url(url).database or "")
    return None if path.exists() else path


def store_usage_error(spec: str | None, base: Path, create: bool, read_only: bool) -> str | None:
    """Why `--history` cannot be used as given (None: it can): a store that does not exist is
    created only when asked (`--history-create`, or the default store), never to read only."""
    if spec is None:
        return None
    if create and read_only:
        return "--history-create and --history-read-only contradict each other"
    path = missing_store(spec, base)
    if path is None:
        return None
    if read_only:
        return f"--history-read-only: no run store at {path}"
    if create or path == (base / DEFAULT_STORE).resolve():
        return None
    return (
        f"--history {spec}: no run store at {path}; a new one would start an empty history "
        "in which every regression test skips. Give --history-create to start one there"
    )


@dataclass
class History:
    """The run store as one process of a suite run uses it (opened on first use)."""

    spec: str | None  # None: history off (--no-history)
    base: Path
    policy: str = "fail"
    read_only: bool = False  # --history-read-only: judge against the store, record nothing
    started_at: float = field(default_factory=time.time)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    error: str | None = None
    _store: Store | None = None

    @property
    def name(self) -> str:
        """The store as messages name it (password hidden)."""
        return describe(engine_url(self.spec, self.base)) if self.spec else "off"

    def store(self) -> Store | None:
        """The open store, or None (history off, or it could not be opened: see `error`)."""
        if self.spec is None or self.error is not None:
            return None
        if self._store is None:
            try:
                self._store = Store(self.spec, self.base)
            except StoreError as exc:
                self.error = str(exc)
                return None
        return self._store

    def night(self, facts: dict[str, Any] | None) -> float:
        """The night a host's facts belong to: their collection time, else the run's start."""
        return metrics.collected_at(facts or {}) or self.started_at

    def nights(self, measured_by_host: dict[str, dict[str, Any]]) -> dict[str, float]:
        """Each measured host's night (what `measured` kept of its facts' collection time)."""
        return {
            host: (found.get("identity") or {}).get("collected_at") or self.started_at
            for host, found in measured_by_host.items()
        }

    def section(
        self, host: str, limits: Profile, facts: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The `history` facts section of a host: its complete nights before these facts',
        newest first (the recent ones and the first ones of each baseline), its pins, and
        what was already reported for this night when it is judged again."""
        if self.spec is None:
            return {"skipped": "run history off (--no-history)"}
        store = self.store()
        if store is None:
            return {"skipped": f"run history unavailable: {self.error}"}
        lim = limits.get(HistoryLimits)
        night = self.night(facts)
        # Enough runs to find the baselines' good runs among failing ones.
        wanted = max(20, 4 * lim.history_baseline_runs, 2 * lim.history_trend_runs)
        node, gpus = metrics.identity(facts or {})
        try:
            machine = store.machine(host, node["ids"], night)
            mine = machine["id"]
            pins = store.pins(host, night, mine)
            starts = baseline_starts(store, mine, night, facts or {}, pins)
            runs = store.host_history(
                host, wanted, night, starts, 4 * (lim.history_reference_runs or 0), mine
            )
            keys = [key for key in map(metrics.gpu_key, gpus) if key is not None]
            elsewhere = store.gpu_elsewhere(keys, mine, night, 4)
            dated = metrics.collected_at(facts or {}) is not None
            again = store.night(host, night, mine) if dated else None
        except StoreError as exc:
            return {"skipped": f"run history unavailable: {exc}"}
        found = {
            "store": store.name,
            "policy": self.policy,
            "now": night,
            "machine": {**machine, "ids": node["ids"]},
            "runs": runs,
            "elsewhere": elsewhere,
            "pins": {
                "node": max((p["at"] for p in pins if p["gpu_key"] is None), default=None),
                "gpus": {p["gpu_key"]: p["at"] for p in pins if p["gpu_key"] is not None},
            },
        }
        if again is not None:
            found["rejudging"] = again
        return found

    def close(self) -> None:
        """Release the store's connections."""
        if self._store is not None:
            self._store.close()


def baseline_starts(
    store: Store, node_id: str, night: float, facts: dict[str, Any], pins: list[dict[str, Any]]
) -> set[float]:
    """When each drift baseline of the machine's current node and GPUs began (the store hands
    over the first nights after each, so a reference formed long ago stays put): after the
    node's driver or firmware last differed from these facts' or it was pinned; for a GPU
    (by serial), also after its VBIOS last differed, it was pinned, or from its first night
    here. The checks apply the same rules to the nights they get (checks._gpu_past)."""
    node, gpus = metrics.identity(facts)
    firmware = json.dumps(node["firmware"], sort_keys=True) if node["firmware"] else None
    seen_nodes, seen_gpus = store.identities(node_id, night)
    node_start = max(
        [
            *(
                row["last"]
                for row in seen_nodes
                if (row["driver"], row["firmware"]) != (node["driver"], firmware)
            ),
            *(pin["at"] for pin in pins if pin["gpu_key"] is None),
        ],
        default=START,
    )
    starts = {node_start}
    for gpu in gpus:
        key = metrics.gpu_key({"serial": gpu["serial"], "uuid": gpu["uuid"]})
        mine = [row for row in seen_gpus if key is not None and key in (row["serial"], row["uuid"])]
        if not mine:
            continue
        vbios = gpu["vbios"]
        starts.add(
            max(
                node_start,
                min(row["first"] for row in mine) - 1.0,  # from its first night here
                *(row["last"] for row in mine if vbios and row["vbios"] and row["vbios"] != vbios),
                *(pin["at"] for pin in pins if pin["gpu_key"] == key),
            )
        )
    return starts


def measured(view: NodeView) -> dict[str, Any]:
    """What a host's facts say that history keeps: its identity and its passive values."""
    node, gpus = metrics.identity(view.facts)
    rows = [
        _row(None, None, name, value) for name, value in metrics.node_values(view.facts).items()
    ]
    for gpu in view.facts.get("gpus") or []:
        if isinstance(gpu, dict) and isinstance(gpu.get("index"), int):
            key = metrics.gpu_key(gpu)
            for name, value in metrics.gpu_values(gpu, view.in_use).items():
                rows.append(_row(gpu["index"], key, name, value))
    identity = {
        **node,
        "profile": view.limits.name,
        "gpus": gpus,
        "collected_at": metrics.collected_at(view.facts),
    }
    machine = (view.facts.get(HISTORY_SECTION) or {}).get("machine")  # as History.section found it
    if isinstance(machine, dict) and isinstance(machine.get("id"), str):
        identity["node_id"] = machine["id"]
    return {"identity": identity, "rows": rows}


def measured_load(view: NodeView, section: str) -> dict[str, Any]:
    """What a load test's section adds, as the family that runs it measures it (single-node
    busbw, per-GPU diagnostic failures)."""
    data = view.facts.get(section)
    measures = registry.family(registry.sections()[section]).metrics
    if not isinstance(data, dict) or measures is None or measures.load is None:
        return {"rows": []}
    rows, gpus = [], registry.scope(GPUS)
    for index, values in measures.load(view, data).items():
        key = None if index is None else metrics.gpu_key(gpus.record(view, index) or {})
        rows += [_row(index, key, name, value) for name, value in values.items()]
    return {"rows": rows}


def _row(gpu: int | None, key: str | None, name: str, value: float) -> dict[str, Any]:
    return {"gpu": gpu, "gpu_key": key, "metric": name, "value": value}


def new_failures(
    last: dict[str, dict[str, Any]],
    nodes: dict[str, Any],
    nights: dict[str, float] | None = None,
) -> dict[str, dict[str, Any]]:
    """The nodes that passed (or warned) in their last run and fail now, each as a regression
    entry naming the checks that fail now and did not then (regression checks aside: they
    are regressions already). `nodes`: host -> NodeVerdict; `nights`: host -> its night,
    where a host whose last night is not older (facts judged again) is no new failure."""
    # A failure of a regression check is a regression already, not a new failure.
    regression_checks = {c.name for c in CHECKS.checks}
    found = {}
    for host, verdict in nodes.items():
        before = last.get(host)
        if verdict.verdict != "FAIL" or before is None or before["verdict"] not in ("PASS", "WARN"):
            continue
        if nights is not None and host in nights and before["at"] >= nights[host]:
            continue
        newly = sorted(
            {
                (entry["check"], entry["gpu"])
                for entry in verdict.failed
                if entry["check"] not in regression_checks
            }
            - before["failed"],
            key=lambda pair: (pair[0], -1 if pair[1] is None else pair[1]),
        )
        if not newly:
            continue
        named = ", ".join(
            f"{check}[gpu{gpu}]" if gpu is not None else check for check, gpu in newly
        )
        at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(before["at"]))
        found[host] = {
            "check": "new_failure",
            "gpu": None,
            "metric": "verdict",
            "baseline": before["verdict"],
            "value": "FAIL",
            "message": f"{host}: new failure: {before['verdict']} in the last run ({at}), "
            f"FAIL now: {named}",
            "action": verdict.actions[0] if verdict.actions else "INSPECT",
        }
    return found


def run_record(
    history: History,
    *,
    complete: bool,
    exit_status: int | None,
    level: str,
    source: str,
    command: str,
    inventory: str | None,
    verdicts: list[Any],
    outcomes: list[Any],
    measured_by_host: dict[str, dict[str, Any]],
) -> RunRecord:
    """The run as the store keeps it, from the verdicts, the outcomes that were not a PASS and
    what each host measured."""
    profiles = sorted(
        {m["identity"]["profile"] for m in measured_by_host.values() if "identity" in m}
    )
    run = RunRecord(
        uid=history.uid,
        started_at=history.started_at,
        finished_at=time.time(),
        complete=complete,
        exit_status=exit_status,
        level=level,
        source=source,
        command=command[:4000],
        inventory=inventory,
        profiles=",".join(profiles),
        controller=socket.gethostname()[:255],
        version=_version(),
    )
    for verdict in verdicts:
        ident = measured_by_host.get(verdict.host, {}).get("identity") or {}
        firmware = ident.get("firmware")
        run.nodes.append(
            {
                "host": verdict.host,
                "verdict": verdict.verdict,
                "profile": ident.get("profile"),
                "driver": ident.get("driver"),
                "firmware": json.dumps(firmware, sort_keys=True) if firmware else None,
                "collected_at": ident.get("collected_at"),
                "ids": json.dumps(ident["ids"], sort_keys=True) if ident.get("ids") else None,
            }
        )
        run.gpus += [{"host": verdict.host, **gpu} for gpu in ident.get("gpus") or []]
        run.regressions += [
            {
                **entry,
                "host": verdict.host,
                "baseline": json.dumps(entry["baseline"]),
                "value": json.dumps(entry["value"]),
            }
            for entry in verdict.regressions
        ]
    run.findings = [
        {
            "host": o.host,
            "gpu": o.gpu,
            "check": o.check,
            "status": o.status,
            "action": o.action,
            "message": f"{o.label}: {o.message}"[:4000],
        }
        for o in outcomes
    ]
    for host, found in measured_by_host.items():
        run.measurements += [{**row, "host": host} for row in found.get("rows") or []]
    return run


def _version() -> str:
    try:
        return metadata.version("gpuhealth")
    except metadata.PackageNotFoundError:
        return "unknown"
