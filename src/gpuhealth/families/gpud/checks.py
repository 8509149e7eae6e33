"""GPUd checks: the health GPUd reports for each component it watches, and its recent events.

The probe asks GPUd on the node (loopback) where the inventory says it is installed
(`gpud_installed`); triage reads saved `/v1/states` and `/v1/events` responses. An Unhealthy
component fails with its reason and GPUd's suggested repair actions, Degraded (and a component
still Initializing) warns.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.checks import CheckSet, NodeView, detail, section
from gpuhealth.facts import reason
from gpuhealth.families.gpud.parse_gpud import HEALTHY
from gpuhealth.results import Action, Result, failed, passed, skipped, warned

CHECKS = CheckSet("gpud", ranks={"gpud": 1})

CRITICAL_TYPES = ("Critical", "Fatal")
_WARN_HEALTH = ("Degraded", "Initializing")
# GPUd's repair actions (api/v1 RepairActionType): gpuhealth's code and the words.
REPAIR_ACTIONS = {
    "REBOOT_SYSTEM": (Action.REBOOT_NODE, "drain and reboot the node"),
    "HARDWARE_INSPECTION": (
        Action.INSPECT,
        "drain the node for hardware inspection (RMA candidate)",
    ),
    "CHECK_USER_APP_AND_GPU": (Action.CHECK_APP, "check the user application, then the GPU"),
}
_SERVICE_ACTION = "check the service: `systemctl status gpud`, `journalctl -u gpud`"


def _missing(record: dict[str, Any], key: str, what: str) -> Result:
    if reason(record, key)["kind"] == "absent":
        return skipped(f"not evaluated: the evidence holds no GPUd {what}")
    where = f" at {record['address']}" if record.get("address") else ""
    return failed(
        f"GPUd{where} did not give its {what}: {detail(record, key)}",
        Action.FIX_CONFIG,
        _SERVICE_ACTION,
    )


def _describe(state: dict[str, Any]) -> str:
    name = state["component"] + (f"/{state['name']}" if state.get("name") else "")
    parts = [f"{name} {state['health'] or 'state unknown'}"]
    for key in ("reason", "error"):
        if state.get(key):
            parts.append(str(state[key]))
    if state["repair_actions"]:
        parts.append(f"GPUd suggests {', '.join(state['repair_actions'])}")
    return ": ".join(parts[:2]) + "".join(f"; {p}" for p in parts[2:])


def _suggested(states: list[dict[str, Any]], default: Action) -> tuple[Action, str]:
    """The most drastic of GPUd's suggested repair actions, with all of them in words."""
    codes: list[Action] = []
    words: list[str] = []
    for state in states:
        for name in state["repair_actions"]:
            code, text = REPAIR_ACTIONS.get(name, (Action.INSPECT, f"GPUd suggests {name}"))
            codes.append(code)
            entry = f"{text} (GPUd: {name})"
            if entry not in words:
                words.append(entry)
    action = min(codes, key=lambda a: a.rank) if codes else default
    return action, "; ".join(words) or "read the component's reason in GPUd (`gpud status`)"


@CHECKS.node("gpud_health", "gpud", section="gpud", in_use=True)
def gpud_health(node: NodeView) -> Result:
    """GPUd answers on its local API and every component it watches is Healthy."""
    gpud = section(node, "gpud")
    healthz = gpud.get("healthz")
    if healthz is None and reason(gpud, "healthz")["kind"] != "absent":
        return _missing(gpud, "healthz", "/healthz answer")
    if healthz is not None and str((healthz or {}).get("status", "")).lower() != "ok":
        return failed(
            f"GPUd /healthz answered {healthz!r}, expected status ok",
            Action.FIX_CONFIG,
            _SERVICE_ACTION,
        )
    states = gpud.get("states")
    if states is None:
        return _missing(gpud, "states", "component states (/v1/states)")
    if not states:
        if node.from_evidence:
            return skipped("not evaluated: the saved /v1/states lists no component")
        return failed(
            "GPUd reported no component states (an empty /v1/states)",
            Action.FIX_CONFIG,
            f"{_SERVICE_ACTION}; check that GPUd's components are enabled",
        )
    bad = [s for s in states if s["health"] not in (HEALTHY, None, *_WARN_HEALTH)]
    soft = [s for s in states if s["health"] is None or s["health"] in _WARN_HEALTH]
    if bad:
        return failed("; ".join(_describe(s) for s in bad), *_suggested(bad, Action.INSPECT))
    if soft:
        action, advice = _suggested(soft, Action.INSPECT)
        if not any(s["repair_actions"] for s in soft):
            advice = "watch the component; a state GPUd did not give is unknown, not healthy"
        return warned("; ".join(_describe(s) for s in soft), action, advice)
    components = sorted({s["component"] for s in states})
    return passed(f"GPUd: {len(states)} states of {len(components)} components Healthy")


def critical_events(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The Critical and Fatal events of a `gpud_events` section (attached as evidence)."""
    return [e for e in record.get("events") or [] if e.get("type") in CRITICAL_TYPES]


@CHECKS.node("gpud_events", "gpud", severity="normal", section="gpud_events", in_use=True)
def gpud_events(node: NodeView) -> Result:
    """No Critical or Fatal GPUd events in the window (the states say what is still wrong)."""
    record = section(node, "gpud_events")
    events = record.get("events")
    if events is None:
        return _missing(record, "events", "events (/v1/events)")
    since = f" since {record['since']}" if record.get("since") else ""
    critical = critical_events(record)
    if critical:
        shown = [
            f"{e['component']}: {e.get('type')} {e.get('name') or ''} "
            f"{e.get('message') or ''}".strip()
            for e in critical[:5]
        ]
        more = f" (+{len(critical) - 5} more)" if len(critical) > 5 else ""
        return failed(
            f"{len(critical)} Critical/Fatal GPUd events{since}: {'; '.join(shown)}{more}",
            Action.INSPECT,
            "read the attached events and act on the component they name; gpud_health says "
            "whether it is still unhealthy",
        )
    untyped = [e for e in events if not e.get("unknown") and e.get("type") is None]
    if untyped:
        shown = [
            f"{e['component']}: type {e.get('printed_type')!r} {e.get('name') or ''}".strip()
            for e in untyped[:5]
        ]
        return warned(
            f"{len(untyped)} GPUd events of unknown severity{since}: {'; '.join(shown)}",
            Action.INSPECT,
            "read the attached events: an event whose type cannot be read may be critical",
        )
    unknown = sorted({e["component"] for e in events if e.get("unknown")})
    listed = {e["component"] for e in events if not e.get("unknown")}
    if unknown:
        others = f"; no Critical or Fatal events in {len(listed)} others" if listed else ""
        return skipped(
            f"not evaluated for {len(unknown)} components ({', '.join(unknown[:8])}): GPUd gave "
            f"no event list (null: none recorded, or it could not read them){others}"
        )
    if not events and node.from_evidence:
        return skipped("not evaluated: the saved /v1/events lists no component")
    return passed(f"no Critical or Fatal GPUd events{since}")
