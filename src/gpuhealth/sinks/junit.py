"""JUnit XML (`--junitxml`), streamed test by test (gpuhealth.junit_results)."""

from __future__ import annotations

from gpuhealth.junit_results import JUnitResults
from gpuhealth.sinks import FinishedTest, RunEnd, RunInfo, Sink, SinkError


class JUnitSink(Sink):
    """One `testcase` per finished test, as pytest's junitxml writes it."""

    name = "JUnit XML"
    fails_run = True  # what CI reads: a green run must not come without it

    def open(self, run: RunInfo) -> bool:
        if run.junit is None:
            return False
        self.junit: JUnitResults = run.junit
        return True

    def outcome(self, test: FinishedTest) -> None:
        seconds = max(0.0, (test.stop_ms - test.start_ms) / 1000)
        self.junit.case(test.nodeid, seconds, *element(test))

    def close(self, end: RunEnd) -> None:
        try:
            self.junit.close()
        except OSError as exc:
            raise SinkError(f"JUnit XML not written: {exc}") from None


def element(test: FinishedTest) -> tuple[str | None, str, str]:
    """The JUnit element (failure, error, skipped or none), message and text of a test, as
    pytest's junitxml writes them."""
    if not test.when:
        return None, "", ""
    if test.skipped:
        return "skipped", test.longrepr, test.longrepr
    if test.when == "call":
        return "failure", test.crash, test.trace
    return "error", f'failed on {test.when} with "{test.crash}"', test.trace


SINK = JUnitSink
