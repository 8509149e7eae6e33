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

from typing import Any, Dict, List, Optional

from gpuhealth.parsing import ParseError, load_json

HEALTHY = "Healthy"
_HEALTH = {
    "healthy": "Healthy",
    "unhealthy": "Unhealthy",
    "degraded": "Degraded",
    "initializing": "Initializing",
}


def load(text: str, what: str) -> Any:
    """The JSON document; anything else is a ParseError naming the line."""
    stripped = text.lstrip()
    doc = load_json(stripped, what)
    return doc


def _items(doc: Any) -> List[Dict[str, Any]]:
    items = doc if isinstance(doc, list) else [doc]
    return [item for item in items if isinstance(item, dict)]


def kind(doc: Any) -> Optional[str]:
    """Which GPUd response (or part of one) this is: "states", "events", or None."""
    items = _items(doc)
    if not items or (isinstance(doc, list) and len(items) != len(doc)):
        return None
    if all("states" in i or "health" in i or "healthy" in i for i in items):
        return "states"
    if all("events" in i or ("type" in i and ("message" in i or "name" in i)) for i in items):
        return "events"
    return None


def _health(state: Dict[str, Any], component: str) -> str:
    if "health" in state and state["health"] is not None:
        text = str(state["health"])
        return _HEALTH.get(text.lower(), text)
    if isinstance(state.get("healthy"), bool):
        return HEALTHY if state["healthy"] else "Unhealthy"
    raise ParseError(f"GPUd state of component {component!r} has no 'health'")


def _nested(item: Dict[str, Any], key: str, component: str) -> Optional[List[Dict[str, Any]]]:
    """item[key] (a component's states or events) as a list of objects; None when GPUd gave
    null, which it does both when there is nothing and when it could not read them."""
    if key not in item:
        return [item]
    nested = item[key]
    if nested is None:
        return None
    if not isinstance(nested, list) or not all(isinstance(n, dict) for n in nested):
        raise ParseError(f"GPUd component {component!r}: {key} is not a list of objects")
    return nested


def _text(value: Any) -> Optional[str]:
    return None if value is None or value == "" else str(value)


def states(doc: Any) -> List[Dict[str, Any]]:
    """Every HealthState, flattened, each naming its component.

    A component whose states are null gets one entry with `health` null: unknown, not healthy.
    """
    if doc == []:
        return []
    if kind(doc) != "states":
        raise ParseError("not a GPUd /v1/states response (no 'states' or 'health')")
    flat: List[Dict[str, Any]] = []
    for item in _items(doc):
        component = str(item.get("component") or "unknown")
        nested = _nested(item, "states", component)
        if nested is None:
            flat.append(
                {
                    "component": component,
                    "name": None,
                    "health": None,
                    "reason": "GPUd gave no state (null)",
                    "error": None,
                    "repair_actions": [],
                    "description": None,
                    "time": None,
                }
            )
            continue
        for state in nested:
            name = str(state.get("component") or component)
            actions = state.get("suggested_actions") or {}
            listed = actions.get("repair_actions") if isinstance(actions, dict) else None
            if listed is not None and not isinstance(listed, list):
                raise ParseError(f"GPUd component {name!r}: repair_actions is not a list")
            flat.append(
                {
                    "component": name,
                    "name": _text(state.get("name")),
                    "health": _health(state, name),
                    "reason": _text(state.get("reason")),
                    "error": _text(state.get("error")),
                    "repair_actions": [str(a) for a in listed or []],
                    "description": _text(actions.get("description"))
                    if isinstance(actions, dict)
                    else None,
                    "time": _text(state.get("time")),
                }
            )
    return flat


def events(doc: Any) -> List[Dict[str, Any]]:
    """Every event, flattened, each naming its component.

    A component whose events are null gets one entry with `type` null and `unknown` true: GPUd
    does not say whether there were none or whether it failed to read them.
    """
    if doc == []:
        return []
    if kind(doc) != "events":
        raise ParseError("not a GPUd /v1/events response (no 'events')")
    flat: List[Dict[str, Any]] = []
    for item in _items(doc):
        component = str(item.get("component") or "unknown")
        nested = _nested(item, "events", component)
        if nested is None:
            flat.append({"component": component, "type": None, "unknown": True})
            continue
        for event in nested:
            flat.append(
                {
                    "component": str(event.get("component") or component),
                    "time": _text(event.get("time")),
                    "name": _text(event.get("name")),
                    "type": _text(event.get("type")),
                    "message": _text(event.get("message")),
                }
            )
    return flat
