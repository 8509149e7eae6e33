"""GPUd: the health of every component GPUd watches and its recent critical events, read by
the probe from GPUd's API on the node (loopback) where gpud_installed is true.

Select them with `-m gpud`.
"""

import pytest

from gpuhealth.families.gpud.checks import critical_events
from gpuhealth.families.gpud.parse_gpud import HEALTHY
from gpuhealth.plugin import attach_json, judge

pytestmark = pytest.mark.gpud


def test_gpud_health(node):
    """GPUd answers /healthz and every component in /v1/states is Healthy."""
    states = (node.view.facts.get("gpud") or {}).get("states") or []
    unhealthy = [s for s in states if s["health"] != HEALTHY]
    if unhealthy:
        attach_json(node, f"gpud unhealthy states {node.view.host}.json", unhealthy)
    judge("gpud_health", node)


def test_gpud_events(node):
    """No Critical or Fatal GPUd events in the last day (attached as evidence)."""
    section = node.view.facts.get("gpud_events") or {}
    critical = critical_events(section)
    if critical:
        attach_json(node, f"gpud critical events {node.view.host}.json", critical)
    judge("gpud_events", node)
