"""GPU memory reclaim: memory a finished job left behind is freed within the wait."""

from __future__ import annotations

from typing import Any

from gpuhealth.checks import CheckSet, NodeView, need, section
from gpuhealth.families.gpu.limits import GpuLimits
from gpuhealth.families.gpu.scope import GPU
from gpuhealth.results import Action, Result, failed, passed, skipped

CHECKS = CheckSet("reclaim")


def _seconds(value: Any) -> str:
    """A duration of the wait for a message ("?" where saved facts hold no number: it is only
    reported, the memory is what is judged)."""
    return f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "?"


@CHECKS.per(
    GPU, "memory_reclaim", "processes", severity="normal", section="memory_reclaim", in_use=False
)
def memory_reclaim(node: NodeView, gpu: dict[str, Any]) -> Result:
    """GPU memory in use drops below the idle tolerance within the reclaim wait (idle nodes)."""
    if not node.limits.get(GpuLimits).expect_idle:
        return skipped("node is not expected to be idle (expect_idle: false)")
    polled = section(node, "memory_reclaim")
    record = next((r for r in polled.get("gpus") or [] if r.get("index") == gpu["index"]), None)
    if record is None:
        return skipped("the NVML pass returned no memory statistics for this GPU")
    used = need(record, "used_mib", "GPU memory in use")
    tolerance = node.limits.get(GpuLimits).max_idle_memory_used_mib
    total = record.get("total_mib")
    of_total = f" of {total} MiB" if total is not None else ""
    initial = record.get("initial_used_mib")
    seconds = {key: _seconds(polled.get(key)) for key in ("waited_s", "poll_s", "wait_s")}
    waited = f"{seconds['waited_s']} s ({polled.get('polls')} polls every {seconds['poll_s']} s)"
    if polled.get("wait_capped"):
        waited += f", the wait cut to {seconds['wait_s']} s by the probe's deadline"
    if used > tolerance:
        if polled.get("error"):
            return failed(
                f"{used} MiB{of_total} in use (tolerance {tolerance} MiB) and polling failed "
                f"after {waited}: {polled['error']}",
                Action.RERUN,
                "re-run; if NVML keeps failing, check the driver and reboot the node",
            )
        procs = record.get("processes") or []
        held = (
            "leftover processes: "
            + ", ".join(
                f"pid {p.get('pid')} ({p.get('name') or '?'}, {p.get('used_memory_mib')} MiB)"
                for p in procs
            )
            if procs
            else "no compute process holds it"
        )
        return failed(
            f"{used} MiB{of_total} still in use after waiting {waited}, tolerance "
            f"{tolerance} MiB; {held}",
            Action.CHECK_APP if procs else Action.RESET_GPU,
            "stop the leftover processes (ps -p PID, then kill) before handing the node to a "
            "job; if no process holds the memory, reset the GPU",
        )
    if initial is not None and initial > tolerance:
        return passed(
            f"{used} MiB{of_total} in use after {waited}; {initial} MiB were freed within the "
            f"{seconds['wait_s']} s wait"
        )
    return passed(f"{used} MiB{of_total} in use (tolerance {tolerance} MiB), no wait needed")
