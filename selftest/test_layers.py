"""The layers import downward only: each rule is read from the source (direct imports, with the
line that breaks it) and, where a transitive import could sneak in, proven by importing the
layer in a fresh interpreter and looking at what it loaded.

The flow is inventory -> probe (node) -> facts -> checks -> reports; the neutral modules
(facts, parsing, results, limits) are below everything and import nothing of gpuhealth.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhealth import registry
from gpuhealth.families import NAMES
from gpuhealth.transport import node_modules

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "gpuhealth"


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str) -> list[tuple[int, str, str]]:
    """(line, module, imported name or "") of every run-time import of a module: `if
    TYPE_CHECKING:` blocks are left out (the type checker's only), relative imports resolved."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    typing_only = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for child in ast.walk(stmt)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            for alias in node.names:
                full = f"{module}.{alias.name}"
                # `from package import module` imports the module itself.
                found.append((node.lineno, full if full in MODULES else module, alias.name))
    return found


def matching(*patterns: str) -> list[str]:
    return [m for m in MODULES if any(fnmatch.fnmatchcase(m, p) for p in patterns)]


def breaches(modules: list[str], allowed: tuple[str, ...]) -> list[str]:
    """`module:line imports X` for every gpuhealth import of `modules` not matching `allowed`."""
    return [
        f"{name}:{line} imports {target}"
        for name in modules
        for line, target, _ in imports(name)
        if target.startswith("gpuhealth")
        and not any(fnmatch.fnmatchcase(target, p) for p in allowed)
    ]


NEUTRAL = (
    "gpuhealth",
    "gpuhealth.facts",
    "gpuhealth.parsing",
    "gpuhealth.families",
    "gpuhealth.schema",  # the language the families' schema.py files are written in
)
# The controller's floor (redact: secrets masked in a bundle's text).
BASE = ("gpuhealth.results", "gpuhealth.limits", "gpuhealth.deadline", "gpuhealth.redact")
# What runs on the node. Everything else is the controller's.
NODE = (
    "gpuhealth.probe",
    "gpuhealth.probe.main",
    "gpuhealth.probe.command",
    "gpuhealth.probe.node",
    "gpuhealth.probe.nvml",
    "gpuhealth.probe.state",
    "gpuhealth.families.*.probe",
    "gpuhealth.families.*.parse_*",
    "gpuhealth.families.*.schema",
    "gpuhealth.families.gpu.nvml",
    "gpuhealth.families.fabric.sysfs",
    *(f"gpuhealth.families.{family}" for family in NAMES),
)
# The judging side: checks read facts and limits; they never run anything.
JUDGING = (
    "gpuhealth.checks",
    "gpuhealth.registry",
    "gpuhealth.families.*.checks",
    "gpuhealth.families.*.limits",
    "gpuhealth.families.*.evidence",
    "gpuhealth.families.*.family",
    "gpuhealth.families.*.scope",  # the items a family's checks are judged over (GPU slots)
    "gpuhealth.metrics",  # what a family measures over time, and the rules' vocabulary
    "gpuhealth.families.*.metrics",  # what each family measures, read from its facts
    "gpuhealth.families.fabric.topology",  # GPU-to-NIC levels from recorded PCI positions
    "gpuhealth.families.gpu.compare",  # the probe's two GPU paths side by side (bundles)
    "gpuhealth.schema_doc",  # docs/facts-schema.md, from the families' declarations
)
# Limits composition, profiles with platform matching, inventory: read by judging and running.
CONFIG = ("gpuhealth.config", "gpuhealth.config.*")
RUNNING = (  # what probes, launches, schedules and reports
    "gpuhealth.history*",  # the run store and its migrations
    "gpuhealth.probe*",
    "gpuhealth.families.*.probe",
    "gpuhealth.families.gpu.nvml",
    "gpuhealth.transport",
    "gpuhealth.plugin",
    "gpuhealth.active*",
    "gpuhealth.families.*.active",
    "gpuhealth.families.nccl.fleet",
    "gpuhealth.targets",
    "gpuhealth.report",
    "gpuhealth.reporter",
    "gpuhealth.allure_results",
    "gpuhealth.allure_writer",
    "gpuhealth.junit_results",
    "gpuhealth.sinks*",  # the run's outputs (verdicts.json, JUnit, Allure, history...)
    "gpuhealth.cli",
    "gpuhealth.local",  # this machine judged in-process (node-check, serve)
    "gpuhealth.api",  # the same, for a training script (check, quick_check, Watcher)
    "gpuhealth.bundle",  # a node's raw outputs, facts and verdict in one archive, read back
    "gpuhealth.shards",  # a fleet split across CI jobs (--shard K/N), its reports merged
    "gpuhealth.jobs",  # the shards as N processes on one machine (gpuhealth run --jobs N)
    "gpuhealth.integrations*",  # acting on verdicts: Slurm, Kubernetes, Prometheus, serve
)


def test_the_rules_cover_every_module():
    """A new module has to be placed in a layer by these rules, not slip between them."""
    placed = set(matching(*NEUTRAL, *BASE, *NODE, *JUDGING, *RUNNING, *CONFIG)) | {
        "gpuhealth.documents",
        "gpuhealth.evidence",
    }
    assert sorted(set(MODULES) - placed) == []


def test_neutral_modules_import_nothing_of_gpuhealth():
    assert breaches([m for m in MODULES if m in NEUTRAL], ()) == []


def test_the_controller_floor_imports_only_the_neutral_modules():
    assert breaches([m for m in MODULES if m in BASE], NEUTRAL) == []


def test_parsers_import_only_the_neutral_layer_and_their_own_family():
    found = []
    for name in matching("gpuhealth.families.*.parse_*"):
        family = name.rsplit(".", 1)[0]
        found += breaches([name], (*NEUTRAL, f"{family}.parse_*", f"{family}.schema"))
    assert found == []


def test_node_side_imports_only_the_node_side():
    assert breaches(matching(*NODE), (*NEUTRAL, *NODE)) == []


def test_the_shipped_probe_is_exactly_the_node_side():
    """What transport ships is found by following imports; it must be node modules only."""
    shipped, _ = node_modules()
    assert [m for m in shipped if m not in matching(*NEUTRAL, *NODE)] == []
    assert [m for m in shipped if m in BASE] == []


def test_judging_never_imports_what_runs():
    """Checks, limits and triage's evidence readers take facts and give results; the node-side
    parsers they may use (evidence.py reads saved tool output with them) are pure functions."""
    pure = ("gpuhealth.families.*.parse_*", "gpuhealth.families.*.schema", "*.fabric.sysfs")
    allowed = (*NEUTRAL, *BASE, *JUDGING, *CONFIG, *pure)
    assert breaches(matching(*JUDGING), allowed) == []


def test_only_the_fleet_runner_uses_the_plugin_and_only_its_public_names():
    users = {
        (name, imported)
        for name in MODULES
        for _, target, imported in imports(name)
        if target == "gpuhealth.plugin"
    }
    assert {name for name, _ in users} <= {"gpuhealth.families.nccl.fleet"}
    assert [imported for _, imported in users if imported.startswith("_")] == []


def loaded_by(*modules: str) -> set[str]:
    """The modules a fresh interpreter holds after importing `modules` (site-packages on)."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {list(modules)!r}:\n"
        "    if m == '-registry':\n"
        "        importlib.import_module('gpuhealth.registry').families()\n"
        "    elif m:\n"
        "        importlib.import_module(m)\n"
        "print(json.dumps(sorted(sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(SRC)},
    ).stdout
    return set(json.loads(out))


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        (NEUTRAL, ("pydantic", "yaml", "gpuhealth.config", "gpuhealth.probe", "gpuhealth.checks")),
        (BASE, ("yaml", "gpuhealth.config", "gpuhealth.probe", "gpuhealth.checks")),
        (NODE, ("pydantic", "yaml", "gpuhealth.config", "gpuhealth.checks", "gpuhealth.results")),
        (JUDGING, ("pytest", "testinfra", "gpuhealth.probe", "gpuhealth.transport")),
    ],
    ids=["neutral", "base", "node", "judging"],
)
def test_importing_a_layer_loads_nothing_above_it(layer, forbidden):
    """Transitively too: a module-level import two steps away shows up here. The registry
    imports the families' modules on demand, so judging is loaded through it."""
    loaded = loaded_by(*matching(*layer), "-registry" if layer is JUDGING else "")
    assert sorted(m for m in loaded for f in forbidden if m == f or m.startswith(f + ".")) == []


def family_of(module: str) -> str | None:
    """The family a module belongs to (`gpuhealth.families.gpu.nvml` -> gpu), None for none."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[:2] == ["gpuhealth", "families"] else None


def test_families_import_only_the_families_they_need():
    """A family builds on another only where its schema.py says it needs it (`NEEDS`): the probe
    orders the families by those needs, and no other dependency between them hides in code."""
    needs = {family.name: set(family.needs) for family in registry.families()}
    found = []
    for name in matching("gpuhealth.families.*.*"):
        mine = family_of(name)
        for line, target, _ in imports(name):
            theirs = family_of(target) or (
                target.rpartition(".")[2]
                if target.rpartition(".")[0] == "gpuhealth.families"
                else None
            )
            if theirs is not None and theirs != mine and theirs not in needs[mine]:
                found.append(f"{name}:{line} imports {target} ({mine} does not need {theirs})")
    assert found == []


# What iterates the families' declarations (gpuhealth.registry) and so names none of them: the
# run store and the regression rules (the history family judges every family's metrics), the
# outputs (the sinks, the Prometheus textfile and the other integrations, the verdicts).
FAMILY_BLIND = (
    "gpuhealth.history*",
    "gpuhealth.families.history.*",
    "gpuhealth.sinks*",
    "gpuhealth.integrations*",
    "gpuhealth.report*",
)


def test_history_and_exporters_name_no_family():
    """No import of a family other than history's own, and no family's name as a string: what
    a family measures and exports is declared in its own folder (its metrics.py)."""
    families = set(NAMES) - {"history"}
    found = []
    for name in matching(*FAMILY_BLIND):
        tree = ast.parse(MODULES[name].read_text())
        for line, target, _ in imports(name):
            if family_of(target) in families or target.rpartition(".")[2] in families:
                found.append(f"{name}:{line} imports {target}")
        for node in ast.walk(tree):
            # "gpu" is also the scope of a per-GPU check or value and a series' label.
            if isinstance(node, ast.Constant) and node.value in families - {"gpu"}:
                found.append(f"{name}:{node.lineno} names the {node.value} family")
    assert found == []


def test_every_family_measuring_something_declares_it_in_its_own_folder():
    """The registry finds each family's MEASURES in its metrics.py; the metrics are found by
    the name they are stored under, a port's by its pattern."""
    measuring = {family.name for family, _ in registry.measures()}
    assert {"gpu", "fabric", "kernel", "nccl", "dcgm"} <= measuring
    for family, measures in registry.measures():
        assert MODULES.get(f"gpuhealth.families.{family.name}.metrics"), family.name
        for declared in measures.metrics:
            assert registry.metric(declared.name) is declared
    assert registry.metric("ib.mlx5_0.1.symbol_error").name == "ib.*.symbol_error"


# The generic core: registering and judging checks, and what a check says. Per-item scopes
# (the GPU slots), a slot's missing record and a family's additions to a result belong to the
# families that own them (families/gpu/scope.py, results.Detail subclasses).
GENERIC_CORE = ("gpuhealth.checks", "gpuhealth.results")
# Facts keys and result fields of particular families, beyond the sections they declare.
FAMILY_KEYS = {"pci", "nvidia_gpus", "gpu_count", "regressions", "notes"}
# What the core's words may still say: `source` (the GPU family's section) is also where
# triage marks a document built from a saved log (NodeView.from_evidence).
CORE_KEYS = {"source"}
FAMILY_NAMES = {"no_nvidia", "expected_gpus", "gpu_slots", "gpu_label", "regressions", "notes"}


def test_the_core_names_no_family_and_no_family_facts():
    """checks.py and results.py import no family, say no family's name or facts key, and
    have no GPU-specific helpers (`no_nvidia`, `gpu_label`...) or history fields."""
    keys = (set(registry.sections()) | FAMILY_KEYS | set(NAMES)) - CORE_KEYS
    found = []
    for name in GENERIC_CORE:
        found += [f"{name}:{line} imports {t}" for line, t, _ in imports(name) if family_of(t)]
        for node in ast.walk(ast.parse(MODULES[name].read_text())):
            if isinstance(node, ast.Constant) and node.value in keys:
                found.append(f"{name}:{node.lineno} says {node.value!r}")
            named = getattr(node, "attr", None) or getattr(node, "id", None)
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                named = node.name
            if named in FAMILY_NAMES:
                found.append(f"{name}:{node.lineno} names {named}")
    assert found == []
