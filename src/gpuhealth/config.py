"""Per-SKU limit profiles and the inventory variables that override them, validated.

Every profile key is declared once, by the family that uses it (`families/<name>/limits.py`: a
pydantic model with the key's type, default and meaning; units are in the key names). The
`default` profile is those defaults; SKU profiles (`profiles/*.yml`) and inventory variables
override them. Everything is validated when the run starts, so a typo in a YAML file is one
usage error that names the file and the key instead of hundreds of broken tests.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    StrictStr,
    ValidationError,
    create_model,
)

from gpuhealth import registry
from gpuhealth.limits import FamilyLimits, RunLimits


class ConfigError(ValueError):
    """A bad profile or inventory; the message names the file (or host) and the key."""


# Keys that describe a profile itself; inventory vars cannot override them.
PROFILE_ONLY = ("description", "extends", "match")
M = TypeVar("M", bound=BaseModel)


@cache
def limits_model() -> type[FamilyLimits]:
    """One model made of every family's keys (an instance is-a each family's model)."""
    bases: tuple[type[FamilyLimits], ...] = (
        RunLimits,
        *(f.limits for f in registry.families() if f.limits is not None),
    )
    seen: dict[str, str] = {}
    for base in bases:
        for key in base.model_fields:
            if key in seen:
                raise RuntimeError(f"profile key {key!r} is declared by {seen[key]} and {base}")
            seen[key] = base.__module__
    return create_model("Limits", __base__=bases)


def key_table() -> list[tuple[str, str, Any, str]]:
    """(family, key, default, meaning) of every profile key, in family order: the README's
    table of profile keys, and `gpuhealth profiles --keys`."""
    models: list[tuple[str, type[FamilyLimits]]] = [("run", RunLimits)]
    models += [(f.name, f.limits) for f in registry.families() if f.limits is not None]
    return [
        (family, key, info.default, info.description or "")
        for family, model in models
        for key, info in model.model_fields.items()
    ]


def _known_keys() -> list[str]:
    return [*limits_model().model_fields, *PROFILE_ONLY]


def _hint(key: str, cutoff: float = 0.6) -> str:
    found = difflib.get_close_matches(key, _known_keys(), n=1, cutoff=cutoff)
    return f" (did you mean {found[0]!r}?)" if found else ""


_TYPE_STEP = re.compile(r"(function-\w+|int|float|str|bool|tagged-union)(\[.*\])?$")
_TYPE_WORDS = {
    "int_type": "int",
    "float_type": "float",
    "bool_type": "bool",
    "string_type": "a string",
    "list_type": "a list",
    "model_type": "an absolute path or a mapping with a 'path'",
    "finite_number": "a finite number",
}


def _explain(where: str, exc: ValidationError) -> ConfigError:
    """The first problem pydantic found, as one line naming the key (and list item)."""
    errors = exc.errors()
    error = errors[0]
    # Union members and validators show up in the location as their type names: drop them.
    loc = [str(part) for part in error["loc"] if not _TYPE_STEP.match(str(part))]
    key = loc[0] if loc else "?"
    path = key + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc[1:])
    value = error.get("input")
    kind = error["type"]
    if kind == "extra_forbidden" and len(loc) == 1:
        return ConfigError(f"{where}: unknown key {key!r}{_hint(key)}")
    if kind == "extra_forbidden":
        parent = path[: -len(loc[-1]) - 1]
        return ConfigError(f"{where}: {parent}: unknown key {loc[-1]!r}")
    if kind == "missing":
        return ConfigError(f"{where}: {path}: a required entry is missing")
    if value is None and len(loc) == 1:
        return ConfigError(f"{where}: key {key!r} may not be null")
    if kind in _TYPE_WORDS:
        # A union (int or float) reports one error per member at the same place.
        same = [e["type"] for e in errors if e.get("input") is value and e["type"] in _TYPE_WORDS]
        words = list(dict.fromkeys(_TYPE_WORDS[t] for t in same))
        wanted = _TYPE_WORDS["finite_number"] if "finite_number" in same else " or ".join(words)
        return ConfigError(f"{where}: key {path!r} must be {wanted}, got {value!r}")
    if kind == "literal_error":
        choices = str((error.get("ctx") or {}).get("expected", "")).replace("'", "")
        return ConfigError(f"{where}: key {path!r} must be {choices}, got {value!r}")
    bounds = {"greater_than": "gt", "greater_than_equal": "ge"}
    if kind in bounds:
        sign = ">" if kind == "greater_than" else ">="
        limit = (error.get("ctx") or {}).get(bounds[kind])
        return ConfigError(f"{where}: key {path!r} must be {sign} {limit}, got {value!r}")
    message = str(error["msg"]).removeprefix("Value error, ")
    got = "" if "got" in message else f" (got {value!r})"
    return ConfigError(f"{where}: key {path!r}: {message}{got}")


def plain(value: Any) -> Any:
    """Inventory data as builtin types: Ansible hands filters lazy, tagged containers (2.19+)
    whose items only resolve when iterated in Python, and strict validation wants `str`."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def validate(where: str, values: dict[str, Any]) -> FamilyLimits:
    """Every key of `values` checked against its declaration (the rest take defaults)."""
    try:
        return limits_model().model_validate(values)
    except ValidationError as exc:
        raise _explain(where, exc) from None


