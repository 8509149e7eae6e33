"""Filters that let playbooks/collect.yml run gpuhealth's probe on nodes with Ansible.

They import gpuhealth, so run collect.yml with the ansible-playbook of gpuhealth's virtualenv
(.venv/bin/ansible-playbook): the probe, its expected limits and the facts documents are then
exactly those of `pytest --hosts=...`.
"""

from __future__ import annotations

import shlex
from typing import Any

from gpuhealth.config import PROFILE_KEYS, ProfileSet, expectations_from_vars, resolve_limits
from gpuhealth.transport import parse_output, probe_command

# Inventory variables the probe's expectations are made of (the rest of hostvars is Ansible's).
_EXPECTATION_VARS = (*PROFILE_KEYS, "gpu_profile", "nvidia_driver_branch")


def probe_argv(
    hostvars: dict[str, Any],
    python: str = "python3",
    timeout_s: float = 120,
    nvml_call_timeout_s: float = 5.0,
    root: str = "/",
) -> list[str]:
    """The argv that runs the probe on the host, with the limits its inventory vars resolve to
    (as the health suite resolves them before probing)."""
    host = str(hostvars.get("inventory_hostname", "host"))
    known = {key: hostvars[key] for key in _EXPECTATION_VARS if key in hostvars}
    profiles = ProfileSet()
    expect = resolve_limits(expectations_from_vars(host, known, profiles), profiles, None)
    config = {"nvml_call_timeout_s": nvml_call_timeout_s, "root": root, "expect": expect.limits}
    return shlex.split(probe_command(config, python, timeout_s))


def facts_document(stdout: str) -> dict[str, Any]:
    """The facts document the probe printed (schema_version checked)."""
    return parse_output(stdout)


class FilterModule:
    """gpuhealth_probe_argv, gpuhealth_facts_document."""

    def filters(self) -> dict[str, Any]:
        return {"gpuhealth_probe_argv": probe_argv, "gpuhealth_facts_document": facts_document}
