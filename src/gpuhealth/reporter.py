"""The controller's side of a suite run: every test report in, every report out.

One pytest plugin object on the controller (never on xdist workers) reads each test's phases
as they arrive and folds them into one FinishedTest with the test's Record (gpuhealth.sinks;
see gpuhealth.plugin.record): the record goes to the per-node verdicts, and the finished test
to every sink (JUnit, Allure, the Prometheus textfile...). At the end the verdicts go to every
sink, and the fleet summary and the node verdict table come first in the terminal summary,
before pytest's own failure listing.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from gpuhealth import report as reporting
from gpuhealth.results import Status
from gpuhealth.sinks import FinishedTest, Record, RunEnd, RunInfo, Sinks, last_line
from gpuhealth.sinks.entry import finished
from gpuhealth.sinks.entry import record as finding_record
from gpuhealth.targets import slot_params

if TYPE_CHECKING:
    from gpuhealth.plugin import RunState

# Above this many nodes the terminal lists the nodes that need attention, not every PASS.
LIST_ALL_NODES = 50
# Findings a node's verdict only counts (VerdictBook.count).
_COUNTED = frozenset((Status.PASS.value, Status.SKIP.value))


def run_info(state: RunState) -> RunInfo:
    """What the run tells its sinks: its hosts, level, command and report writers."""
    config = state.config
    opt = config.option
    params = getattr(config, "invocation_params", None)
    facts = getattr(opt, "facts", None)
    return RunInfo(
        hosts=sorted(state.targets),
        level=state.level,
        verdicts=state.verdicts,
        options=opt,
        history=state.history,
        command=shlex.join(["pytest", *params.args]) if params else "pytest",
        inventory=getattr(opt, "inventory", None) or facts or getattr(opt, "hosts", None),
        source="facts" if facts else "live",
        started_at=state.history.started_at,
        allure=state.allure,
        junit=state.junit,
        textfile_dir=state.textfile_dir,
    )


@dataclass
class Reporter:
    """Controller-side collector of outcomes; writes verdicts even when the run is cut short.

    A test is taken in whole at its teardown report, the only one that carries the test's
    record; the record is then dropped from the report (pytest's terminal keeps every report
    to the end, and at fleet scale the records would be most of the run's memory).
    """

    state: RunState
    verdicts: list[reporting.NodeVerdict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # outputs that could not be written
    cut_short: bool = False  # tests the run ended before (^C, a lost worker)
    complete: bool = False  # set at the end: see pytest_sessionfinish
    sinks: Sinks = field(init=False)
    _pending: dict[str, FinishedTest] = field(default_factory=dict)
    _slots: dict[str, tuple[str, int | None]] | None = None  # see _placed

    def __post_init__(self) -> None:
        self.sinks = Sinks(run_info(self.state))

    @property
    def book(self) -> reporting.VerdictBook:
        return self.state.book

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = self._pending.get(report.nodeid)
        if test is None:
            started = report.start or time.time()  # xdist's report of a crashed worker has none
            test = self._pending[report.nodeid] = FinishedTest(report.nodeid, int(started * 1000))
        if not test.when and not report.passed:
            test.when, test.skipped = report.when, report.skipped
            if report.skipped:
                test.longrepr = _skip_reason(report)
            else:
                test.longrepr = str(report.longrepr)
                test.trace = report.longreprtext
                crash = getattr(report.longrepr, "reprcrash", None)
                test.crash = getattr(crash, "message", "") or last_line(test.longrepr)
        if report.when in ("setup", "call"):
            return
        # Its teardown, or xdist's report (when "???") of a test whose worker crashed.
        carried = report.__dict__.pop("gpuhealth", None)
        record = Record.of(carried) if carried is not None else self._placed(report.nodeid)
        self._finish(report.nodeid, report.stop or time.time(), record)

    def _placed(self, nodeid: str) -> Record:
        """The host and GPU of a test that reported no record (its worker crashed, the run
        ended before it), from its id's parameter, which the plugin generated: its node's
        verdict must still count it."""
        if self._slots is None:
            self._slots = slot_params(self.state.targets.values())
        param = nodeid.rpartition("[")[2][:-1] if nodeid.endswith("]") else ""
        host, gpu = self._slots.get(param, (None, None))
        return Record(host, gpu)

    def _finish(self, nodeid: str, stop: float, record: Record) -> None:
        """A test is over: its part of the verdicts, then every sink's."""
        test = self._pending.pop(nodeid)
        test.stop_ms, test.record = int(stop * 1000), record
        self._verdict(test)
        if record.host is not None and (
            record.rows is not None or record.identity is not None or record.readings is not None
        ):
            self.sinks.host(record.host, record)
        self.sinks.outcome(test)

    def _verdict(self, test: FinishedTest) -> None:
        record = test.record
        if record.fleet is not None:
            self._fleet(record.fleet)
        host = record.host
        if host is None:
            return
        book = self.book
        book.node(host)
        if record.node_state is not None:
            book.state(host, record.node_state, record.node_state_source or "")
        if record.note is not None:
            book.note(host, record.note)
        for detail in record.details or ():
            detail.reach(host, test.nodeid, book)
        if record.unreachable is not None:
            book.unreachable(host, record.unreachable)
        elif test.when and not test.skipped and record.status is None:
            book.error(host, test.check, record.gpu, record.error or test.last_line())
        elif test.when == "setup" and test.skipped:  # e.g. a load test below its level
            book.count(host, Status.SKIP.value)
        elif record.status in _COUNTED:
            book.count(host, record.status)
        elif record.status is not None:
            book.add(reporting.Outcome.of(record.finding()))

    def _fleet(self, findings: list[dict[str, Any]]) -> None:
        """A test of the whole host set (multi-node NCCL) gives each node its own part."""
        for entry in findings:
            if entry["status"] == "NOTE":
                self.book.note(entry["host"], entry["message"])
                continue
            self.book.add(
                reporting.Outcome(
                    entry["check"],
                    entry["status"],
                    entry["host"],
                    None,
                    entry["message"],
                    entry["host"],
                    entry["action"],
                    entry.get("advice"),
                )
            )

    # ------------------------------------------------------------ the end

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        for nodeid, test in list(self._pending.items()):  # cut short (^C, a lost worker)
            self.cut_short = True
            if not test.when:
                test.when, test.crash = "teardown", "the run ended before the test did"
                test.longrepr = test.crash
            record = self.state.records.pop(nodeid, None) or self._placed(nodeid)
            self._finish(nodeid, time.time(), record)
        failed = self._compare_shared()
        for name, target in self.state.targets.items():
            self.book.node(name).gpu_slots = target.gpu_slots
        self.verdicts = self.book.finish()
        # Complete: every test ran to its end and pytest itself finished (0 or 1); the same
        # for verdicts.json (what `gpuhealth act` trusts), the run store and the textfile.
        self.complete = int(exitstatus) in (0, 1) and not self.cut_short
        # Each output on its own: one that cannot be written stops none of the others.
        self.sinks.close(RunEnd(self.verdicts, self.book.findings(), self.complete, exitstatus))
        self.problems += self.sinks.problems
        if (failed or self.sinks.failed_run) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _compare_shared(self) -> bool:
        """The fleet checks only the controller can judge (a value the nodes of one inventory
        group must share, e.g. their NVLink domain), each host's outcome reported like a test
        of its own, `<family's test file>::test_<check>[<host>]`, in every report; whether
        one failed (the run's exit status must say so: pytest ran no such test)."""
        failed = False
        now = time.time()
        for outcome in reporting.shared_outcomes(self.book.shared):
            where = self.book.shared_files[outcome.check]
            nodeid = f"{where}::test_{outcome.check}[{outcome.host}]"
            record = finding_record(outcome)
            failed = failed or outcome.status == Status.FAIL.value
            self._pending[nodeid] = finished(nodeid, record, int(now * 1000), 0)
            self._finish(nodeid, now, record)
        return failed

    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """An xdist worker's Allure files that could not be written."""
        problem = getattr(node, "workeroutput", {}).get("gpuhealth_allure")
        if problem:
            self.problems.append(f"{node.gateway.id}: {problem}")

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter: Any) -> Generator[None]:
        """The fleet summary and the verdict table, ahead of pytest's failure listing."""
        terminalreporter.section("gpuhealth fleet summary")
        for line in reporting.FleetSummary.of(self.verdicts).lines():
            terminalreporter.write_line(line)
        terminalreporter.section("gpuhealth verdicts")
        shown = self.verdicts
        if len(self.verdicts) > LIST_ALL_NODES and terminalreporter.verbosity < 1:
            shown = [v for v in self.verdicts if v.verdict != "PASS"]
        for line in reporting.table(shown, terminalreporter._tw.fullwidth):
            terminalreporter.write_line(line)
        if len(shown) < len(self.verdicts):
            terminalreporter.write_line(
                f"... and {len(self.verdicts) - len(shown)} PASS nodes (-v lists them)"
            )
        terminalreporter.write_line(f"verdicts written to {self.state.verdicts}")
        if self.state.junit is not None:
            terminalreporter.write_line(f"JUnit XML written to {self.state.junit.path}")
        for problem in self.problems:
            terminalreporter.write_line(f"gpuhealth: {problem}", red=True)
        return (yield)


def _skip_reason(report: pytest.TestReport) -> str:
    """A skip's reason without pytest's `Skipped: ` prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr or "")
    return text.removeprefix("Skipped: ")
