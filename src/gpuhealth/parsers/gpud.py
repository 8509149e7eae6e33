"""GPUd (leptonai/gpud) API responses: `/v1/states` health states and `/v1/events` events.

`GET /v1/states` answers `[{"component": C, "states": [HealthState]}]`; a HealthState has
`health` (Healthy | Unhealthy | Degraded | Initializing), `reason`, `error` and
`suggested_actions.repair_actions` (REBOOT_SYSTEM, HARDWARE_INSPECTION, ...). GPUd before
v0.5 (PR #645) gave a boolean `healthy` instead. `GET /v1/events` answers
`[{"component", "startTime", "endTime", "events": [{"time", "name", "type", "message"}]}]` with
type Info | Warning | Critical | Fatal | Unknown.

People paste a whole response, one element of it, or the bare list a component's
`trigger-check` returns: each of these is accepted.
"""

from __future__ import annotations

import json
from typing import Any

from gpuhealth.parsers import ParseError

HEALTHY = "Healthy"
_HEALTH = {
    "healthy": "Healthy",
    "unhealthy": "Unhealthy",
    "degraded": "Degraded",
    "initializing": "Initializing",
}


def load(text: str, what: str) -> Any:
    """The JSON document; anything else is a ParseError naming the line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ParseError(f"{what}: not valid JSON: line {exc.lineno}: {exc.msg}") from exc


def _items(doc: Any) -> list[dict[str, Any]]:
    items = doc if isinstance(doc, list) else [doc]
    return [item for item in items if isinstance(item, dict)]


def kind(doc: Any) -> str | None:
    """Which GPUd response (or part of one) this is: "states", "events", or None."""
    items = _items(doc)
    if not items or (isinstance(doc, list) and len(items) != len(doc)):
        return None
    if all("states" in i or "health" in i or "healthy" in i for i in items):
        return "states"
    if all("events" in i or ("type" in i and ("message" in i or "name" in i)) for i in items):
        return "events"
    return None


def _health(state: dict[str, Any], component: str) -> str:
    if "health" in state and state["health"] is not None:
        text = str(state["health"])
        return _HEALTH.get(text.lower(), text)
    if isinstance(state.get("healthy"), bool):
        return HEALTHY if state["healthy"] else "Unhealthy"
    raise ParseError(f"GPUd state of component {component!r} has no 'health'")


def states(doc: Any) -> list[dict[str, Any]]:
    """Every HealthState, flattened, each naming its component."""
    if doc == []:
        return []
    if kind(doc) != "states":
        raise ParseError("not a GPUd /v1/states response (no 'states' or 'health')")
    flat = []
    for item in _items(doc):
        component = str(item.get("component") or "unknown")
        nested = item.get("states") if "states" in item else [item]
        for state in nested or []:
            if not isinstance(state, dict):
                raise ParseError(f"GPUd component {component!r}: a state is not an object")
            name = str(state.get("component") or component)
            actions = state.get("suggested_actions") or {}
            flat.append(
                {
                    "component": name,
                    "name": state.get("name"),
                    "health": _health(state, name),
                    "reason": state.get("reason") or None,
                    "error": state.get("error") or None,
                    "repair_actions": [str(a) for a in actions.get("repair_actions") or []],
                    "description": actions.get("description") or None,
                    "time": state.get("time"),
                }
            )
    return flat


def events(doc: Any) -> list[dict[str, Any]]:
    """Every event, flattened, each naming its component."""
    if doc == []:
        return []
    if kind(doc) != "events":
        raise ParseError("not a GPUd /v1/events response (no 'events')")
    flat = []
    for item in _items(doc):
        component = str(item.get("component") or "unknown")
        nested = item.get("events") if "events" in item else [item]
        for event in nested or []:
            if not isinstance(event, dict):
                raise ParseError(f"GPUd component {component!r}: an event is not an object")
            flat.append(
                {
                    "component": str(event.get("component") or component),
                    "time": event.get("time"),
                    "name": event.get("name"),
                    "type": event.get("type"),
                    "message": event.get("message"),
                }
            )
    return flat


def _document(text: str) -> Any:
    if text.lstrip()[:1] not in ("[", "{"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def looks_like_states(text: str) -> bool:
    """A GPUd `/v1/states` response, one element of it, or a list of health states."""
    return kind(_document(text)) == "states"


def looks_like_events(text: str) -> bool:
    """A GPUd `/v1/events` response, one element of it, or a list of events."""
    return kind(_document(text)) == "events"


def states_evidence(text: str) -> dict[str, Any]:
    """Saved `/v1/states` JSON as the `gpud` facts section (no /healthz in a saved file)."""
    return {
        "gpud": {
            "expected": True,
            "address": None,
            "healthz": None,
            "states": states(load(text, "GPUd /v1/states")),
            "unavailable": {"healthz": {"kind": "absent", "detail": "not in a saved response"}},
        }
    }


def events_evidence(text: str) -> dict[str, Any]:
    """Saved `/v1/events` JSON as the `gpud_events` facts section."""
    found = events(load(text, "GPUd /v1/events"))
    return {
        "gpud_events": {
            "expected": True,
            "address": None,
            "since": None,
            "events": found,
            "unavailable": {},
        }
    }
