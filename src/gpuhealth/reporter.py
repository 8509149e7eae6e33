"""The controller's side of a suite run: every test report in, every report file out.

One pytest plugin object on the controller (never on xdist workers) reads each test's phases
as they arrive: what the test recorded (`report.gpuhealth`, see gpuhealth.plugin.record) goes
to the per-node verdicts, and each finished test becomes one Allure result. At the end it writes
verdicts.json and the Allure categories, and puts the fleet summary and the node verdict
table first in the terminal summary, before pytest's own failure listing.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from gpuhealth import registry
from gpuhealth import report as reporting
from gpuhealth.allure_results import BROKEN, FAILED, PASSED, SKIPPED, Case
from gpuhealth.checks import Finding
from gpuhealth.results import Action, Result, Status

if TYPE_CHECKING:
    from gpuhealth.plugin import RunState

# Above this many nodes the terminal lists the nodes that need attention, not every PASS.
LIST_ALL_NODES = 50


@dataclass
class _Pending:
    """A test between its setup and its teardown report."""

    start_ms: int
    status: str = PASSED
    message: str = ""
    trace: str = ""


@dataclass
class Reporter:
    """Controller-side collector of outcomes; writes verdicts even when the run is cut short."""

    state: RunState
    verdicts: list[reporting.NodeVerdict] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # report files that could not be written
    _pending: dict[str, _Pending] = field(default_factory=dict)

    @property
    def book(self) -> reporting.VerdictBook:
        return self.state.book

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props: dict[str, Any] = getattr(report, "gpuhealth", None) or {}
        self._verdict(report, props)
        if self.state.allure is not None:
            self._allure(report, props)

    # ------------------------------------------------------------ verdicts

    def _verdict(self, report: pytest.TestReport, props: dict[str, Any]) -> None:
        if report.when == "call" and "fleet" in props:
            self._fleet(props["fleet"])
        host = props.get("host")
        if host is None:
            return
        self.book.node(host)
        if "note" in props:
            self.book.note(host, props["note"])
        check = props.get("check") or _check_of(report.nodeid)
        gpu = props.get("gpu")
        if "unreachable" in props:
            self.book.unreachable(host, props["unreachable"])
            return
        if report.failed and "status" not in props:
            message = props.get("error") or _last_line(report)
            self.book.error(host, check, gpu, message)
            return
        if report.when == "setup" and report.skipped:  # e.g. a load test below its level
            self.book.add(reporting.Outcome(check, "SKIP", host, gpu, _skip_reason(report), host))
            return
        if report.when == "call" and "status" in props:
            self.book.add(_outcome(check, host, gpu, props))

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

    # ------------------------------------------------------------ Allure

    def _allure(self, report: pytest.TestReport, props: dict[str, Any]) -> None:
        """Fold a test's phases into one Allure result, written at its teardown."""
        if report.when == "setup":
            pending = self._pending[report.nodeid] = _Pending(int(report.start * 1000))
        else:
            pending = self._pending.get(report.nodeid) or _Pending(int(report.start * 1000))
        if pending.status == PASSED:  # the first phase that did not pass decides
            if report.skipped:
                pending.status, pending.message = SKIPPED, _skip_reason(report)
            elif report.failed and props.get("status") == Status.FAIL.value:
                pending.status, pending.message = FAILED, str(report.longrepr)
            elif report.failed:
                pending.status, pending.message = BROKEN, _broken(report, props)
                if "unreachable" not in props and "error" not in props:
                    pending.trace = report.longreprtext
            elif report.when == "call" and props.get("status") == Status.WARN.value:
                pending.message = _finding(props).text
        if report.when != "teardown":
            return
        del self._pending[report.nodeid]
        assert self.state.allure is not None
        self.state.allure.write(_case(report, props, pending))

    # ------------------------------------------------------------ the end

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        for name in self.state.targets:
            self.book.node(name)
        self.verdicts = self.book.finish()
        reporting.write_json(
            self.verdicts,
            self.state.verdicts,
            {"hosts": sorted(self.state.targets), "source": "pytest"},
        )
        if self.state.allure is not None:
            summary = reporting.FleetSummary.of(self.verdicts)
            self.state.allure.finish(
                [*summary.metadata(), ("level", self.state.level)],
                reporting.overview_html(self.verdicts, "gpuhealth fleet overview"),
            )
            problem = self.state.allure.close()
            if problem:
                self.problems.append(problem)

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
        for problem in self.problems:
            terminalreporter.write_line(f"gpuhealth: {problem}", red=True)
        return (yield)


def _check_of(nodeid: str) -> str:
    """`tests/test_gpu.py::test_ecc_errors[n1-gpu3]` -> `ecc_errors`."""
    return nodeid.rpartition("::")[2].partition("[")[0].removeprefix("test_")


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


def _outcome(check: str, host: str, gpu: int | None, props: dict[str, Any]) -> reporting.Outcome:
    return reporting.Outcome(
        check=check,
        status=props["status"],
        host=host,
        gpu=gpu,
        message=props.get("message", ""),
        label=props.get("label", host),
        action=props.get("action") or "NONE",
        advice=props.get("advice") or None,
    )


def _case(report: pytest.TestReport, props: dict[str, Any], pending: _Pending) -> Case:
    """The Allure result of a finished test: suites host > family > GPU, and the labels a
    fleet is filtered by (check, severity, profile, GPU serial and UUID)."""
    name = report.nodeid.rpartition("::")[2]
    check = _check_of(report.nodeid)
    chk = registry.checks().get(check)
    host, gpu = props.get("host"), props.get("gpu")
    family = report.nodeid.partition("::")[0].rpartition("/")[2]
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
    for key in ("profile", "uuid", "serial"):
        if props.get(key):
            labels.append((key, props[key]))
    if props.get("status") in (Status.FAIL.value, Status.WARN.value):
        labels.append(("action", props.get("action") or Action.NONE.value))
    if props.get("status") == Status.WARN.value:
        labels.append(("tag", "WARN"))
    attachments = props.get("attachments") or []
    return Case(
        nodeid=report.nodeid,
        name=name,
        status=pending.status,
        message=pending.message,
        trace=pending.trace,
        start_ms=pending.start_ms,
        stop_ms=int(report.stop * 1000),
        labels=labels,
        parameters=params,
        description=chk.summary if chk else "",
        attachments=attachments,
    )


def _broken(report: pytest.TestReport, props: dict[str, Any]) -> str:
    if "unreachable" in props:
        return f"host unreachable: {props['unreachable']}"
    return str(props.get("error") or _last_line(report))


def _skip_reason(report: pytest.TestReport) -> str:
    """A skip's reason without pytest's `Skipped: ` prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr or "")
    return text.removeprefix("Skipped: ")


def _last_line(report: pytest.TestReport) -> str:
    text = str(report.longrepr or "").strip().splitlines()
    return text[-1][:500] if text else "test error"
