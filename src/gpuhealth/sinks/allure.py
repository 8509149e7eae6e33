"""Allure results (`--alluredir`): one result per test, written as it ends
(gpuhealth.allure_results), the fleet overview and trend plot at the end."""

from __future__ import annotations

import functools
import time

from gpuhealth import registry
from gpuhealth import report as reporting
from gpuhealth.allure_results import BROKEN, FAILED, PASSED, SKIPPED, AllureResults, Case
from gpuhealth.history.run import History
from gpuhealth.history.show import trends_png
from gpuhealth.history.store import StoreError
from gpuhealth.results import Action, Status
from gpuhealth.sinks import FinishedTest, RunEnd, RunInfo, Sink, SinkError, check_of, name_of

TREND_DAYS = 30  # the span of the history plot the Allure report carries


class AllureSink(Sink):
    """Each test's result with the labels a fleet is filtered by; the run's summary, overview
    page and trend plot as the report's environment and attachments."""

    name = "Allure results"
    fails_run = True  # the report a green run promises

    def open(self, run: RunInfo) -> bool:
        if run.allure is None:
            return False
        self.allure: AllureResults = run.allure
        self.level = run.level
        self.history: History | None = run.history
        return True

    def outcome(self, test: FinishedTest) -> None:
        self.allure.write(case(test))

    def close(self, end: RunEnd) -> None:
        problems = []
        trends = None
        if end.history_run is not None and self.history is not None:
            store = self.history.store()
            try:
                trends = trends_png(store, time.time() - TREND_DAYS * 86400) if store else None
            except StoreError as exc:
                problems.append(f"no trend plot in the Allure report: {exc}")
        summary = reporting.FleetSummary.of(end.verdicts)
        self.allure.finish(
            [*summary.metadata(), ("level", self.level)],
            reporting.overview_html(end.verdicts, "gpuhealth fleet overview"),
            trends,
        )
        problem = self.allure.close()
        if problem:
            problems.append(problem)
        if problems:
            raise SinkError("; ".join(problems))


@functools.lru_cache(maxsize=4096)
def _function(name: str) -> tuple[str, str, str, str]:
    """The check, suite, severity and description of a test function's results, from its id
    without parameters (`tests/test_gpu.py::test_ecc_errors`): the same for every host."""
    check = check_of(name)
    chk = registry.checks().get(check)
    if chk is not None:
        return check, chk.group, chk.severity, chk.summary
    family = name.partition("::")[0].rpartition("/")[2]
    return check, family.removeprefix("test_").removesuffix(".py"), "normal", ""


def case(test: FinishedTest) -> Case:
    """The Allure result of a finished test: suites host > family > GPU, and the labels a
    fleet is filtered by (check, severity, profile, GPU serial and UUID)."""
    nodeid, record = test.nodeid, test.record
    check, suite, severity, description = _function(nodeid.partition("[")[0])
    host, gpu = record.host, record.gpu
    labels = [
        ("parentSuite", host or "fleet"),
        ("suite", suite),
        ("check", check),
        ("severity", severity),
    ]
    params = []
    if host is not None:
        labels.append(("host", host))
        params.append(("gpuhealth_host", host))
    if gpu is not None:
        index = str(gpu)
        labels += [("subSuite", f"gpu{gpu}"), ("gpu", index)]
        params.append(("gpu", index))
    for key, value in (
        ("profile", record.profile),
        ("node_state", record.node_state),
        ("uuid", record.uuid),
        ("serial", record.serial),
    ):
        if value:
            labels.append((key, value))
    status = record.status
    if status == _FAIL or status == _WARN:
        labels.append(("action", record.action or _NONE))
        if status == _WARN:
            labels.append(("tag", "WARN"))
    outcome, message, trace = _status(test)
    return Case(
        nodeid,
        name_of(nodeid),
        outcome,
        message,
        trace,
        test.start_ms,
        test.stop_ms,
        labels,
        params,
        description,
        record.attachments or [],
    )


_FAIL, _WARN, _NONE = Status.FAIL.value, Status.WARN.value, Action.NONE.value


def _status(test: FinishedTest) -> tuple[str, str, str]:
    """Allure's status, message and trace for a finished test: the check's FAIL is `failed`,
    a test that could not run (host unreachable, broken facts, a bug) is `broken`."""
    record = test.record
    if not test.when:
        warned = record.status == Status.WARN.value
        return PASSED, record.finding().text if warned else "", ""
    if test.skipped:
        return SKIPPED, test.longrepr, ""
    if record.status == Status.FAIL.value:
        return FAILED, test.longrepr, ""
    if record.unreachable is not None:
        return BROKEN, f"host unreachable: {record.unreachable}", ""
    if record.error is not None:
        return BROKEN, record.error, ""
    return BROKEN, test.last_line(), test.trace


SINK = AllureSink
