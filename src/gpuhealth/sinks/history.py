"""The run store (`--history`): the run, its verdicts, findings and what each host measured.

It closes first: it names the nodes that passed last run and fail now (added to their
verdicts, which every later sink writes) and says whether the run was kept (the Allure trend
plot and verdicts.json's `history.run` follow it). A store that cannot be used fails the run:
a nightly job must not pass without its regression checks.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.history.run import new_failures, run_record
from gpuhealth.history.store import StoreError
from gpuhealth.sinks import Record, RunEnd, RunInfo, Sink, SinkError


class HistorySink(Sink):
    """Appends the run to the store at its end (nothing with --history-read-only)."""

    name = "run history"
    fails_run = True

    def open(self, run: RunInfo) -> bool:
        history = run.history
        if history is None or history.spec is None or history.read_only:
            return False
        self.run, self.history = run, history
        self.measured: dict[str, dict[str, Any]] = {}  # host -> {"rows", "identity"}
        return True

    def host(self, host: str, record: Record) -> None:
        if record.rows is None and record.identity is None:
            return
        kept = self.measured.setdefault(host, {"rows": []})
        kept["rows"] += record.rows or []
        if record.identity is not None:
            kept["identity"] = record.identity

    def close(self, end: RunEnd) -> None:
        history = self.history
        try:
            store = history.store()
            if store is None:
                raise StoreError(str(history.error))
            by_host = {v.host: v for v in end.verdicts}
            nights = history.nights(self.measured)
            machines = {
                host: found["identity"]["node_id"]
                for host, found in self.measured.items()
                if "node_id" in found.get("identity", {})
            }
            last = store.last_states(by_host, machines)  # a renamed host's too
            for host, entry in new_failures(last, by_host, nights).items():
                by_host[host].regressions.append(entry)
            store.write_run(
                run_record(
                    history,
                    complete=end.complete,
                    exit_status=end.exit_status,
                    level=self.run.level,
                    source=self.run.source,
                    command=self.run.command,
                    inventory=self.run.inventory,
                    verdicts=end.verdicts,
                    outcomes=end.findings,
                    measured_by_host=self.measured,
                )
            )
        except (StoreError, OverflowError, ValueError, TypeError) as exc:
            # A value the database driver refuses (an integer beyond its 64 bits) costs the
            # run store this run, never the other reports.
            raise SinkError(f"run history not kept: {exc}") from None
        end.history_run = history.uid


SINK = HistorySink
