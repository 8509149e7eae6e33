"""The suite's outputs as sinks: what each test recorded in, the run's reports out.

A test records what it found in one typed `Record` (host, GPU, the finding, attachments, what
the host measured). On an xdist worker it travels to the controller on the test's teardown
report, serialised once (`Record.wire`); the controller's Reporter folds each test's phases
into a `FinishedTest`, feeds it to the verdicts and to every sink, and at the end hands every
sink the run's verdicts (`RunEnd`).

A sink is a `Sink`: `open` (does this run want it?), `host` (what a host measured),
`outcome` (one finished test), `close` (the verdicts). A sink that raises is reported, by its
name, and dropped; the others go on (`Sinks`). `NAMES` lists the sinks, one module each in
this package, in the order they close: history first, as it adds what the run store knows to
the verdicts (a node that passed last run and fails now) and says whether the run was kept.
`ENTRY_POINTS` lists what the commands that judge without pytest open (triage, node-check:
they feed their findings as records too, gpuhealth.sinks.entry).
"""

from __future__ import annotations

import importlib
import operator
import time
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuhealth.checks import Finding
from gpuhealth.results import Action, Detail, Result, Status

if TYPE_CHECKING:
    from gpuhealth.allure_results import AllureResults
    from gpuhealth.history.run import History
    from gpuhealth.junit_results import JUnitResults
    from gpuhealth.report import NodeVerdict, Outcome

# The sinks, one module of this package each (with its SINK class), in the order they close.
NAMES = (
    "history",
    "verdicts",
    "junit",
    "allure",
    "prometheus",
)
# The commands that judge without pytest open their own outputs, and those of NAMES they
# offer too, in the order they close; the suite opens NAMES only.
ENTRY_POINTS = {
    "triage": ("triage",),
    "node-check": ("node_check", "prometheus", "slurm"),
}


@dataclass(slots=True)
class Record:
    """What one test tells the controller: where it ran, what its check found, what it
    attached, and (on a host's first test) what the host measured. Every field but `host` and
    `gpu` is optional: a test that never judged (its host unreachable, skipped below its level)
    records only why."""

    host: str | None = None
    gpu: int | None = None
    check: str | None = None  # the check's name (else the test's: see FinishedTest.check)
    status: str | None = None  # the finding's status (PASS, WARN, FAIL, SKIP); None: no finding
    message: str = ""
    label: str | None = None  # names host and GPU (`n1 gpu3 (serial ...)`)
    action: str | None = None
    advice: str | None = None
    profile: str | None = None
    node_state: str | None = None
    node_state_source: str | None = None
    uuid: str | None = None
    serial: str | None = None
    unreachable: str | None = None  # the host could not be probed: why
    error: str | None = None  # the host's facts could not be read or judged: why
    note: str | None = None  # context for the node's verdict (no GPU expected, a mixed node)
    details: list[Detail] | None = None  # what the check's family adds (results.Detail)
    fleet: list[dict[str, Any]] | None = None  # a fleet test's finding for each host
    attachments: list[dict[str, str]] | None = None  # Allure attachment references
    identity: dict[str, Any] | None = None  # the host's identity, for history and exporters
    rows: list[dict[str, Any]] | None = None  # what the host measured (history.run.measured)
    readings: list[dict[str, Any]] | None = None  # busy or idle readings, for exporters
    # Saved evidence (triage): on a host's record what its facts were read from, on a
    # finding's the part of a ticket its evidence came from; and what to know of it.
    evidence: str | None = None
    remarks: list[str] | None = None

    def wire(self) -> tuple[Any, ...]:
        """The record as xdist carries it: plain values in field order, without the unset
        fields at the end (most of them, on most tests)."""
        values = list(_VALUES(self))
        if self.details is not None:
            values[_DETAILS] = [detail.wire() for detail in self.details]
        while values and values[-1] is None:
            values.pop()
        return tuple(values)

    @classmethod
    def of(cls, carried: Record | tuple[Any, ...]) -> Record:
        """The record a teardown report carries: itself in one process, `wire()` from a
        worker."""
        if isinstance(carried, Record):
            return carried
        found = cls(*carried)
        wired: list[Any] | None = found.details  # as each detail's wire() gave it
        if wired is not None:
            found.details = [Detail.unwire(each) for each in wired]
        return found

    def keep(self, measured: dict[str, Any]) -> None:
        """Add what the host measured (history.run.measured*): rows, and its identity when
        the host's facts were read."""
        self.rows = [*(self.rows or []), *measured["rows"]]
        if "identity" in measured:
            self.identity = measured["identity"]

    def attach(self, refs: list[dict[str, str]]) -> None:
        """List Allure attachments (already written) on this test's result."""
        if self.attachments is None:
            self.attachments = []
        self.attachments.extend(refs)

    def finding(self) -> Finding:
        """The finding the check recorded (status set)."""
        host = str(self.host)
        result = Result(
            Status(self.status),
            self.message,
            Action(self.action or "NONE"),
            self.advice or None,
        )
        return Finding(str(self.check), host, self.gpu, self.label or host, result)


