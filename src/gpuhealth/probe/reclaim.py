"""Sub-probe `memory_reclaim`: give GPU memory a finished job left behind time to be freed.

A job that just ended can hold GPU memory for seconds while its processes exit and the driver
tears down contexts; judging the node at that instant would blame it for its last tenant. When
the NVML pass saw a GPU above `max_idle_memory_used_mib` on a node expected to be idle, this
polls memory every `reclaim_poll_s` until every GPU is below it or `reclaim_wait_s` ran out,
then names the processes still holding memory. A clean node pays nothing: no second NVML
session is opened. Uses the NVML collector's session, so every call has its timeout.
"""

from __future__ import annotations

import time
from typing import Any

from gpuhealth.probe import nvml

# default.yml's values, for expectations that lack a key.
DEFAULTS = {"reclaim_wait_s": 50, "reclaim_poll_s": 2, "max_idle_memory_used_mib": 512}


def _setting(expect: dict[str, Any], key: str) -> float:
    value = expect.get(key)
    return DEFAULTS[key] if value is None else value


def _records(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-GPU statistics as the NVML pass left them; a memory it could not read says why."""
    records = []
    for gpu in gpus:
        record: dict[str, Any] = {
            "index": gpu["index"],
            "used_mib": gpu.get("memory_used_mib"),
            "initial_used_mib": gpu.get("memory_used_mib"),
            "total_mib": gpu.get("memory_total_mib"),
            # Only a poll after the wait knows who is left; until then, the first pass's list
            # (None when it could not be read: unknown is not "none").
            "processes": gpu.get("processes"),
            "unavailable": {},
        }
        why = (gpu.get("unavailable") or {}).get("memory_used_mib")
        if record["used_mib"] is None:
            why = why or {"kind": "error", "detail": "no value from the NVML pass"}
            for key in ("used_mib", "initial_used_mib"):
                record["unavailable"][key] = dict(why)
        records.append(record)
    return records


def _poll(
    session: Any, section: dict[str, Any], pending: dict[int, dict[str, Any]], threshold: float
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
        record["processes"] = [nvml._process(info) for info in infos]


def collect(cfg: dict[str, Any], errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The `memory_reclaim` section: per-GPU memory after waiting for it to be freed."""
    expect = cfg.get("expect") or {}
    threshold = _setting(expect, "max_idle_memory_used_mib")
    section: dict[str, Any] = {
        "threshold_mib": threshold,
        "wait_s": _setting(expect, "reclaim_wait_s"),
        "poll_s": max(_setting(expect, "reclaim_poll_s"), 0.1),
        "waited_s": 0.0,
        "polls": 0,
        "skipped": None,
        "error": None,
        "gpus": [],
    }
    if expect.get("expect_idle") is False:
        section["skipped"] = "the node is not expected to be idle (expect_idle: false)"
        return section
    if expect.get("expect_idle") is None:  # `gpuhealth probe` by hand: do not stall a busy node
        section["skipped"] = "the probe was given no expect_idle, so it did not wait"
        return section
    if nvml.last_gpus is None:
        section["skipped"] = "NVML was not available, so GPU memory could not be polled"
        return section
    section["gpus"] = _records(nvml.last_gpus)
    pending = {
        r["index"]: r
        for r in section["gpus"]
        if r["used_mib"] is not None and r["used_mib"] > threshold
    }
    if not pending:
        return section
    session = nvml.open_session(float(cfg.get("nvml_call_timeout_s", 5.0)), errors)
    if session is None:
        section["error"] = "NVML could not be opened again to poll memory (see errors)"
        return section
    try:
        _poll(session, section, pending, threshold)
    except nvml._Unavailable as why:
        section["error"] = why.detail
        session.record(why)
    finally:
        nvml.close_session(session)
    return section
