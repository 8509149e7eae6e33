"""The sinks as the commands that judge without pytest drive them (`gpuhealth triage`,
`gpuhealth node-check`): each finding becomes the record a suite's test would carry, and the
judgement goes through the same `Sinks` as a suite run (see ENTRY_POINTS)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from gpuhealth import report as reporting
from gpuhealth.sinks import FinishedTest, Record, RunEnd, RunInfo, Sink, Sinks


def record(outcome: reporting.Outcome) -> Record:
    """A finding as the record a suite's test of it carries."""
    return Record(
        outcome.host,
        outcome.gpu,
        check=outcome.check,
        status=outcome.status,
        message=outcome.message,
        label=outcome.label,
        action=outcome.action,
        advice=outcome.advice,
    )


def outcome(found: Record) -> reporting.Outcome:
    """The finding a record carries (what `record` made of it)."""
    return reporting.Outcome(
        str(found.check),
        str(found.status),
        str(found.host),
        found.gpu,
        found.message,
        found.label or "",
        found.action or "",
        found.advice,
    )


def nodeid(entry: str, found: Record) -> str:
    """The id a finding goes by, as a suite test's (`node-check::ecc_errors[n1-gpu3]`)."""
    where = found.host if found.gpu is None else f"{found.host}-gpu{found.gpu}"
    return f"{entry}::{found.check}[{where}]"


def finished(test_id: str, found: Record, start_ms: int, stop_ms: int) -> FinishedTest:
    """A finding as the suite's test of it would have ended, for a sink that reads a test's
    phases (JUnit, Allure): a SKIP skipped at setup, a FAIL failed in its call, an ERROR (the
    check could not run) an error at setup, the rest passed. Also the suite's own fleet
    checks that no test ran (an inventory group's shared value)."""
    test = FinishedTest(test_id, start_ms, stop_ms, found)
    text = f"{found.label}: {found.message}" if found.label else found.message
    if found.status == "SKIP":
        test.when, test.skipped, test.longrepr = "setup", True, text
    elif found.status in ("FAIL", "ERROR"):
        test.when = "call" if found.status == "FAIL" else "setup"
        test.longrepr = test.crash = text
    return test


def deliver(
    run: RunInfo,
    hosts: Callable[[], Iterable[Record]],
    outcomes: Iterable[reporting.Outcome | Record],
    verdicts: list[reporting.NodeVerdict],
    finished_at: float,
    kinds: tuple[type[Sink], ...] | None = None,
    duration_s: float | None = None,
) -> Sinks:
    """Feed a judgement to the entry point's sinks (`run.entry`): what each host is (`hosts`
    gives its records, asked only where an open sink takes them), every finding in order,
    then the verdicts (to `kinds` alone where given). The Sinks are returned closed, with
    their problems."""
    sinks = Sinks(run, kinds)
    for found in hosts() if sinks.hosts_wanted else ():
        sinks.host(str(found.host), found)
    start, stop = int(run.started_at * 1000), int(finished_at * 1000)
    findings = []
    for each in outcomes:
        found = each if isinstance(each, Record) else record(each)
        if found.status not in ("PASS", "SKIP"):
            findings.append(outcome(found))
        sinks.outcome(finished(nodeid(run.entry, found), found, start, stop))
    exit_status = 0 if reporting.overall(verdicts) in reporting.HEALTHY else 1
    sinks.close(RunEnd(verdicts, findings, True, exit_status, None, finished_at, duration_s))
    return sinks