_FIELDS = tuple(f.name for f in fields(Record))
_VALUES = operator.attrgetter(*_FIELDS)
_DETAILS = _FIELDS.index("details")


@dataclass(slots=True)
class FinishedTest:
    """One test from its setup to its teardown: its record, when it ran, and how the first
    phase that did not pass ended (`when` "" while all passed)."""

    nodeid: str
    start_ms: int
    stop_ms: int = 0
    record: Record = field(default_factory=Record)
    when: str = ""
    skipped: bool = False
    longrepr: str = ""
    crash: str = ""  # pytest's one-line summary of the failure (`Failed: ...`, `KeyError: ...`)
    trace: str = ""

    @property
    def check(self) -> str:
        """The check it judged; else the name of its test (`test_ecc_errors[n1-gpu3]` is
        `ecc_errors`)."""
        return self.record.check or check_of(self.nodeid)

    def status(self) -> str | None:
        """Its check status as exporters count it: the finding's, else SKIP for a test
        skipped before it judged (below its level, no live host), ERROR for one that could
        not run (its host unreachable, a broken document, a bug); None when it judged nothing
        (a fleet test: see statuses)."""
        record = self.record
        if record.unreachable is not None:
            return "ERROR"
        if record.status is not None:
            return record.status
        if self.skipped:
            return "SKIP"
        return "ERROR" if self.when else None

    def statuses(self) -> list[tuple[str, int | None, str, str]]:
        """(host, gpu, check, status) of every check outcome the test stands for: its own,
        and each host's part of a fleet test."""
        found = []
        host, status = self.record.host, self.status()
        if host is not None and status is not None:
            found.append((host, self.record.gpu, self.check, status))
        for entry in self.record.fleet or ():
            if entry["status"] != "NOTE":
                found.append((entry["host"], None, entry["check"], entry["status"]))
        return found

    def last_line(self) -> str:
        """The last line of its failure (what a message column shows)."""
        return last_line(self.longrepr)


def name_of(nodeid: str) -> str:
    """`tests/test_gpu.py::test_ecc_errors[n1-gpu3]` -> `test_ecc_errors[n1-gpu3]`, also for
    a host whose name holds `::` (an IPv6 address: `[fe80::1-gpu3]`)."""
    where, bracket, params = nodeid.partition("[")
    return where.rpartition("::")[2] + bracket + params


def check_of(nodeid: str) -> str:
    """`tests/test_gpu.py::test_ecc_errors[n1-gpu3]` -> `ecc_errors`."""
    return nodeid.partition("[")[0].rpartition("::")[2].removeprefix("test_")


def last_line(longrepr: str) -> str:
    """The last line of a failure's text, at most 500 characters."""
    text = longrepr.strip().splitlines()
    return text[-1][:500] if text else "test error"


@dataclass
class RunInfo:
    """What a run tells its sinks when it opens: its hosts and level, how it was started, and
    the report writers the plugin set up (None: not asked for)."""

    hosts: list[str]
    level: str
    verdicts: Path | None  # None: an entry point that writes no verdicts.json
    options: Any  # pytest's option namespace (a command's arguments): a sink reads its own
    history: History | None  # the run store's side of the run (None, spec None: not kept)
    command: str = ""
    inventory: str | None = None
    source: str = "live"  # live | facts
    started_at: float = field(default_factory=time.time)
    allure: AllureResults | None = None
    junit: JUnitResults | None = None
    textfile_dir: Path | None = None
    entry: str = "suite"  # which entry point runs (ENTRY_POINTS): suite, triage, node-check

    def option(self, name: str) -> Any:
        """An option's value (`--verdicts-csv` or its dest `verdicts_csv`; None if absent)."""
        return getattr(self.options, name.lstrip("-").replace("-", "_"), None)


