"""Saved GPUd answers for triage: `/v1/states` and `/v1/events` JSON (whole or one element)."""

from __future__ import annotations

import re
from typing import Any

from gpuhealth.facts import why
from gpuhealth.families.gpud import parse_gpud
from gpuhealth.parsing import ParseError
from gpuhealth.registry import Kind

# Where a JSON document begins in a ticket: `{`, `[` or `[{` at the margin.
_JSON_START = re.compile(r"^(?:\{|\[[ \t]*\r?$|\[[ \t]*\{)", re.M)


def _document(text: str) -> Any:
    if text.lstrip()[:1] not in ("[", "{"):
        return None
    try:
        return parse_gpud.load(text, "GPUd")
    except ParseError:
        return None


def looks_like_states(text: str) -> bool:
    """A GPUd `/v1/states` response, one element of it, or a list of health states."""
    return parse_gpud.kind(_document(text)) == "states"


def looks_like_events(text: str) -> bool:
    """A GPUd `/v1/events` response, one element of it, or a list of events."""
    return parse_gpud.kind(_document(text)) == "events"


def states_evidence(text: str) -> dict[str, Any]:
    """Saved `/v1/states` JSON as the `gpud` facts section (no /healthz in a saved file)."""
    return {
        "gpud": {
            "address": None,
            "healthz": None,
            "states": parse_gpud.states(parse_gpud.load(text, "GPUd /v1/states")),
            "unavailable": {"healthz": why("absent", "not in a saved response")},
        }
    }


def events_evidence(text: str) -> dict[str, Any]:
    """Saved `/v1/events` JSON as the `gpud_events` facts section."""
    found = parse_gpud.events(parse_gpud.load(text, "GPUd /v1/events"))
    return {"gpud_events": {"address": None, "since": None, "events": found, "unavailable": {}}}


KINDS = (
    Kind("GPUd /v1/states", looks_like_states, states_evidence, priority=35, starts=_JSON_START),
    Kind("GPUd /v1/events", looks_like_events, events_evidence, priority=36, starts=_JSON_START),
)
