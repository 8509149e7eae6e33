"""`gpuhealth triage`'s answer on standard output: what each node's evidence was, the findings
with their advice and the ticket part they came from, and the verdict; or, with `--json`, the
verdict document of the findings (VerdictDocument.findings_json)."""

from __future__ import annotations

import json

from gpuhealth import report as reporting
from gpuhealth.sinks import FinishedTest, Record, RunEnd, RunInfo, Sink, entry


class TriageSink(Sink):
    """Printed at the end, once every file was read and judged."""

    name = "triage output"

    def open(self, run: RunInfo) -> bool:
        self.json, self.verbose = bool(run.option("json")), bool(run.option("verbose"))
        self.hosts: list[Record] = []  # what each node's evidence was (Record.evidence)
        self.found: list[Record] = []
        return True

    def host(self, host: str, record: Record) -> None:
        self.hosts.append(record)

    def outcome(self, test: FinishedTest) -> None:
        self.found.append(test.record)

    def close(self, end: RunEnd) -> None:
        if self.json:
            self._json(end.verdicts)
        else:
            self._text(reporting.overall(end.verdicts))

    def _json(self, verdicts: list[reporting.NodeVerdict]) -> None:
        outcomes = [entry.outcome(found) for found in self.found]
        parts = {id(o): found.evidence for o, found in zip(outcomes, self.found, strict=True)}
        profiles = {str(h.host): str(h.profile) for h in self.hosts}
        document = reporting.VerdictDocument(verdicts, outcomes)
        doc = document.findings_json(profiles, lambda o: parts[id(o)])
        print(json.dumps(doc, indent=2))

    def _text(self, verdict: str) -> None:
        for host in self.hosts:
            print(f"{host.host}: {host.evidence}, profile {host.profile}, node {host.node_state}")
            for note in host.remarks or []:
                print(f"  note: {note}")
        outcomes = [(entry.outcome(found), found.evidence) for found in self.found]
        for o, part in outcomes:
            if (o.status == "PASS" or not_evaluated(o)) and not self.verbose:
                continue
            action = f" [{o.action}]" if o.status in ("FAIL", "WARN") else ""
            print(f"{o.status:<5} {o.check:<16} {o.label}: {o.message}{action}")
            if o.advice and o.status in ("FAIL", "WARN"):
                print(f"{'':<22} advice: {o.advice}")
            if part and o.status in ("FAIL", "WARN"):
                print(f"{'':<22} from: {part}")
        passed = sum(o.status == "PASS" for o, _ in outcomes)
        hidden = sum(not_evaluated(o) for o, _ in outcomes)
        if not self.verbose and (passed or hidden):
            print(f"({passed} passed, {hidden} not evaluated for want of evidence; -v lists them)")
        print(f"verdict: {verdict}")


def not_evaluated(outcome: reporting.Outcome) -> bool:
    """A check the evidence holds no data for (listed with -v only)."""
    return outcome.status == "SKIP" and outcome.message.startswith("not evaluated:")


SINK = TriageSink
