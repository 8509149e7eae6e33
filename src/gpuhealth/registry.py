"""The one registry of check families, discovered from their declarations.

A family is one folder under `gpuhealth/families/` whose `family.py` declares everything about
it: its facts sections, the families it needs and the profile keys its node side reads
(`schema.py`; written by its node-side `probe.py`, or by a load test in `active.py`), its
profile keys (`limits.py`), its checks, what it measures over time for history
and exporters (`metrics.py`), its evidence kinds for triage and its pytest markers.
`gpuhealth.families.NAMES` lists the folders in report order; that one line is all the rest
of gpuhealth needs to learn about a new family.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cache
from typing import TYPE_CHECKING, Any

from gpuhealth import limits as limits_module
from gpuhealth.checks import Check, CheckSet, Scope
from gpuhealth.families import NAMES
from gpuhealth.limits import FamilyLimits
from gpuhealth.metrics import Measures, Metric, pattern
from gpuhealth.schema import CORE_PROFILE_KEYS, Section, needs_order

if TYPE_CHECKING:
    from gpuhealth.active.runner import ActiveContext, Run


@dataclass(frozen=True)
class Kind:
    """One kind of evidence `gpuhealth triage` reads: how to spot it, how to read it.

    Text kinds get the file's text, directory kinds (a copied /sys tree) its path. `parse`
    returns top-level sections of a facts document (plus optional `errors`). Kinds are tried
    in `priority` order, lowest first: the generic ones (kernel logs) come last.

    `starts` (MULTILINE) matches the line(s) its output begins with, so that a ticket holding
    several outputs is cut there; None for an output with no line of its own to begin it. A
    `log` is lines that each stand alone (a kernel log): excerpts of it in one ticket are read
    as one log, where two outputs of any other kind are refused like two files of it.
    """

    name: str
    detect: Callable[[Any], bool]
    parse: Callable[[Any], dict[str, Any]]
    directory: bool = False
    priority: int = 50
    starts: re.Pattern[str] | None = None
    log: bool = False


@dataclass(frozen=True)
class ActiveRun:
    """A load test a family runs from the controller at `level` and above; `launch` returns
    the facts section it writes (named `section`) and the raw outputs kept as evidence."""

    section: str
    level: str
    launch: Callable[[ActiveContext], Run]


@dataclass(frozen=True)
class Family:
    """Everything gpuhealth knows about one check family."""

    name: str
    title: str
    checks: CheckSet
    limits: type[FamilyLimits] | None = None
    sections: tuple[str, ...] = ()
    evidence: tuple[Kind, ...] = ()
    markers: dict[str, str] = field(default_factory=dict)
    active: tuple[ActiveRun, ...] = ()
    metrics: Measures | None = None
    schema: tuple[Section, ...] = ()
    needs: tuple[str, ...] = ()
    profile_keys: tuple[str, ...] = ()
    scopes: tuple[Scope, ...] = ()


def declare(package: str, title: str, markers: dict[str, str] | None = None) -> Family:
    """A family from the modules of its folder, by convention: `checks.py` (CHECKS),
    `schema.py` (its facts SECTIONS, the families it NEEDS, the PROFILE_KEYS its node side
    reads; the sections' names come from there), and where they exist `limits.py` (its
    FamilyLimits model), `evidence.py` (KINDS), `active.py` (RUNS) and `metrics.py`
    (MEASURES: what it measures over time) and `scope.py` (SCOPES: the items its per-item
    checks, and other families', are judged over). family.py calls this with what only it
    can say."""

    def part(name: str) -> Any:
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{package}.{name}":
                return None
            raise

    limits = part("limits")
    models = (
        [
            value
            for value in vars(limits).values()
            if isinstance(value, type)
            and issubclass(value, FamilyLimits)
            and value.__module__ == limits.__name__
        ]
        if limits
        else []
    )
    if len(models) > 1:
        raise RuntimeError(f"{package}.limits declares {len(models)} limit models, not one")
    evidence, active, metrics = part("evidence"), part("active"), part("metrics")
    scope = part("scope")
    schema = importlib.import_module(f"{package}.schema")
    return Family(
        name=package.rpartition(".")[2],
        title=title,
        checks=part("checks").CHECKS,
        limits=models[0] if models else None,
        sections=tuple(section.name for section in schema.SECTIONS),
        evidence=tuple(evidence.KINDS) if evidence else (),
        markers=dict(markers or {}),
        active=tuple(active.RUNS) if active else (),
        # The history family's metrics.py reads the others' measures and declares none.
        metrics=getattr(metrics, "MEASURES", None),
        schema=tuple(schema.SECTIONS),
        needs=tuple(schema.NEEDS),
        profile_keys=tuple(schema.PROFILE_KEYS),
        scopes=tuple(scope.SCOPES) if scope else (),
    )


@cache
def families() -> tuple[Family, ...]:
    """Every family, in report order (gpuhealth.families.NAMES)."""
    found = []
    for name in NAMES:
        module = importlib.import_module(f"gpuhealth.families.{name}.family")
        family = module.FAMILY
        if family.name != name or family.checks.family != name:
            raise RuntimeError(f"gpuhealth/families/{name}/family.py declares {family.name!r}")
        found.append(family)
    _check_declarations(found)
    return tuple(found)


def _check_declarations(found: list[Family]) -> None:
    """What the families' schema.py files declare holds together: the families they need
    exist and need no circle, and every profile key a node side reads is a key of the limits
    (the controller resolves and sends those; the node refuses a family an undeclared one)."""
    try:
        needs_order({family.name: family.needs for family in found}, NAMES)
    except ValueError as exc:
        raise RuntimeError(f"gpuhealth/families/*/schema.py: {exc}") from None
    # The run's and the shared keys (gpuhealth.limits), then every family's own.
    known = {
        key
        for value in vars(limits_module).values()
        if isinstance(value, type) and issubclass(value, FamilyLimits)
        for key in value.model_fields
    }
    for family in found:
        known.update(family.limits.model_fields if family.limits else ())
    for name, keys in [("probe", CORE_PROFILE_KEYS)] + [
        (family.name, family.profile_keys) for family in found
    ]:
        unknown = sorted(set(keys) - known)
        if unknown:
            raise RuntimeError(
                f"the {name} probe declares profile keys no limits model has: {unknown}"
            )


@cache
def ranks() -> dict[str, int]:
    """Every report group the families rank, with its rank (0: first in a node's reasons)."""
    found: dict[str, int] = {}
    for family in families():
        for group, rank in family.checks.ranks.items():
            if found.setdefault(group, rank) != rank:
                raise RuntimeError(f"report group {group!r} is ranked {found[group]} and {rank}")
    return found


@cache
def scopes() -> dict[str, Scope]:
    """Every scope of per-item checks the families declare (the GPU slots), by name."""
    found: dict[str, Scope] = {}
    for family in families():
        for declared in family.scopes:
            if found.setdefault(declared.name, declared) is not declared:
                raise RuntimeError(f"scope {declared.name!r} is declared twice ({family.name})")
    return found


def scope(name: str) -> Scope:
    """One scope of per-item checks by name (`gpu`)."""
    return scopes()[name]


@cache
def checks() -> dict[str, Check]:
    """Every check by name, in report order; each in a report group some family ranks, each
    per-item check with its scope (one registered by the scope's name gets it here)."""
    found: dict[str, Check] = {}
    groups = ranks()
    known = scopes()
    for family in families():
        for chk in family.checks.checks:
            if chk.name in found:
                raise RuntimeError(f"check {chk.name!r} is declared twice")
            if chk.group not in groups:
                raise RuntimeError(f"check {chk.name}: no family ranks its group {chk.group!r}")
            if chk.scope != "node" and chk.per is None:
                if chk.scope not in known:
                    raise RuntimeError(f"check {chk.name}: no family declares scope {chk.scope!r}")
                chk = replace(chk, per=known[chk.scope])
            found[chk.name] = chk
    return found


def family(name: str) -> Family:
    """One family by name."""
    for found in families():
        if found.name == name:
            return found
    raise KeyError(f"no family {name!r}")


def check(name: str) -> Check:
    """One check by name."""
    return checks()[name]


def names(scope: str) -> list[str]:
    """Check names of a scope ("node" or "gpu"), in report order."""
    return [c.name for c in checks().values() if c.scope == scope]


def evidence_kinds() -> list[Kind]:
    """Every evidence kind, in the order triage tries them."""
    kinds = [kind for family in families() for kind in family.evidence]
    return sorted(kinds, key=lambda kind: kind.priority)


def markers() -> dict[str, str]:
    """pytest markers the families declare (name -> description)."""
    return {name: text for family in families() for name, text in family.markers.items()}


def active_run(section: str) -> ActiveRun:
    """The load test that writes a facts section (`nccl`, `dcgm`)."""
    for family in families():
        for run in family.active:
            if run.section == section:
                return run
    raise KeyError(f"no family runs a load test for the {section!r} section")


def measures() -> list[tuple[Family, Measures]]:
    """Every family that measures something over time, with what it measures (report order)."""
    return [(family, family.metrics) for family in families() if family.metrics is not None]


@cache
def metrics() -> dict[str, Metric]:
    """Every family's metrics by name (a port metric by its pattern, `ib.*.symbol_error`)."""
    found: dict[str, Metric] = {}
    for family, measured in measures():
        for declared in measured.metrics:
            if declared.name in found:
                raise RuntimeError(f"metric {declared.name!r} is declared twice ({family.name})")
            found[declared.name] = declared
    return found


def metric(name: str) -> Metric:
    """The declaration of a stored value's metric (`ib.mlx5_0.1.symbol_error` matches its
    pattern); KeyError for a value no family declares."""
    return metrics()[pattern(name)]


def sections() -> dict[str, str]:
    """Facts section -> the family whose probe or load test writes it."""
    return {name: family.name for family in families() for name in family.sections}
