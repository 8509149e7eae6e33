"""The families' limits composed into one validated model: every profile key is declared once,
by the family that uses it (`families/<name>/limits.py`: a pydantic model with the key's type,
default and meaning; units are in the key names), or in gpuhealth.limits for the run's keys
and the keys several families read. A bad value is one ConfigError that names the file (or
host) and the key, translated from pydantic's error.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError, create_model

from gpuhealth import registry
from gpuhealth.limits import FamilyLimits, RunLimits, SharedLimits


class ConfigError(ValueError):
    """A bad profile or inventory; the message names the file (or host) and the key."""


# Keys that describe a profile itself (the match_* keys: see config.profiles); inventory vars
# cannot override them.
PROFILE_ONLY = (
    "description",
    "extends",
    "match",
    "match_device_ids",
    "match_architecture",
    "match_cpu_arch",
    "match_max_gpus",
)
M = TypeVar("M", bound=BaseModel)


@cache
def limits_model() -> type[FamilyLimits]:
    """One model made of every family's keys (an instance is-a each family's model)."""
    bases: tuple[type[FamilyLimits], ...] = (
        RunLimits,
        SharedLimits,
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
    models: list[tuple[str, type[FamilyLimits]]] = [("run", RunLimits), ("shared", SharedLimits)]
    models += [(f.name, f.limits) for f in registry.families() if f.limits is not None]
    return [
        (family, key, info.default, info.description or "")
        for family, model in models
        for key, info in model.model_fields.items()
    ]


def _known_keys() -> list[str]:
    return [*limits_model().model_fields, *PROFILE_ONLY]


def hint(key: str, cutoff: float = 0.6) -> str:
    """` (did you mean 'key'?)` for the known key closest to a misspelt one ("" for none)."""
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


def explain(where: str, exc: ValidationError) -> ConfigError:
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
        return ConfigError(f"{where}: unknown key {key!r}{hint(key)}")
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
        raise explain(where, exc) from None


@dataclass(frozen=True)
class Profile:
    """Resolved limits: the profile's name and every key with a value, and, for a host, why
    it has this profile (`reason`) and what about the choice must be reported (`note`)."""

    name: str
    model: FamilyLimits = field(repr=False)
    reason: str = ""  # "named", or the evidence it was matched by ("device id 0x2941, ...")
    note: str = ""  # a choice the node's verdict must mention: mixed GPUs, a tie, a refusal

    @property
    def chosen(self) -> str:
        """The name with its reason, as reports show it: "gb200 (device id 0x2941, aarch64)"."""
        return f"{self.name} ({self.reason})" if self.reason else self.name

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
