"""The `memory_reclaim` section: give GPU memory a finished job left behind time to be freed.

A job that just ended can hold GPU memory for seconds while its processes exit and the driver
tears down contexts; judging the node at that instant would blame it for its last tenant. When
the GPU family's NVML pass saw a GPU above `max_idle_memory_used_mib` on a node expected to be
idle, this polls memory every `reclaim_poll_s` until every GPU is below it or `reclaim_wait_s`
ran out, then names the processes still holding memory. A clean node pays nothing: no second
NVML session is opened. Every call has the NVML call timeout.

Node side: Python 3.6 and the standard library (plus nvidia-ml-py when importable).
"""

import time
from typing import TYPE_CHECKING, Any, Dict, List

from gpuhealth.facts import IN_USE, skipped, why
from gpuhealth.families.reclaim import schema
from gpuhealth.probe import nvml
from gpuhealth.schema import written

if TYPE_CHECKING:
    from gpuhealth.probe.main import Context

SECTIONS = written(schema.SECTIONS)
# What the probe still needs after the wait (the families after this one, the answer): the
# wait ends this long before the probe's deadline, so a slow reclaim never kills the probe.
DEADLINE_MARGIN_S = 10.0


def _records(gpus: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Per-GPU statistics as the NVML pass left them; a memory it could not read says why."""
    records = []
    for gpu in gpus:
        record: Dict[str, Any] = {
            "index": gpu["index"],
            "used_mib": gpu.get("memory_used_mib"),
            "initial_used_mib": gpu.get("memory_used_mib"),
            "total_mib": gpu.get("memory_total_mib"),
            # Only a poll after the wait knows who is left; until then, the first pass's list
            # (None when it could not be read: unknown is not "none").
            "processes": gpu.get("processes"),
            "unavailable": {},
        }
        if record["used_mib"] is None:
            found = (gpu.get("unavailable") or {}).get("memory_used_mib")
            reason = found or why("error", "no value from the NVML pass")
            for key in ("used_mib", "initial_used_mib"):
                record["unavailable"][key] = dict(reason)
        records.append(record)
    return records


def _poll(
    session: nvml.Session,
    section: Dict[str, Any],
    pending: Dict[int, Dict[str, Any]],
    threshold: float,
) -> None:
    """Poll the GPUs above the threshold until they drop or the wait is over."""
    handles = {
        index: session.call(
            f"nvmlDeviceGetHandleByIndex(gpu={index})", "nvmlDeviceGetHandleByIndex", index
        )
        for index in pending
    }
    started = time.monotonic()
    try:
        while pending:
            left = section["wait_s"] - (time.monotonic() - started)
            if left <= 0:
                break
            time.sleep(min(section["poll_s"], left))
            section["polls"] += 1
            for index, record in list(pending.items()):
                memory = session.call(
                    f"nvmlDeviceGetMemoryInfo(gpu={index})",
                    "nvmlDeviceGetMemoryInfo",
                    handles[index],
                )
                record["used_mib"] = memory.used // nvml.MIB
                if record["used_mib"] <= threshold:
                    del pending[index]
    finally:
        section["waited_s"] = round(time.monotonic() - started, 1)
    for index, record in pending.items():
        infos = session.call(
            f"nvmlDeviceGetComputeRunningProcesses_v3(gpu={index})",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            handles[index],
        )
        record["processes"] = [nvml.process_record(info) for info in infos]


def collect(ctx: "Context") -> Dict[str, Any]:
    """The `memory_reclaim` section: per-GPU memory after waiting for it to be freed."""
    if ctx.node_state() == IN_USE:
        return {
            "memory_reclaim": skipped(
                "node in use ({}): a job's memory is not waited for".format(
                    ctx.facts["node_state"]["source"]
                )
            )
        }
    if not ctx.setting("expect_idle"):
        return {
            "memory_reclaim": skipped("the node is not expected to be idle (expect_idle: false)")
        }
    if ctx.facts.get("source") != "nvml":
        return {
            "memory_reclaim": skipped("NVML was not available, so GPU memory could not be polled")
        }
    threshold = float(ctx.setting("max_idle_memory_used_mib"))
    wait_s = float(ctx.setting("reclaim_wait_s"))
    left = ctx.left_s()
    capped = False
    if wait_s > 0 and left is not None and left - DEADLINE_MARGIN_S < wait_s:
        capped, wait_s = True, max(0.0, round(left - DEADLINE_MARGIN_S, 1))
    section: Dict[str, Any] = {
        "threshold_mib": threshold,
        "wait_s": wait_s,
        "wait_capped": capped,
        "poll_s": float(ctx.setting("reclaim_poll_s")),
        "waited_s": 0.0,
        "polls": 0,
        "error": None,
        "gpus": _records(ctx.facts.get("gpus") or []),
    }
    pending = {
        r["index"]: r
        for r in section["gpus"]
        if r["used_mib"] is not None and r["used_mib"] > threshold
    }
    if not pending:
        return {"memory_reclaim": section}
    session = nvml.open_session(float(ctx.setting("nvml_call_timeout_s")), ctx.errors)
    if session is None:
        section["error"] = "NVML could not be opened again to poll memory (see errors)"
        return {"memory_reclaim": section}
    try:
        _poll(session, section, pending, threshold)
    except nvml.Unavailable as exc:
        section["error"] = exc.detail
        session.record(exc)
    finally:
        nvml.close_session(session)
    return {"memory_reclaim": section}
