"""What the kernel-log family measures over time: the XID events of kinds that fail a node, and
where the log reading ended, so the next run tells new events from ones already seen."""

from __future__ import annotations

from typing import Any

from gpuhealth.families.kernel.checks import xid_table
from gpuhealth.metrics import GAUGE, EventCount, Events, Export, Measures, Metric, Values, moment
from gpuhealth.results import Status

XID_FATAL_EVENTS = "xid_fatal_events"
# Not a judged metric: where the last run's kernel log reading ended.
KERNEL_LOG_UNTIL = "kernel_log_until"
METRICS = (
    Metric(
        XID_FATAL_EVENTS,
        "XID events of kinds that fail a node",
        "new_events",
        "regression_fatal_xid_growth",
        advice="read the new XIDs (xid_errors and kernel_log checks) and follow their advice",
        export=Export(
            "node_fatal_xid_events",
            GAUGE,
            "XID events of kinds that fail a node, in the kernel log window the run read.",
        ),
    ),
)


def fatal_xid_groups(facts: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The kernel log's XID groups whose XID fails a node (None: the log was not read)."""
    log = facts.get("kernel_log")
    counts = log.get("counts") if isinstance(log, dict) else None
    if not isinstance(counts, list):
        return None
    table = xid_table()
    return [
        group
        for group in counts
        if isinstance(group, dict)
        and group.get("kind") == "xid"
        and group.get("code") in table
        and table[group["code"]][0] is Status.FAIL
    ]


def new_fatal_xids(facts: dict[str, Any], since: float) -> EventCount:
    """Fatal XID events after `since` (epoch). A group that started before `since` and ended
    after it counts the events of its sample after `since` (at least one)."""
    count, seen, undated = 0, [], False
    for group in fatal_xid_groups(facts) or []:
        first, last = moment(group.get("first")), moment(group.get("last"))
        where = f"XID {group['code']} on {group.get('bus_id') or 'an unknown bus'}"
        if last is None:
            undated = True
            seen.append(f"{where} (no time)")
            continue
        if last <= since:
            continue
        if first is not None and first > since:
            count += int(group.get("count") or 1)
        else:
            events = [
                e
                for e in (facts.get("kernel_log") or {}).get("events") or []
                if isinstance(e, dict)
                and e.get("kind") == "xid"
                and e.get("code") == group["code"]
                and e.get("bus_id") == group.get("bus_id")
                and (moment(e.get("time")) or 0) > since
            ]
            count += max(1, len(events))
        seen.append(f"{where} at {group.get('last')}")
    return EventCount(count, seen, undated)


def node_values(facts: dict[str, Any]) -> Values:
    """Fatal XIDs in the log's window, and where the log reading ended."""
    groups = fatal_xid_groups(facts)
    log = facts.get("kernel_log")
    until = moment(log.get("until")) if isinstance(log, dict) else None
    if groups is None or until is None:
        return {}
    return {
        XID_FATAL_EVENTS: float(sum(int(g.get("count") or 1) for g in groups)),
        KERNEL_LOG_UNTIL: until,
    }


MEASURES = Measures(
    METRICS,
    node=node_values,
    events=Events(
        XID_FATAL_EVENTS,
        KERNEL_LOG_UNTIL,
        new_fatal_xids,
        lambda facts: fatal_xid_groups(facts) is not None,
        "XIDs",
        "the kernel log",
        "kernel_log",
    ),
)
