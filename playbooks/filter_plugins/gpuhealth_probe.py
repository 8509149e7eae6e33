"""Filters that let playbooks/collect.yml run gpuhealth's probe on nodes with Ansible.

They import gpuhealth, so run collect.yml with the ansible-playbook of gpuhealth's virtualenv
(.venv/bin/ansible-playbook): the probe, its expected limits and the facts documents are then
exactly those of `pytest --hosts=...`.
"""

from __future__ import annotations

import shlex
from typing import Any

from gpuhealth.config import (
    ProfileSet,
    expectations_from_vars,
    limits_model,
    resolve_limits,
)
from gpuhealth.transport import ProbeCall, parse_output, probe_call


def _call(hostvars: dict[str, Any], python: str, root: str) -> ProbeCall:
    """The probe's call for the host, with the limits its inventory vars resolve to (as the
    health suite resolves them before probing; `probe_timeout_s` bounds it)."""
    host = str(hostvars.get("inventory_hostname", "host"))
    # The inventory variables the probe's expectations are made of (the rest is Ansible's).
    names = (*limits_model().model_fields, "gpu_profile", "nvidia_driver_branch")
    known = {key: hostvars[key] for key in names if key in hostvars}
    profiles = ProfileSet()
    expect = resolve_limits(expectations_from_vars(host, known, profiles), profiles, None)
    config = {"root": root, "expect": expect.values}
    timeout_s = float(expect.values["probe_timeout_s"])
    return probe_call(config, python, timeout_s)


def probe_argv(hostvars: dict[str, Any], python: str = "python3", root: str = "/") -> list[str]:
    """The argv that runs the probe on the host: a short bootstrap reading `probe_stdin`."""
    return shlex.split(_call(hostvars, python, root).command)


def probe_stdin(hostvars: dict[str, Any], root: str = "/") -> str:
    """What `probe_argv`'s command reads on its standard input: the probe, compressed."""
    return _call(hostvars, "python3", root).stdin


def facts_document(stdout: str) -> dict[str, Any]:
    """The facts document the probe printed (schema_version checked)."""
    return parse_output(stdout)


class FilterModule:
    """gpuhealth_probe_argv, gpuhealth_probe_stdin, gpuhealth_facts_document."""

    def filters(self) -> dict[str, Any]:
        return {
            "gpuhealth_probe_argv": probe_argv,
            "gpuhealth_probe_stdin": probe_stdin,
            "gpuhealth_facts_document": facts_document,
        }
