"""Filters that let playbooks/collect.yml run gpuhealth's load tests on the nodes
(`-e level=standard|full`) and carry them in the facts documents (gpuhealth.active.collect).

Like gpuhealth_probe.py they import gpuhealth: run collect.yml with the virtualenv's
ansible-playbook, so that the commands, timeouts and readings are the health suite's own.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.active import collect
from gpuhealth.checks import NodeView


def _view(hostvars: dict[str, Any], facts: dict[str, Any]) -> NodeView:
    return NodeView(
        str(hostvars.get("inventory_hostname")), facts, collect.host_limits(hostvars, facts)
    )


def load_call(
    hostvars: dict[str, Any], facts: dict[str, Any], level: str, python: str = "python3"
) -> dict[str, Any]:
    """`argv`, `stdin` and `timeout_s` of the task that runs the node's load tests at `level`
    (planned from its facts document, as a live run plans them after its probe)."""
    return collect.node_call(_view(hostvars, facts), level, python)


def with_load(
    facts: dict[str, Any], hostvars: dict[str, Any], level: str, result: dict[str, Any]
) -> dict[str, Any]:
    """The facts document with the load tests' sections, read from the task's `result` (its
    registered variable); every test fails, saying why, when the node reported nothing."""
    if level == "quick":
        return {**facts, collect.LEVEL_KEY: level}
    failure = None
    done: list[dict[str, Any]] = []
    try:
        done = collect.node_report(str(result.get("stdout") or ""))
    except ValueError as exc:
        detail = result.get("msg") or result.get("stderr") or exc
        failure = f"the load tests on the node gave no report: {str(detail).strip()[-300:]}"
    view = _view(hostvars, facts)
    return {**facts, **collect.load_results(view, level, done, failure)}


class FilterModule:
    """gpuhealth_load_call, gpuhealth_with_load."""

    def filters(self) -> dict[str, Any]:
        return {"gpuhealth_load_call": load_call, "gpuhealth_with_load": with_load}
