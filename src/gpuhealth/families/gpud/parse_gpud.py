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

from typing import Any, Dict, List, Optional, Tuple

from gpuhealth.parsing import ParseError, load_json

HEALTHY = "Healthy"
_HEALTH = {name.lower(): name for name in (HEALTHY, "Unhealthy", "Degraded", "Initializing")}


def _without_trailing_commas(text: str) -> str:
    """The text without the commas people leave when they cut JSON out of a larger answer: one
    after the last element (`[{...},]`, `{"a": 1,}`) or after the document (`{...},`)."""
    out: List[str] = []
    quoted = escaped = False
    comma = -1  # where in `out` a comma waits to see what follows it
    for char in text:
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char in "]}" and comma >= 0:
            out[comma] = ""
        if not char.isspace() or quoted:
            comma = -1
        if char == "," and not quoted:
            comma = len(out)
        out.append(char)
    if comma >= 0:
        out[comma] = ""
    return "".join(out)


def load(text: str, what: str) -> Any:
    """The JSON document, also with the trailing commas of a pasted fragment; anything else is a
    ParseError naming the line."""
    try:
        return load_json(text.lstrip(), what, whole=True)
    except ParseError:
        return load_json(_without_trailing_commas(text).lstrip(), what, whole=True)


def _items(doc: Any) -> List[Dict[str, Any]]:
    items = doc if isinstance(doc, list) else [doc]
    return [item for item in items if isinstance(item, dict)]


_EVENT_TYPES = {name.lower(): name for name in ("Info", "Warning", "Critical", "Fatal")}


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
    if nested is None or (key == "states" and nested == []):  # a component is never stateless
        return None
    if not isinstance(nested, list) or not all(isinstance(n, dict) for n in nested):
        raise ParseError(f"GPUd component {component!r}: {key} is not a list of objects")
    return nested


def _text(value: Any) -> Optional[str]:
    return None if value is None or value == "" else str(value)


def _components(doc: Any, key: str) -> List[Tuple[str, Optional[List[Dict[str, Any]]]]]:
    """(component, its states or events, None when GPUd gave null) of a response."""
    if doc == []:
        return []
    if kind(doc) != key:
        raise ParseError(f"not a GPUd /v1/{key} response (no {key!r})")
    found = []
    for item in _items(doc):
        component = str(item.get("component") or "unknown")
        found.append((component, _nested(item, key, component)))
    return found


def states(doc: Any) -> List[Dict[str, Any]]:
    """Every HealthState, flattened, each naming its component.

    A component whose states are null gets one entry with `health` null: unknown, not healthy.
    """
    flat: List[Dict[str, Any]] = []
    for component, nested in _components(doc, "states"):
        if nested is None:
            flat.append(
                {
                    "component": component,
                    "name": None,
                    "health": None,
                    "reason": "GPUd gave no state (null or [])",
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
            if not isinstance(actions, dict):
                raise ParseError(f"GPUd component {name!r}: suggested_actions is not an object")
            listed = actions.get("repair_actions") or []
            if not isinstance(listed, list):
                raise ParseError(f"GPUd component {name!r}: repair_actions is not a list")
            flat.append(
                {
                    "component": name,
                    "name": _text(state.get("name")),
                    "health": _health(state, name),
                    "reason": _text(state.get("reason")),
                    "error": _text(state.get("error")),
                    "repair_actions": [str(a) for a in listed],
                    "description": _text(actions.get("description")),
                    "time": _text(state.get("time")),
                }
            )
    return flat


def events(doc: Any) -> List[Dict[str, Any]]:
    """Every event, flattened, each naming its component.

    A component whose events are null gets one entry with `type` null and `unknown` true: GPUd
    does not say whether there were none or whether it failed to read them.
    """
    flat: List[Dict[str, Any]] = []
    for component, nested in _components(doc, "events"):
        if nested is None:
            flat.append({"component": component, "type": None, "unknown": True})
            continue
        for event in nested:
            printed = _text(event.get("type"))
            # GPUd's types, in any case; any other (or none) is an event of unknown severity.
            known = _EVENT_TYPES.get((printed or "").lower())
            entry = {
                "component": str(event.get("component") or component),
                "time": _text(event.get("time")),
                "name": _text(event.get("name")),
                "type": known,
                "message": _text(event.get("message")),
            }
            if known is None:
                entry["printed_type"] = printed
            flat.append(entry)
    return flat
