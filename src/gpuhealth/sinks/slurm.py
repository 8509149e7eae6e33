"""`gpuhealth node-check --slurm`: tell Slurm this node's verdict (drain it on FAIL, resume
it on an idle PASS where gpuhealth drained it), what a HealthCheckProgram is for
(gpuhealth.integrations.slurm.act_on_self)."""

from __future__ import annotations

import sys

from gpuhealth.sinks import RunEnd, RunInfo, Sink, SinkError


class SlurmSink(Sink):
    """Acts once the verdict is known; each step is said as it is taken (on stderr where
    stdout is a document or NPD's line)."""

    name = "Slurm"

    def open(self, run: RunInfo) -> bool:
        if not run.option("slurm"):
            return False
        self.node = str(run.option("slurm_node"))  # resolved by node-check
        self.apply = bool(run.option("apply"))
        self.quiet = bool(run.option("json") or run.option("npd"))
        return True

    def close(self, end: RunEnd) -> None:
        from gpuhealth.integrations import slurm

        (verdict,) = end.verdicts
        say = (lambda text: print(text, file=sys.stderr)) if self.quiet else print
        if slurm.act_on_self(self.node, verdict, self.apply, say):
            raise SinkError(f"Slurm not told node {self.node}'s {verdict.verdict}: see above")


SINK = SlurmSink
