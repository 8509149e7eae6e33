"""GPUd checks: the health GPUd reports for each component it watches, and its recent events.

The probe asks GPUd on the node (loopback) where the inventory says it is installed
(`gpud_installed`); triage reads saved `/v1/states` and `/v1/events` responses. An Unhealthy
component fails with its reason and GPUd's suggested repair actions, Degraded (and a component
still Initializing) warns.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.checks import FAIL, PASS, SKIP, WARN, NodeView, Result, check
from gpuhealth.parsers.gpud import HEALTHY

CRITICAL_TYPES = ("Critical", "Fatal")
_WARN_HEALTH = ("Degraded", "Initializing")
# GPUd's repair actions (api/v1 RepairActionType) in the words of a drain script.
REPAIR_ACTIONS = {
    "REBOOT_SYSTEM": "drain and reboot the node",
    "HARDWARE_INSPECTION": "drain the node for hardware inspection (RMA candidate)",
    "CHECK_USER_APP_AND_GPU": "check the user application, then the GPU",
}
_SERVICE_ACTION = "check the service: `systemctl status gpud`, `journalctl -u gpud`"


def _not_expected(section: dict[str, Any]) -> Result | None:
    if not section.get("expected"):
        return Result(SKIP, "GPUd not expected on this host (gpud_installed: false)")
    return None


def _missing(section: dict[str, Any], key: str, what: str) -> Result:
    why = (section.get("unavailable") or {}).get(key) or {"kind": "error", "detail": "no data"}
    if why.get("kind") == "absent":
        return Result(SKIP, f"not evaluated: the evidence holds no GPUd {what}")
    where = f" at {section['address']}" if section.get("address") else ""
    return Result(
        FAIL, f"GPUd{where} did not give its {what}: {why.get('detail')}", _SERVICE_ACTION
    )


def _describe(state: dict[str, Any]) -> str:
    name = state["component"] + (f"/{state['name']}" if state.get("name") else "")
    parts = [f"{name} {state['health']}"]
    for key in ("reason", "error"):
        if state.get(key):
            parts.append(str(state[key]))
    if state["repair_actions"]:
        parts.append(f"GPUd suggests {', '.join(state['repair_actions'])}")
    return ": ".join(parts[:2]) + "".join(f"; {p}" for p in parts[2:])


def _actions(states: list[dict[str, Any]]) -> str:
    suggested = []
    for state in states:
        for action in state["repair_actions"]:
            text = REPAIR_ACTIONS.get(action)
            entry = f"{text} (GPUd: {action})"
            if text and entry not in suggested:
                suggested.append(entry)
    return "; ".join(suggested) or "read the component's reason in GPUd (`gpud status`)"


@check("gpud_health", "node", "gpud", section="gpud")
def gpud_health(node: NodeView) -> Result:
    """GPUd answers on its local API and every component it watches is Healthy."""
    section = node.facts["gpud"]
    skip = _not_expected(section)
    if skip:
        return skip
    healthz = section.get("healthz")
    healthz_why = (section.get("unavailable") or {}).get("healthz") or {}
    if healthz is None and healthz_why.get("kind") != "absent":
        return _missing(section, "healthz", "/healthz answer")
    if healthz is not None and str((healthz or {}).get("status", "")).lower() != "ok":
        return Result(
            FAIL, f"GPUd /healthz answered {healthz!r}, expected status ok", _SERVICE_ACTION
        )
    states = section.get("states")
    if states is None:
        return _missing(section, "states", "component states (/v1/states)")
    bad = [s for s in states if s["health"] not in (HEALTHY, *_WARN_HEALTH)]
    soft = [s for s in states if s["health"] in _WARN_HEALTH]
    if bad:
        return Result(FAIL, "; ".join(_describe(s) for s in bad), _actions(bad))
    if soft:
        return Result(
            WARN,
            "; ".join(_describe(s) for s in soft),
            _actions(soft) if any(s["repair_actions"] for s in soft) else "watch the component",
        )
    components = sorted({s["component"] for s in states})
    return Result(PASS, f"GPUd: {len(states)} states of {len(components)} components Healthy")


def critical_events(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The Critical and Fatal events of a `gpud_events` section (attached as evidence)."""
    return [e for e in section.get("events") or [] if e.get("type") in CRITICAL_TYPES]


@check("gpud_events", "node", "gpud", "normal", section="gpud_events")
def gpud_events(node: NodeView) -> Result:
    """No Critical or Fatal GPUd events in the last day (the states say what is still wrong)."""
    section = node.facts["gpud_events"]
    skip = _not_expected(section)
    if skip:
        return skip
    if section.get("events") is None:
        return _missing(section, "events", "events (/v1/events)")
    since = f" since {section['since']}" if section.get("since") else ""
    critical = critical_events(section)
    if not critical:
        return Result(PASS, f"no Critical or Fatal GPUd events{since}")
    shown = [
        f"{e['component']}: {e.get('type')} {e.get('name') or ''} {e.get('message') or ''}".strip()
        for e in critical[:5]
    ]
    more = f" (+{len(critical) - 5} more)" if len(critical) > 5 else ""
    return Result(
        WARN,
        f"{len(critical)} Critical/Fatal GPUd events{since}: {'; '.join(shown)}{more}",
        "read the attached events; gpud_health says whether the component is still unhealthy",
    )