@dataclass(frozen=True)
class Profile:
    """Resolved limits: the profile's name and every key with a value."""

    name: str
    model: FamilyLimits

    @property
    def values(self) -> dict[str, Any]:
        """Every key as plain data (what the probe is sent as its expectations)."""
        return self.model.model_dump(mode="json")

    def get(self, kind: type[M]) -> M:
        """The limits as one family's typed model."""
        if not isinstance(self.model, kind):
            raise TypeError(f"{kind.__name__} is not a family of these limits")
        return self.model

    def __getattr__(self, key: str) -> Any:
        # Generic code (reports, `gpuhealth profiles`) may read any key by name.
        return getattr(self.model, key)


class _Meta(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    description: StrictStr | None = None
    extends: StrictStr | None = None
    match: list[StrictStr] | None = None


class ProfileSet:
    """All profiles known to a run: the packaged ones plus an optional user directory."""

    def __init__(self, extra_dir: Path | None = None) -> None:
        self._raw: dict[str, tuple[str, _Meta, dict[str, Any]]] = {
            "default": (
                "gpuhealth (family defaults)",
                _Meta(description="Any NVIDIA GPU (when no profile is named and none matches)"),
                {},
            )
        }
        packaged = resources.files("gpuhealth") / "profiles"
        for entry in sorted(packaged.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".yml"):
                self._add(f"gpuhealth/profiles/{entry.name}", entry.read_text())
        if extra_dir is not None:
            if not extra_dir.is_dir():
                raise ConfigError(f"{extra_dir}: profile directory does not exist")
            for path in sorted(extra_dir.glob("*.yml")):
                self._add(str(path), path.read_text())
        self._resolved: dict[str, Profile] = {}
        for name in self._raw:
            self.get(name)

    def _add(self, where: str, text: str) -> None:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: a profile must be a mapping of keys to limits")
        data = {str(k): v for k, v in data.items()}
        try:
            meta = _Meta.model_validate({k: data[k] for k in PROFILE_ONLY if k in data})
        except ValidationError as exc:
            raise _explain(where, exc) from None
        for pattern in meta.match or []:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"{where}: key 'match': bad pattern {pattern!r}: {exc}") from exc
        limits = {k: v for k, v in data.items() if k not in PROFILE_ONLY}
        validate(where, limits)
        self._raw[Path(where).stem] = (where, meta, limits)

    @property
    def names(self) -> list[str]:
        """Known profile names, sorted."""
        return sorted(self._raw)

    def description(self, name: str) -> str:
        """A profile's description."""
        return self._raw[name][1].description or ""

    def _chain(self, name: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
        if name not in self._raw:
            raise ConfigError(f"unknown profile {name!r}; known profiles: {', '.join(self.names)}")
        if name in seen:
            raise ConfigError(f"profile {name!r}: 'extends' loops through {' -> '.join(seen)}")
        where, meta, limits = self._raw[name]
        parent = (
            meta.extends if meta.extends is not None else (None if name == "default" else "default")
        )
        merged: dict[str, Any] = {}
        if parent is not None:
            if parent not in self._raw:
                raise ConfigError(f"{where}: extends unknown profile {parent!r}")
            merged.update(self._chain(parent, (*seen, name)))
        merged.update(limits)
        return merged

    def get(self, name: str) -> Profile:
        """Resolve a profile through its `extends` chain; unknown names are a ConfigError."""
        if name not in self._resolved:
            values = self._chain(name)
            self._resolved[name] = Profile(name, validate(self._raw[name][0], values))
        return self._resolved[name]

    def match(self, product_name: str | None) -> Profile:
        """The profile whose `match` patterns fit the GPU product name, else `default`."""
        if product_name:
            for name in self.names:
                patterns = self._raw[name][1].match or []
                if any(re.search(p, product_name) for p in patterns):
                    return self.get(name)
        return self.get("default")


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
    hint = _hint(key, cutoff=0.88)
    if hint:
        raise ConfigError(f"{where}: unknown var {key!r}{hint}")


def resolve_limits(
    expectations: Expectations, profiles: ProfileSet, product_name: str | None
) -> Profile:
    """The limits for a host: the named profile (or the one matching its GPUs) plus overrides."""
    if expectations.profile_name:
        base = profiles.get(expectations.profile_name)
    else:
        base = profiles.match(product_name)
    if not expectations.overrides and expectations.gpu_count is None:
        return base
    values = {**base.model.model_dump(), **expectations.overrides}
    if expectations.gpu_count is not None:
        values["gpu_count"] = expectations.gpu_count
    return Profile(base.name, validate(f"profile {base.name} with inventory vars", values))
