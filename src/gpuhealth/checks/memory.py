"""GPU memory reclaim: memory a finished job left behind is freed within the wait."""

from __future__ import annotations

from typing import Any

from gpuhealth.checks import FAIL, PASS, SKIP, NodeView, Result, check, need


@check("memory_reclaim", "gpu", "processes", "normal", section="memory_reclaim")
def memory_reclaim(node: NodeView, gpu: dict[str, Any]) -> Result:
    """GPU memory in use drops below the idle tolerance within the reclaim wait (idle nodes)."""
    if not node.limits["expect_idle"]:
        return Result(SKIP, "node is not expected to be idle (expect_idle: false)")
    section = node.facts["memory_reclaim"]
    if section.get("skipped"):
        return Result(SKIP, f"memory not polled: {section['skipped']}")
    record = next((r for r in section.get("gpus") or [] if r["index"] == gpu["index"]), None)
    if record is None:
        return Result(SKIP, "the NVML pass returned no memory statistics for this GPU")
    used = need(record, "used_mib", "GPU memory in use")
    tolerance = node.limits["max_idle_memory_used_mib"]
    total = record.get("total_mib")
    of_total = f" of {total} MiB" if total is not None else ""
    initial = record.get("initial_used_mib")
    waited = f"{section['waited_s']:g} s ({section['polls']} polls every {section['poll_s']:g} s)"
    if used > tolerance:
        if section.get("error"):
            return Result(
                FAIL,
                f"{used} MiB{of_total} in use (tolerance {tolerance} MiB) and polling failed "
                f"after {waited}: {section['error']}",
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
        return Result(
            FAIL,
            f"{used} MiB{of_total} still in use after waiting {waited}, tolerance "
            f"{tolerance} MiB; {held}",
            "stop the leftover processes (ps -p PID, then kill) before handing the node to a "
            "job; if no process holds the memory, reset the GPU",
        )
    if initial is not None and initial > tolerance:
        return Result(
            PASS,
            f"{used} MiB{of_total} in use after {waited}; {initial} MiB were freed within the "
            f"{section['wait_s']:g} s wait",
        )
    return Result(PASS, f"{used} MiB{of_total} in use (tolerance {tolerance} MiB), no wait needed")
