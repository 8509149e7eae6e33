"""Saved nccl-tests logs for triage (any collective, any launcher prefix)."""

from __future__ import annotations

import re
from typing import Any

from gpuhealth.families.nccl import parse_nccl_tests
from gpuhealth.registry import Kind

# Where a run's output begins in a ticket (after a launcher prefix such as `0: ` or
# `[1,0]<stdout>:`): its version, `nThread` or `Using devices` line, or its column header.
_START = re.compile(
    r"^[ \t]*(?:[^\s#]\S*:[ \t]*)?"
    r"(?:#[ \t]{0,4}(?:nThread \d|nccl-tests version |Using devices)|(?:#[ \t]*)?size[ \t]+count"
    r"[ \t]+type\b)",
    re.M,
)
_ABORTED = (
    "read the error: 'system not yet initialized' on NVSwitch systems means the fabric manager "
    "is not running (or not the driver's version); 'busy or unavailable' means another process "
    "holds the GPUs or they are in exclusive mode; run a CUDA sample, then nccl-tests again"
)


def evidence(text: str) -> dict[str, Any]:
    """A saved log as the `nccl` facts section; `nodes` comes from complete rank lines (or
    `gpuhealth triage --nodes`), never guessed. A run that aborted (before its first result
    row, or after some) is a failed run with its error."""
    section: dict[str, Any] = {
        "nodes": None,
        "hosts": [],
        "command": None,
        "rc": None,
        "duration_s": None,
        "error": None,
        "exit_note": None,
        "run": None,
    }
    try:
        run = parse_nccl_tests.parse(text)
    except parse_nccl_tests.Aborted as exc:
        error = f"nccl-tests aborted before its first result: {exc}"
        return {"nccl": {**section, "error": error, "action": "INSPECT", "advice": _ABORTED}}
    section.update(hosts=run["hosts"], run=run)
    if run["aborted"]:
        section.update(
            error=f"nccl-tests aborted after {len(run['rows'])} rows: "
            + "; ".join(run["aborted"][:3]),
            action="INSPECT",
            advice=_ABORTED,
        )
    return {"nccl": section}


KINDS = (
    Kind("nccl-tests output", parse_nccl_tests.looks_like, evidence, priority=40, starts=_START),
)
