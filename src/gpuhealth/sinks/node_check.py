"""`gpuhealth node-check`'s answer on standard output: the findings and a verdict line, the
verdict document (`--json`), or node-problem-detector's one line (`--npd`)."""

from __future__ import annotations

import json

from gpuhealth import report as reporting
from gpuhealth.integrations.nodecheck import npd_line
from gpuhealth.sinks import FinishedTest, RunEnd, RunInfo, Sink, entry


class NodeCheckSink(Sink):
    """Printed at the end, when the verdict is known: stdout is what Slurm's log, NPD and a
    caller of `--json` read."""

    name = "node-check output"
    fails_run = True  # the answer NPD and Slurm's log read: without it nothing vouches for the node

    def open(self, run: RunInfo) -> bool:
        self.started_at = run.started_at
        self.form = "npd" if run.option("npd") else "json" if run.option("json") else "text"
        self.outcomes: list[reporting.Outcome] = []
        return True

    def outcome(self, test: FinishedTest) -> None:
        self.outcomes.append(entry.outcome(test.record))

    def close(self, end: RunEnd) -> None:
        (verdict,) = end.verdicts
        duration_s = end.duration(self.started_at)
        document = reporting.VerdictDocument([verdict], self.outcomes, self.started_at, duration_s)
        if self.form == "npd":
            print(npd_line(npd_message(document)))
        elif self.form == "json":
            print(json.dumps(document.node_json(), indent=2))
        else:
            self._text(verdict, duration_s)

    def _text(self, verdict: reporting.NodeVerdict, duration_s: float) -> None:
        for found in self.outcomes:
            if found.status in ("FAIL", "ERROR", "WARN"):
                print(
                    f"{found.status:<5} {found.check:<16} {found.label}: {found.message}"
                    f" [{found.action}]"
                )
        counts = verdict.counts
        state = f", {verdict.node_state}: {verdict.node_state_source}" if verdict.node_state else ""
        print(
            f"{verdict.host}: {verdict.verdict} ({counts['PASS']} passed, "
            f"{counts['FAIL'] + counts['ERROR']} failed, {counts['WARN']} warnings, "
            f"{duration_s:.1f} s{state})"
        )


def npd_message(document: reporting.VerdictDocument) -> str:
    """NPD's one line: the verdict, then the first failure by check and GPU (not the GPU's
    UUID and serial, which would use up the line before saying what is wrong)."""
    (verdict,) = document.verdicts
    failures = document.failures
    if not failures:
        return reporting.headline(verdict.verdict, verdict.reasons)
    first = failures[0]
    where = f"gpu{first.gpu} " if first.gpu is not None else ""
    more = f" (+{len(failures) - 1})" if len(failures) > 1 else ""
    return f"{verdict.verdict}{more}: {where}{first.check}: {first.message}"


SINK = NodeCheckSink
