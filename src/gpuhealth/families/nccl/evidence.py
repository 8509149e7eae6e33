"""Saved nccl-tests logs for triage (any collective, any launcher prefix)."""

from __future__ import annotations

from typing import Any

from gpuhealth.families.nccl import parse_nccl_tests
from gpuhealth.registry import Kind


def evidence(text: str) -> dict[str, Any]:
    """A saved log as the `nccl` facts section; `nodes` comes from complete rank lines (or
    `gpuhealth triage --nodes`), never guessed."""
    run = parse_nccl_tests.parse(text)
    return {
        "nccl": {
            "nodes": None,
            "hosts": run["hosts"],
            "command": None,
            "rc": None,
            "duration_s": None,
            "error": None,
            "exit_note": None,
            "run": run,
        }
    }


KINDS = (Kind("nccl-tests output", parse_nccl_tests.looks_like, evidence, priority=40),)