@dataclass
class RunEnd:
    """The run's end as every sink sees it: the verdicts, most severe first (a sink that
    closes early may add to them: history's regressions), and what was found."""

    verdicts: list[NodeVerdict]
    findings: list[Outcome]  # every outcome that was not a PASS or SKIP
    complete: bool  # every test ran to its end and pytest itself finished (0 or 1)
    exit_status: int
    history_run: str | None = None  # the run store's id of this run, once it was kept
    finished_at: float = field(default_factory=time.time)
    duration_s: float | None = None  # as the entry point timed it (node-check: its probe)

    def duration(self, started_at: float) -> float:
        """How long the run took: as its entry point timed it, else since `started_at`."""
        if self.duration_s is not None:
            return self.duration_s
        return max(0.0, self.finished_at - started_at)


class Sink:
    """One output of a run: a subclass sets `name`, implements `open` and `close`, and
    `host` and `outcome` where it uses them. Any method may raise: the sink is then reported
    and dropped. A sink with `option` gets that pytest option (`--verdicts-csv PATH`), read
    with RunInfo.option."""

    name = ""  # what a problem is reported as
    fails_run = False  # whether its failure turns a green run red (one a tool or CI reads)
    option: str | None = None  # its own pytest option, if it has one
    option_help = ""
    option_metavar = "PATH"

    def open(self, run: RunInfo) -> bool:
        """Start the output; False when the run did not ask for it (it then gets nothing)."""
        raise NotImplementedError

    def host(self, host: str, record: Record) -> None:
        """What a host measured (`identity`, `rows`, `readings`), from its first test."""

    def outcome(self, test: FinishedTest) -> None:
        """One finished test, with its record."""

    def close(self, end: RunEnd) -> None:
        """The run is over: write what is left."""
        raise NotImplementedError


class SinkError(Exception):
    """A sink could not write its output: the message says which and why."""


@cache
def registered(entry: str = "suite") -> tuple[type[Sink], ...]:
    """The SINK class of every module an entry point opens (the suite's: NAMES), in order."""
    names = NAMES if entry == "suite" else ENTRY_POINTS[entry]
    return tuple(importlib.import_module(f"{__name__}.{name}").SINK for name in names)


class Sinks:
    """The run's open sinks, each fed on its own: one that raises is named in `problems` and
    fed no more; `failed_run` is set when that sink's failure must fail the run.
    `reader_left`: a sink found standard output closed (`gpuhealth triage ... | head`),
    which is the reader's doing, not a problem of that output."""

    def __init__(self, run: RunInfo, kinds: tuple[type[Sink], ...] | None = None) -> None:
        self.problems: list[str] = []
        self.failed_run = False
        self.reader_left = False
        self.open: list[Sink] = []
        for kind in registered(run.entry) if kinds is None else kinds:
            sink = kind()
            try:
                if sink.open(run):
                    self.open.append(sink)
            except Exception as exc:  # one output's failure stops no other
                self._failed(sink, exc)
        self._listening()

    def _listening(self) -> None:
        """Which open sinks take hosts and outcomes (the others are not called per test)."""
        self._hosts = [s for s in self.open if type(s).host is not Sink.host]
        self._outcomes = [s for s in self.open if type(s).outcome is not Sink.outcome]

    @property
    def hosts_wanted(self) -> bool:
        """Whether an open sink takes what hosts measured (else it need not be gathered)."""
        return bool(self._hosts)

    def host(self, host: str, record: Record) -> None:
        """Every sink: what `host` measured."""
        for sink in self._hosts:
            try:
                sink.host(host, record)
            except Exception as exc:
                self._failed(sink, exc)

    def outcome(self, test: FinishedTest) -> None:
        """Every sink: one finished test."""
        for sink in self._outcomes:
            try:
                sink.outcome(test)
            except Exception as exc:
                self._failed(sink, exc)

    def close(self, end: RunEnd) -> None:
        """Every sink, in order: the run is over."""
        for sink in self.open:
            try:
                sink.close(end)
            except Exception as exc:
                self._failed(sink, exc)
        self.open = []
        self._listening()

    def _failed(self, sink: Sink, exc: Exception) -> None:
        if isinstance(exc, BrokenPipeError):
            self.reader_left = True
        elif isinstance(exc, SinkError):
            self.problems.append(str(exc))
        else:
            self.problems.append(f"{sink.name} not written: {type(exc).__name__}: {exc}")
        self.failed_run = self.failed_run or sink.fails_run
        # New lists: a loop over the old ones goes on undisturbed.
        self.open = [other for other in self.open if other is not sink]
        self._listening()
