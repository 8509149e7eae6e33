"""The inventory's side: a host's gpuhealth variables, validated, and the limits they resolve
to with its profile (the named one, or the one its platform is identified as).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from gpuhealth.config.limits import (
    PROFILE_ONLY,
    ConfigError,
    Profile,
    hint,
    limits_model,
    plain,
    validate,
)
from gpuhealth.config.profiles import Platform, ProfileSet


@dataclass(frozen=True)
class Expectations:
    """What the inventory says about one host, validated."""

    profile_name: str | None
    gpu_count: int | None
    overrides: dict[str, Any]


def expectations_from_vars(
    host: str, host_vars: dict[str, Any], profiles: ProfileSet
) -> Expectations:
    """Read and validate the gpuhealth inventory vars of one host.

    `gpu_profile` names the profile; every profile key set as an inventory var (group_vars,
    host_vars) overrides it, so expected state (`gpu_count`, `fabric`, `storage_paths`) and
    thresholds live in one vocabulary. `nvidia_driver_branch` is shared with the nvidia_driver
    role, so the branch a role installs is the branch the driver gate expects.
    """
    where = f"inventory host {host}"
    host_vars = plain(dict(host_vars))
    profile_name = host_vars.get("gpu_profile")
    if profile_name is not None:
        if not isinstance(profile_name, str):
            raise ConfigError(f"{where}: gpu_profile must be a string, got {profile_name!r}")
        try:
            profiles.get(profile_name)
        except ConfigError as exc:
            raise ConfigError(f"{where}: gpu_profile: {exc}") from exc
    gpu_count = host_vars.get("gpu_count")
    if gpu_count is not None and (
        isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 0
    ):
        raise ConfigError(f"{where}: gpu_count must be a whole number >= 0, got {gpu_count!r}")
    fields = limits_model().model_fields
    overrides: dict[str, Any] = {}
    for key, value in host_vars.items():
        if key in fields and key != "gpu_count":
            overrides[key] = value
        elif key not in fields and key not in PROFILE_ONLY:
            _reject_near_miss(where, key)
    validate(where, overrides)
    branch = host_vars.get("nvidia_driver_branch")
    if branch is not None:
        if not re.fullmatch(r"\d+(\.\d+)*", str(branch)):
            raise ConfigError(f"{where}: nvidia_driver_branch must look like '570', got {branch!r}")
        overrides.setdefault("min_driver_version", str(branch))
    return Expectations(profile_name, gpu_count, overrides)


def _reject_near_miss(where: str, key: str) -> None:
    """An inventory var one typo away from a profile key would silently do nothing: refuse it."""
    near = hint(key, cutoff=0.88)
    if near:
        raise ConfigError(f"{where}: unknown var {key!r}{near}")


def resolve_limits(
    expectations: Expectations, profiles: ProfileSet, platform: Platform | None
) -> Profile:
    """The limits for a host: the named profile (or the one its platform is identified as:
    ProfileSet.match; None before the host is probed) plus overrides."""
    if expectations.profile_name:
        name = expectations.profile_name
        note = profiles.contradiction(name, platform)
        base = replace(profiles.get(name), reason="named", note=note)
    else:
        base = profiles.match(platform)
    if not expectations.overrides and expectations.gpu_count is None:
        return base
    values = {**base.model.model_dump(), **expectations.overrides}
    if expectations.gpu_count is not None:
        values["gpu_count"] = expectations.gpu_count
    return replace(base, model=validate(f"profile {base.name} with inventory vars", values))
