"""The controller's side of a suite run: every test report in, every report file out.

One pytest plugin object on the controller (never on xdist workers) reads each test's phases
as they arrive: what the test recorded (`report.gpuhealth`, see gpuhealth.plugin.record) goes
to the per-node verdicts, and each finished test becomes one Allure result. At the end it writes
verdicts.json and the Allure categories, and puts the fleet summary and the node verdict
table first in the terminal summary, before pytest's own failure listing.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from gpuhealth import registry
from gpuhealth import report as reporting
from gpuhealth.allure_results import BROKEN, FAILED, PASSED, SKIPPED, Case
from gpuhealth.checks import Finding
from gpuhealth.history.run import new_failures, run_record
from gpuhealth.history.show import trends_png
from gpuhealth.history.store import StoreError
from gpuhealth.results import Action, Result, Shared, Status
from gpuhealth.targets import slot_params

if TYPE_CHECKING:
    from gpuhealth.plugin import RunState

# Above this many nodes the terminal lists the nodes that need attention, not every PASS.
LIST_ALL_NODES = 50
TREND_DAYS = 30  # the span of the history plot the Allure report carries


@dataclass
class _Pending:
    """A test between its setup and its teardown report: when it started and how the first
    phase that did not pass ended."""

    start_ms: int
    when: str = ""  # the phase that did not pass ("" while all did)
    skipped: bool = False
    longrepr: str = ""
    crash: str = ""  # pytest's one-line summary of the failure (`Failed: ...`, `KeyError: ...`)
    trace: str = ""


@dataclass
class Reporter:
    """Controller-side collector of outcomes; writes verdicts even when the run is cut short.

    A test is taken in whole at its teardown report, the only one that carries the test's
    record; the record is then dropped from the report (pytest's terminal keeps every report
    to the end, and at fleet scale the records would be most of the run's memory).
    """

    state: RunState
    verdicts: list[reporting.NodeVerdict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # report files that could not be written
    measured: dict[str, dict[str, Any]] = field(default_factory=dict)  # host -> for the store
    # For the Prometheus textfile (only with --prometheus-textfile-dir): each GPU's readings
    # by host, and every test's (host, gpu, check, status).
    readings: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    checked: list[tuple[str, int | None, str, str]] = field(default_factory=list)
    shared: list[tuple[str, Shared]] = field(default_factory=list)  # see results.Shared
    shared_files: dict[str, str] = field(default_factory=dict)  # fleet check -> its test file
    cut_short: bool = False  # tests the run ended before (^C, a lost worker)
    complete: bool = False  # set at the end: see pytest_sessionfinish
    _pending: dict[str, _Pending] = field(default_factory=dict)
    _slots: dict[str, tuple[str, int | None]] | None = None  # see _placed

    @property
    def book(self) -> reporting.VerdictBook:
        return self.state.book

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        pending = self._pending.get(report.nodeid)
        if pending is None:
            started = report.start or time.time()  # xdist's report of a crashed worker has none
            pending = self._pending[report.nodeid] = _Pending(int(started * 1000))
        if not pending.when and not report.passed:
            pending.when, pending.skipped = report.when, report.skipped
            if report.skipped:
                pending.longrepr = _skip_reason(report)
            else:
                pending.longrepr = str(report.longrepr)
                pending.trace = report.longreprtext
                crash = getattr(report.longrepr, "reprcrash", None)
                pending.crash = getattr(crash, "message", "") or _last_line(pending.longrepr)
        if report.when in ("setup", "call"):
            return
        # Its teardown, or xdist's report (when "???") of a test whose worker crashed.
        props = report.__dict__.pop("gpuhealth", None) or self._placed(report.nodeid)
        self._finish(report.nodeid, report.stop or time.time(), props)

    def _placed(self, nodeid: str) -> dict[str, Any]:
        """The host and GPU of a test that reported no record (its worker crashed, the run
        ended before it), from its id's parameter, which the plugin generated: its node's
        verdict must still count it."""
        if self._slots is None:
            self._slots = slot_params(self.state.targets.values())
        param = nodeid.rpartition("[")[2][:-1] if nodeid.endswith("]") else ""
        host, gpu = self._slots.get(param, (None, None))
        return {} if host is None else {"host": host, "gpu": gpu}

    def _finish(self, nodeid: str, stop: float, props: dict[str, Any]) -> None:
        """A test is over: its verdict, Allure result and JUnit test case."""
        pending = self._pending.pop(nodeid)
        self._verdict(nodeid, props, pending)
        if self.state.allure is not None:
            self.state.allure.write(_case(nodeid, int(stop * 1000), props, pending))
        if self.state.junit is not None:
            seconds = max(0.0, stop - pending.start_ms / 1000)
            self.state.junit.case(nodeid, seconds, *_junit(pending))

    def _verdict(self, nodeid: str, props: dict[str, Any], pending: _Pending) -> None:
        if "fleet" in props:
            self._fleet(props["fleet"])
        host = props.get("host")
        if host is None:
            return
        self.book.node(host)
        if "node_state" in props:
            self.book.state(host, props["node_state"], props.get("node_state_source") or "")
        if "note" in props:
            self.book.note(host, props["note"])
        for note in props.get("notes") or []:
            self.book.note(host, note)
        for entry in props.get("regressions") or []:
            self.book.regression(host, entry)
        if "history" in props:
            kept = self.measured.setdefault(host, {"rows": []})
            kept["rows"] += props["history"].get("rows") or []
            if "identity" in props["history"]:
                kept["identity"] = props["history"]["identity"]
        if "readings" in props:
            self.readings.setdefault(host, []).extend(props["readings"])
        if "shared" in props:
            shared = Shared(**props["shared"])
            self.shared.append((host, shared))
            self.shared_files[shared.check] = nodeid.partition("::")[0]
        check = props.get("check") or _check_of(nodeid)
        gpu = props.get("gpu")
        if self.state.textfile_dir is not None:
            status = _check_status(props, pending)
            if status is not None:
                self.checked.append((host, gpu, check, status))
        if "unreachable" in props:
            self.book.unreachable(host, props["unreachable"])
        elif pending.when and not pending.skipped and "status" not in props:
            self.book.error(host, check, gpu, props.get("error") or _last_line(pending.longrepr))
        elif pending.when == "setup" and pending.skipped:  # e.g. a load test below its level
            self.book.add(reporting.Outcome(check, "SKIP", host, gpu, pending.longrepr, host))
        elif "status" in props:
            self.book.add(reporting.Outcome.of(_finding(props)))

    def _fleet(self, findings: list[dict[str, Any]]) -> None:
        """A test of the whole host set (multi-node NCCL) gives each node its own part."""
        for entry in findings:
            if entry["status"] == "NOTE":
                self.book.note(entry["host"], entry["message"])
                continue
            if self.state.textfile_dir is not None:
                self.checked.append((entry["host"], None, entry["check"], entry["status"]))
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
        for nodeid, pending in list(self._pending.items()):  # cut short (^C, a lost worker)
            self.cut_short = True
            if not pending.when:
                pending.when, pending.crash = "teardown", "the run ended before the test did"
                pending.longrepr = pending.crash
            props = self.state.records.pop(nodeid, None) or self._placed(nodeid)
            self._finish(nodeid, time.time(), props)
        failed = self._compare_shared()
        if failed and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        for name, target in self.state.targets.items():
            self.book.node(name).gpu_slots = target.gpu_slots
        self.verdicts = self.book.finish()
        # Complete: every test ran to its end and pytest itself finished (0 or 1); the same
        # for verdicts.json (what `gpuhealth act` trusts), the run store and the textfile.
        self.complete = int(exitstatus) in (0, 1) and not self.cut_short
        # Each report on its own: one that cannot be written stops none of the others.
        kept = self._keep_history(session, int(exitstatus))
        history = self.state.history
        try:
            reporting.write_json(
                self.verdicts,
                self.state.verdicts,
                {
                    "hosts": sorted(self.state.targets),
                    "source": "pytest",
                    "complete": self.complete,
                    "history": {"store": history.name, "run": history.uid if kept else None},
                },
            )
        except OSError as exc:
            self.problems.append(f"verdicts not written to {self.state.verdicts}: {exc}")
        if self.state.textfile_dir is not None:
            self._write_textfile(self.state.textfile_dir, int(exitstatus))
        if self.state.junit is not None:
            try:
                self.state.junit.close()
            except OSError as exc:
                self.problems.append(f"JUnit XML not written: {exc}")
        if self.state.allure is not None:
            summary = reporting.FleetSummary.of(self.verdicts)
            self.state.allure.finish(
                [*summary.metadata(), ("level", self.state.level)],
                reporting.overview_html(self.verdicts, "gpuhealth fleet overview"),
                self._trends() if kept else None,
            )
            problem = self.state.allure.close()
            if problem:
                self.problems.append(problem)

    def _compare_shared(self) -> bool:
        """The fleet checks only the controller can judge (a value the nodes of one inventory
        group must share, e.g. their NVLink domain), each host's outcome reported like a test
        of its own, `<family's test file>::test_<check>[<host>]`, in every report; whether
        one failed (the run's exit status must say so: pytest ran no such test)."""
        failed = False
        now = time.time()
        for outcome in reporting.shared_outcomes(self.shared):
            nodeid = f"{self.shared_files[outcome.check]}::test_{outcome.check}[{outcome.host}]"
            text = f"{outcome.label}: {outcome.message}"
            pending = _Pending(int(now * 1000))
            if outcome.status == Status.SKIP.value:
                pending.when, pending.skipped, pending.longrepr = "setup", True, text
            elif outcome.status == Status.FAIL.value:
                failed = True
                pending.when, pending.longrepr, pending.crash = "call", text, text
            props = {
                "host": outcome.host,
                "check": outcome.check,
                "status": outcome.status,
                "message": outcome.message,
                "label": outcome.label,
                "action": outcome.action,
                "advice": outcome.advice,
            }
            self._pending[nodeid] = pending
            self._finish(nodeid, now, props)
        return failed

    def _write_textfile(self, directory: Path, exitstatus: int) -> None:
        """DIR/gpuhealth.prom for node_exporter: every host's verdict, check statuses and
        measurements (gpuhealth.integrations.prometheus); a failure is reported, not raised."""
        from gpuhealth.integrations import prometheus  # prometheus_client only when asked

        measured = {}
        for host in {*self.measured, *self.readings}:
            found = self.measured.get(host, {})
            rows = [*(found.get("rows") or []), *self.readings.get(host, [])]
            measured[host] = {**found, "rows": rows}
        now = time.time()
        run = prometheus.Run(
            mode="suite",
            level=self.state.level,
            finished_at=now,
            duration_s=max(0.0, now - self.state.history.started_at),
            complete=self.complete,
            verdicts=self.verdicts,
            outcomes=self.checked,
            measured=measured,
        )
        try:
            prometheus.write(directory, run)
        except (OSError, ValueError) as exc:
            self.problems.append(
                f"Prometheus textfile not written to {directory / prometheus.FILE_NAME}: {exc}"
            )

    def _trends(self) -> bytes | None:
        """The store's trend plot for the Allure report, or None (and why, in problems)."""
        store = self.state.history.store()
        try:
            return trends_png(store, time.time() - TREND_DAYS * 86400) if store else None
        except StoreError as exc:
            self.problems.append(f"no trend plot in the Allure report: {exc}")
            return None

    def _keep_history(self, session: pytest.Session, exitstatus: int) -> bool:
        """Name the nodes that passed last run and fail now, then append the run to the
        store; whether it was kept. A store that cannot be used turns a green run red: a
        nightly job must not pass without its regression checks."""
        history = self.state.history
        if history.spec is None or history.read_only or session.config.option.collectonly:
            return False
        store = history.store()
        try:
            if store is None:
                raise StoreError(str(history.error))
            by_host = {v.host: v for v in self.verdicts}
            nights = history.nights(self.measured)
            for host, entry in new_failures(store.last_states(by_host), by_host, nights).items():
                by_host[host].regressions.append(entry)
            opt = session.config.option
            store.write_run(
                run_record(
                    history,
                    complete=self.complete,
                    exit_status=exitstatus,
                    level=self.state.level,
                    source="facts" if opt.facts else "live",
                    command=shlex.join(["pytest", *session.config.invocation_params.args]),
                    inventory=opt.inventory or opt.facts or opt.hosts,
                    verdicts=self.verdicts,
                    outcomes=self.book.findings(),
                    measured_by_host=self.measured,
                )
            )
        except (StoreError, OverflowError, ValueError, TypeError) as exc:
            # A value the database driver refuses (an integer beyond its 64 bits) costs the
            # run store this run, never the other reports.
            self.problems.append(f"run history not kept: {exc}")
            if session.exitstatus == 0:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return False
        return True

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


def _check_of(nodeid: str) -> str:
    """`tests/test_gpu.py::test_ecc_errors[n1-gpu3]` -> `ecc_errors`."""
    return nodeid.rpartition("::")[2].partition("[")[0].removeprefix("test_")


def _check_status(props: dict[str, Any], pending: _Pending) -> str | None:
    """A test's check status for the textfile: its finding's, else SKIP for a test skipped
    before it judged (below its level, no live host), ERROR for one that could not run (its
    host unreachable, a broken document, a bug); None for a test that judged nothing."""
    if "unreachable" in props:
        return "ERROR"
    if "status" in props:
        return str(props["status"])
    if pending.skipped:
        return "SKIP"
    return "ERROR" if pending.when else None


def _finding(props: dict[str, Any]) -> Finding:
    """The finding a check recorded, rebuilt from the test's properties."""
    result = Result(
        Status(props["status"]),
        props.get("message", ""),
        Action(props.get("action") or "NONE"),
        props.get("advice") or None,
    )
    host = props["host"]
    return Finding(
        props["check"],
        host,
        props.get("gpu"),
        props.get("label", host),
        result,
    )


def _case(nodeid: str, stop_ms: int, props: dict[str, Any], pending: _Pending) -> Case:
    """The Allure result of a finished test: suites host > family > GPU, and the labels a
    fleet is filtered by (check, severity, profile, GPU serial and UUID)."""
    name = nodeid.rpartition("::")[2]
    check = _check_of(nodeid)
    chk = registry.checks().get(check)
    host, gpu = props.get("host"), props.get("gpu")
    family = nodeid.partition("::")[0].rpartition("/")[2]
    labels = [
        ("parentSuite", host or "fleet"),
        ("suite", chk.group if chk else family.removeprefix("test_").removesuffix(".py")),
        ("check", check),
        ("severity", chk.severity if chk else "normal"),
    ]
    params = []
    if host is not None:
        labels.append(("host", host))
        params.append(("gpuhealth_host", host))
    if gpu is not None:
        labels += [("subSuite", f"gpu{gpu}"), ("gpu", str(gpu))]
        params.append(("gpu", str(gpu)))
    for key in ("profile", "node_state", "uuid", "serial"):
        if props.get(key):
            labels.append((key, props[key]))
    if props.get("status") in (Status.FAIL.value, Status.WARN.value):
        labels.append(("action", props.get("action") or Action.NONE.value))
    if props.get("status") == Status.WARN.value:
        labels.append(("tag", "WARN"))
    attachments = props.get("attachments") or []
    status, message, trace = _allure_status(props, pending)
    return Case(
        nodeid=nodeid,
        name=name,
        status=status,
        message=message,
        trace=trace,
        start_ms=pending.start_ms,
        stop_ms=stop_ms,
        labels=labels,
        parameters=params,
        description=chk.summary if chk else "",
        attachments=attachments,
    )


def _junit(pending: _Pending) -> tuple[str | None, str, str]:
    """The JUnit element (failure, error, skipped or none), message and text of a test, as
    pytest's junitxml writes them."""
    if not pending.when:
        return None, "", ""
    if pending.skipped:
        return "skipped", pending.longrepr, pending.longrepr
    if pending.when == "call":
        return "failure", pending.crash, pending.trace
    return "error", f'failed on {pending.when} with "{pending.crash}"', pending.trace


def _allure_status(props: dict[str, Any], pending: _Pending) -> tuple[str, str, str]:
    """Allure's status, message and trace for a finished test: the check's FAIL is `failed`,
    a test that could not run (host unreachable, broken facts, a bug) is `broken`."""
    if not pending.when:
        warned = props.get("status") == Status.WARN.value
        return PASSED, _finding(props).text if warned else "", ""
    if pending.skipped:
        return SKIPPED, pending.longrepr, ""
    if props.get("status") == Status.FAIL.value:
        return FAILED, pending.longrepr, ""
    if "unreachable" in props:
        return BROKEN, f"host unreachable: {props['unreachable']}", ""
    if "error" in props:
        return BROKEN, str(props["error"]), ""
    return BROKEN, _last_line(pending.longrepr), pending.trace


def _skip_reason(report: pytest.TestReport) -> str:
    """A skip's reason without pytest's `Skipped: ` prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr or "")
    return text.removeprefix("Skipped: ")


def _last_line(longrepr: str) -> str:
    text = longrepr.strip().splitlines()
    return text[-1][:500] if text else "test error"
