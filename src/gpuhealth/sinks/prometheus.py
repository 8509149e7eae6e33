"""The Prometheus textfile (`--prometheus-textfile-dir DIR`): DIR/gpuhealth.prom for
node_exporter, every host's verdict, check statuses and measurements
(gpuhealth.integrations.prometheus renders and writes it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuhealth.sinks import FinishedTest, Record, RunEnd, RunInfo, Sink, SinkError


class PrometheusSink(Sink):
    """Counts every check outcome as the run goes; writes the file at its end."""

    name = "Prometheus textfile"

    def open(self, run: RunInfo) -> bool:
        if run.textfile_dir is None:
            return False
        self.directory: Path = run.textfile_dir
        self.level, self.started_at, self.mode = run.level, run.started_at, run.entry
        self.checked: list[tuple[str, int | None, str, str]] = []
        self.measured: dict[str, dict[str, Any]] = {}  # host -> {"rows", "identity"}
        return True

    def host(self, host: str, record: Record) -> None:
        kept = self.measured.setdefault(host, {"rows": []})
        kept["rows"] += [*(record.rows or []), *(record.readings or [])]
        if record.identity is not None:
            kept["identity"] = record.identity

    def outcome(self, test: FinishedTest) -> None:
        self.checked += test.statuses()

    def close(self, end: RunEnd) -> None:
        from gpuhealth.integrations import prometheus  # prometheus_client only when asked

        run = prometheus.Run(
            mode=self.mode,  # suite, node-check
            level=self.level,
            finished_at=end.finished_at,
            duration_s=end.duration(self.started_at),
            complete=end.complete,
            verdicts=end.verdicts,
            outcomes=self.checked,
            measured=self.measured,
        )
        try:
            prometheus.write(self.directory, run)
        except (OSError, ValueError) as exc:
            path = self.directory / prometheus.FILE_NAME
            if self.mode == "node-check":  # after `gpuhealth node-check: `, in a node's log
                raise SinkError(f"cannot write {path}: {exc}") from None
            raise SinkError(f"Prometheus textfile not written to {path}: {exc}") from None


SINK = PrometheusSink
