"""What the families declare in their schema.py, and what is derived from it: the sections'
names, the validation of saved facts, the probe's order, the profile keys the node reads and
docs/facts-schema.md."""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any

import pytest

from gpuhealth import documents, registry, schema, schema_doc
from gpuhealth.documents import FactsError, validated
from gpuhealth.families import NAMES
from gpuhealth.probe import main as probe_main
from gpuhealth.transport import node_modules
from selftest.facts import healthy_h100

FAMILIES = Path(registry.__file__).resolve().parent / "families"


def declaration(name: str) -> Any:
    return importlib.import_module(f"gpuhealth.families.{name}.schema")


def test_the_sections_names_come_from_the_schema():
    """family.py states no sections: the registry and every probe take them from schema.py,
    and a probe nulls exactly the sections its schema says the probe writes."""
    for family in registry.families():
        assert family.sections == tuple(s.name for s in declaration(family.name).SECTIONS)
        probe = probe_main.family_probe(family.name)
        if probe is not None:
            assert probe.SECTIONS == schema.written(family.schema), family.name
    top = [s.name for s, _ in documents.sections()]
    assert len(top) == len(set(top)), "a top-level key is declared twice"


def _section_reads(path: Path) -> set[str]:
    """Top-level keys a module reads from a facts document: `facts.get("x")`, `facts["x"]`,
    `node.facts.get("x")`, `section(node, "x")`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        target = key = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[-1], ast.Constant):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault"):
                target, key = func.value, node.args[0]
            elif isinstance(func, ast.Name) and func.id == "section" and len(node.args) == 2:
                found.add(str(node.args[1].value))  # type: ignore[attr-defined]
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            target, key = node.value, node.slice
        if target is None or not isinstance(key, ast.Constant) or not isinstance(key.value, str):
            continue
        text = ast.unparse(target)
        if text == "facts" or text.endswith(".facts"):
            found.add(key.value)
    return found


def test_a_family_reads_only_the_sections_of_families_it_declares():
    """Reading another family's section, in its probe (which must then run after that one)
    or its checks, is declared: NEEDS (builds on it), or READS for a section consulted when
    present that may come later (the GPU family's idle check takes the processes still there
    after memory_reclaim's wait)."""
    owner = registry.sections()
    undeclared = []
    for family in registry.families():
        allowed = {family.name, *family.needs}
        reads = set(getattr(declaration(family.name), "READS", ()))
        for path in sorted((FAMILIES / family.name).glob("*.py")):
            for key in _section_reads(path):
                if key in owner and owner[key] not in allowed and key not in reads:
                    undeclared.append(f"{family.name}/{path.name} reads {key} ({owner[key]})")
        for chk in family.checks.checks:
            if owner.get(chk.section, family.name) not in allowed:
                undeclared.append(f"{family.name}: check {chk.name} judges {chk.section}")
    assert undeclared == []


def test_the_scan_sees_a_read_of_another_familys_section(tmp_path):
    """The scan above is not blind: these are the ways checks and probes read a section."""
    module = tmp_path / "m.py"
    module.write_text(
        "a = node.facts.get('gpus')\nb = ctx.facts['source']\nc = section(node, 'imex')\n"
        "d = facts.get('system')\ne = gpu.get('fabric')\n"
    )
    assert _section_reads(module) == {"gpus", "source", "imex", "system"}


def test_families_are_ordered_after_what_they_need():
    assert schema.needs_order({"a": ("c",), "b": (), "c": ("b",)}, ["a", "b", "c"]) == [
        "b",
        "c",
        "a",
    ]
    assert schema.needs_order({"a": (), "b": ()}, ["b", "a"]) == ["b", "a"]
    with pytest.raises(ValueError, match="in a circle: a -> c -> a"):
        schema.needs_order({"a": ("c",), "c": ("a",)}, ["a", "c"])
    with pytest.raises(ValueError, match="a needs 'x', which is not a family"):
        schema.needs_order({"a": ("x",)}, ["a"])


def test_the_registry_refuses_a_circle_and_unknown_profile_keys():
    found = list(registry.families())
    gpu = found[NAMES.index("gpu")]
    circle = [dataclasses.replace(gpu, needs=("reclaim",)) if f is gpu else f for f in found]
    with pytest.raises(RuntimeError, match="circle: gpu -> reclaim -> gpu"):
        registry._check_declarations(circle)
    typo = [
        dataclasses.replace(gpu, profile_keys=("nvml_timeout",)) if f is gpu else f for f in found
    ]
    with pytest.raises(RuntimeError, match=r"the gpu probe declares .*\['nvml_timeout'\]"):
        registry._check_declarations(typo)
    registry._check_declarations(found)


def test_the_probe_runs_each_family_after_those_it_needs(monkeypatch):
    """The node orders the probes by NEEDS, not by the order of NAMES; a family without a
    probe (nccl) drops out of the order."""

    class Declared:
        def __init__(self, needs: tuple[str, ...]) -> None:
            self.NEEDS = needs

    needs = {"storage": ("kernel",), "kernel": ("fabric",), "fabric": ("nccl",), "gpu": ()}
    monkeypatch.setattr(probe_main, "declaration", lambda name: Declared(needs[name]))
    probes = dict.fromkeys(["gpu", "storage", "kernel", "fabric"])
    assert probe_main.probe_order(probes) == ["gpu", "fabric", "kernel", "storage"]
    real = {name: None for name in NAMES if probe_main.family_probe(name) is not None}
    monkeypatch.undo()
    order = probe_main.probe_order(real)
    for name in order:
        assert all(
            order.index(other) < order.index(name)
            for other in declaration(name).NEEDS
            if other in real
        )


def _setting_reads(source: str) -> set[str]:
    """Profile keys a module reads with `ctx.setting("key")`."""
    return {
        str(node.args[0].value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "setting"
        and node.args
        and isinstance(node.args[0], ast.Constant)
    }


def test_the_node_reads_only_the_profile_keys_its_families_declare():
    """Every shipped module's `ctx.setting(...)` is one of its family's PROFILE_KEYS (the
    probe's own modules: CORE_PROFILE_KEYS)."""
    modules, _ = node_modules()
    undeclared = []
    for name, source in modules.items():
        parts = name.split(".")
        if parts[:2] == ["gpuhealth", "families"] and len(parts) > 3:
            declared = set(declaration(parts[2]).PROFILE_KEYS)
        else:
            declared = set(schema.CORE_PROFILE_KEYS)
        undeclared += [f"{name}: {key}" for key in _setting_reads(source) - declared]
    assert undeclared == []
    assert _setting_reads("ctx.setting('fabric')\nctx.setting(k)\n") == {"fabric"}


def test_a_family_reading_an_undeclared_key_fails_on_the_node():
    ctx = probe_main.Context("/", {"fabric": "efa", "xid_window_h": 24}, [], {})
    assert ctx.setting("xid_window_h") == 24  # no family running: the core's reads
    ctx.family, ctx.declared = "fabric", ("fabric",)
    assert ctx.setting("fabric") == "efa"
    with pytest.raises(KeyError, match="fabric family reads the profile key 'xid_window_h'"):
        ctx.setting("xid_window_h")


def _wrong(kind: schema.Type) -> Any:
    """A value of the wrong type for `kind` (a list is no scalar and no record)."""
    return {"x": 1} if kind.kind == "list" else [1]


def _typed_fields(kind: schema.Type, path: tuple) -> list[tuple[tuple, schema.Field]]:
    """(path, field) of the typed fields of a record reached through records only."""
    found = []
    if isinstance(kind, schema.Record):
        for field in kind.fields:
            if field.type.kind != "any":
                found.append(((*path, field.name), field))
                found += _typed_fields(field.type, (*path, field.name))
                if field.type.kind == "list":  # and through a list's first record
                    found += _typed_fields(field.type.of[0], (*path, field.name, 0))
    elif kind.kind == "list":
        found += _typed_fields(kind.of[0], (*path, 0))
    return found


def _present(doc: dict, path: tuple) -> bool:
    """Whether the record holding the field at `path` is in `doc`."""
    value: Any = doc
    for step in path[:-1]:
        if isinstance(value, dict) and isinstance(value.get(step), (dict, list)):
            value = value[step]
        elif isinstance(value, list) and isinstance(step, int) and len(value) > step:
            value = value[step]
        else:
            return False
    return isinstance(value, dict)


@pytest.mark.parametrize("family", [f.name for f in registry.families() if f.schema])
def test_a_malformed_field_of_any_section_is_an_error_naming_it(family):
    """For every declared field of every section (through its records) that a healthy
    document holds: a value of the wrong type is one FactsError naming that field's path."""
    doc = healthy_h100()
    checked = 0
    for section in registry.families()[NAMES.index(family)].schema:
        for path, field in _typed_fields(section.field.type, (section.name,)):
            if not _present(doc, path):
                continue
            bad = copy.deepcopy(doc)
            target = bad
            for step in path[:-1]:
                target = target[step]
            target[path[-1]] = _wrong(field.type)
            where = ".".join(str(step) for step in path)
            with pytest.raises(FactsError, match="^n1.json: " + re.escape(where) + "[.:]"):
                validated(bad, "n1.json")
            checked += 1
    assert checked or family in ("nccl", "dcgm", "history")  # no load test in a probe's facts


def test_the_schema_document_is_generated_from_the_declarations():
    """docs/facts-schema.md is what `python -m gpuhealth.schema_doc` writes: after changing a
    schema.py or a facts.md, run `python -m gpuhealth.schema_doc --write docs/facts-schema.md`."""
    assert schema_doc.DOC.read_text() == schema_doc.render()


def test_the_schema_document_names_every_field_and_its_family():
    text = schema_doc.render()
    assert "| `gpus[].ecc.<key>.uncorrected` | integer (>= 0) | yes |  |" in text
    assert "| `memory_reclaim` | reclaim | probe |" in text
    assert "| `system.memory_total_kb` | integer (>= 0) | yes | KiB |" in text
    assert "builds on `gpu`; its probe reads `expect_idle`" in text


def test_keys_the_checks_index_are_required():
    """Found by the facts mutation campaign: a DCGM result without `info` passed validation
    and ended the run of its node in a KeyError inside dcgm_diag_gpu. Keys the parsers always
    write and the checks index are declared required, so such a document is refused instead."""
    result = {"gpus": [0], "entity": None, "status": "Pass", "warnings": []}
    doc = healthy_h100()
    doc["dcgm"] = {"diag": {"tests": [{"name": "x", "summary": None, "results": [result]}]}}
    with pytest.raises(FactsError, match=r"^n1: dcgm\.diag\.tests\.0\.results\.0\.info: Field"):
        validated(doc, "n1")
    result["info"] = []
    assert validated(doc, "n1")["dcgm"]["diag"]["tests"][0]["results"][0]["info"] == []
