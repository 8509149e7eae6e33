"""verdicts.json: one entry per node, for dashboards, drain scripts and `gpuhealth act`."""

from __future__ import annotations

from pathlib import Path

from gpuhealth import report as reporting
from gpuhealth.sinks import RunEnd, RunInfo, Sink, SinkError


class VerdictsSink(Sink):
    """Written at the end of every run, even one cut short (`complete` says so)."""

    name = "verdicts"
    # What `gpuhealth act`, drain scripts and merge read: a green exit must not leave them
    # the last run's file.
    fails_run = True

    def open(self, run: RunInfo) -> bool:
        if run.verdicts is None:
            return False
        self.run, self.path = run, run.verdicts
        return True

    def close(self, end: RunEnd) -> None:
        path: Path = self.path
        store = self.run.history.name if self.run.history else "off"
        extra = {
            "hosts": self.run.hosts,
            "source": "pytest",
            "complete": end.complete,
            "history": {"store": store, "run": end.history_run},
        }
        if self.run.option("shard"):  # one CI job's share: `gpuhealth merge` checks all came
            extra["shard"] = self.run.option("shard")
        try:
            reporting.VerdictDocument(end.verdicts, run=extra).write(path)
        except OSError as exc:
            raise SinkError(f"verdicts not written to {path}: {exc}") from None


SINK = VerdictsSink
