"""Facts documents coming in from outside: the probe's answer, saved files, older versions.

A document is validated before any check reads it, so a garbled or hand-edited file is one
clear error for its host naming the field, never a crash inside a check. The pydantic models it
is validated with are built from what the families declare in their schema.py files (and the
document's own keys, gpuhealth.schema.CORE_SECTIONS): a new family's section is validated as
soon as it declares it. Documents of schema_version 2 (gpuhealth 0.1) are upgraded, so last
month's saved facts can still be re-judged.
"""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from gpuhealth import schema
from gpuhealth.facts import SCHEMA_VERSION, skipped
from gpuhealth.limits import Signed

# Larger than any real document (8 GPUs with every section: ~100 KB; a kernel log's events
# are capped at 1,000): a file beyond this is not a facts document.
MAX_BYTES = 64 * 1024 * 1024
# Beyond what any report can hold (the run store's INTEGER/BIGINT and REAL, JSON, XML): such a
# value in a document is damage, refused before it reaches a check or a sink.
INT64 = 2**63
MAX_TEXT = 64 * 1024  # a kernel-log sample, an error text: far shorter
MAX_DEPTH = 32  # a real document nests 8 deep (gpus.N.nvlink_errors.links.N.replay.unavailable)


class FactsError(ValueError):
    """A facts document that cannot be used; the message names its source and the problem."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


def _annotation(kind: schema.Type) -> Any:
    """The pydantic type of a declared type (strict: no "75" for 75, no 1 for true)."""
    if isinstance(kind, schema.Record):
        return _model(kind)
    if kind.kind == "list":
        return list[_annotation(kind.of[0])]  # type: ignore[misc]
    if kind.kind == "map":
        return dict[str, _annotation(kind.of[0])]  # type: ignore[misc]
    if kind.kind == "oneof":
        return Union[tuple(_annotation(t) for t in kind.of)]
    if kind.kind == "literal":
        return None if kind.value is None else Literal[kind.value]
    base = _SCALARS[kind.kind]
    bounds = {
        name: getattr(kind, name)
        for name in ("ge", "le", "max_length", "pattern")
        if getattr(kind, name) is not None
    }
    return Annotated[base, Field(**bounds)] if bounds else base


_SCALARS: dict[str, Any] = {
    "text": StrictStr,
    "integer": StrictInt,
    "number": Signed,
    "boolean": StrictBool,
    "any": Any,
}


def _fields(fields: tuple[schema.Field, ...]) -> dict[str, Any]:
    """Class attributes of a pydantic model: annotations and defaults of the declared fields.
    A field that may be absent defaults to None (defaults are not validated: a non-nullable
    field may be left out, never null)."""
    annotations: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    for declared in fields:
        kind = _annotation(declared.type)
        annotations[declared.name] = Optional[kind] if declared.nullable else kind
        if not declared.required:
            defaults[declared.name] = None
    return {"__annotations__": annotations, **defaults}


@cache
def _model(record: schema.Record) -> type[BaseModel]:
    """The pydantic model of a declared record (unknown keys kept, typed as `extra` says)."""
    body = _fields(record.fields)
    if record.extra is not None:
        body["__annotations__"]["__pydantic_extra__"] = dict[str, _annotation(record.extra)]  # type: ignore[misc]
    body["__doc__"] = record.meaning
    return type(record.name, (_Record,), body)


def sections() -> tuple[tuple[schema.Section, str], ...]:
    """Every top-level key of a facts document with the family that declares it: the probe's
    own (gpuhealth.schema.CORE_SECTIONS, family ""), then the families' (their schema.py)."""
    from gpuhealth.registry import families  # the registry imports the families' checks

    found = [(section, "") for section in schema.CORE_SECTIONS]
    found += [(section, family.name) for family in families() for section in family.schema]
    return tuple(found)


@cache
def document_model() -> type[BaseModel]:
    """The pydantic model of a whole facts document, built from the declarations."""
    body = _fields(tuple(section.field for section, _ in sections()))
    body["__doc__"] = "The top level of a facts document (docs/facts-schema.md)."
    return type("FactsDocument", (_Record,), body)


class Launch(_Record):
    """One load-test launch as a node ran it for the fleet recipes (gpuhealth.active.collect):
    its raw outputs, kept in its section's `launches` as evidence."""

    name: StrictStr
    command: StrictStr
    rc: StrictInt | None
    stdout: StrictStr
    stderr: StrictStr
    duration_s: Signed
    error: StrictStr | None
    timed_out: StrictBool


class _Launches(_Record):
    launches: list[Launch] | None = None


class LoadResults(_Record):
    """The load-test parts of a document collected on the nodes: `load_level` (the level the
    load tests were asked for) and the raw outputs (`launches`) of each load-test section."""

    load_level: Literal["quick", "standard", "full"] | None = None
    nccl: _Launches | None = None
    dcgm: _Launches | None = None


def upgrade(doc: dict[str, Any]) -> dict[str, Any]:
    """A schema_version 2 document in today's shape (sections that did not apply said so in
    three ways; storage timeouts were only spelled out in the error text)."""
    if doc.get("schema_version") != 2:
        return doc
    doc = dict(doc, schema_version=3)
    for name, what in (("dcgm_health", "DCGM"), ("gpud", "GPUd"), ("gpud_events", "GPUd")):
        section = doc.get(name)
        if isinstance(section, dict) and section.get("expected") is False:
            flag = "dcgm_installed" if what == "DCGM" else "gpud_installed"
            doc[name] = skipped(f"{what} not expected on this host ({flag}: false)")
    for name in ("nccl", "dcgm", "memory_reclaim"):
        section = doc.get(name)
        if isinstance(section, dict) and (section.get("skip") or section.get("skipped")):
            doc[name] = skipped(str(section.get("skip") or section.get("skipped")))
    storage = doc.get("storage")
    if isinstance(storage, dict):
        for record in (storage.get("paths") or []) + (storage.get("mounts") or []):
            if isinstance(record, dict) and str(record.get("error") or "").startswith(
                "timed out after"
            ):
                record["timed_out"] = True
    return doc


def validated(doc: Any, where: str) -> dict[str, Any]:
    """The document, upgraded and checked; FactsError names `where` and the first problem."""
    if not isinstance(doc, dict):
        raise FactsError(f"{where}: a facts document must be a JSON object")
    version = doc.get("schema_version")
    if version not in (2, SCHEMA_VERSION):
        raise FactsError(
            f"{where}: schema_version {repr(version)[:40]}, this gpuhealth reads 2 and "
            f"{SCHEMA_VERSION}"
        )
    doc = upgrade(doc)
    damage = _unstorable(doc)
    if damage:
        raise FactsError(f"{where}: {damage}")
    try:
        document_model().model_validate(doc)
        LoadResults.model_validate(doc)
    except ValidationError as exc:
        error = exc.errors()[0]
        path = ".".join(str(part) for part in error["loc"])
        got = repr(error.get("input"))[:80]
        raise FactsError(f"{where}: {path}: {error['msg']} (got {got})") from None
    return doc


def _unstorable(doc: dict[str, Any]) -> str | None:
    """The first value no report can store, as `path: why`: an integer beyond 64 bits, NaN
    or an infinity (Python's json reads them), a text over MAX_TEXT, nesting over MAX_DEPTH.
    Every document is screened without paths (a tenth of the cost: a fleet's documents are
    walked once each); only one that may hold such a value is walked again for its path."""
    return None if _storable(doc) else _first_unstorable(doc)


def _storable(doc: dict[str, Any]) -> bool:
    """Whether every value of the document is one any report can store, level by level with
    no path kept. False for anything _first_unstorable must look at (any other type too)."""
    level: list[Any] = [doc]
    depth = 0
    while level:
        if depth >= MAX_DEPTH:
            return False
        deeper = []
        for container in level:
            for value in container.values() if type(container) is dict else container:
                kind = type(value)
                if kind is str:
                    if len(value) > MAX_TEXT:
                        return False
                elif kind is int:
                    if not -INT64 <= value < INT64:
                        return False
                elif kind is dict or kind is list:
                    deeper.append(value)
                elif kind is float:
                    if not math.isfinite(value):
                        return False
                elif value is not None and kind is not bool:
                    return False
        level = deeper
        depth += 1
    return True


def _first_unstorable(doc: dict[str, Any]) -> str | None:
    """_unstorable's walk with the path of every value (depth first, last key first)."""
    stack: list[tuple[tuple[Any, ...], Any]] = [((), doc)]
    while stack:
        path, value = stack.pop()
        where = ".".join(str(part) for part in path) or "the document"
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int) and not -INT64 <= value < INT64:
            return f"{where}: {str(value)[:24]}... is beyond a 64-bit integer"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{where}: {value} is not a number"
        if isinstance(value, str) and len(value) > MAX_TEXT:
            return f"{where}: a text of {len(value)} characters (at most {MAX_TEXT})"
        if isinstance(value, (dict, list)) and len(path) >= MAX_DEPTH:
            return f"{where}: nested deeper than {MAX_DEPTH} levels"
        if isinstance(value, dict):
            stack += [((*path, key), item) for key, item in value.items()]
        elif isinstance(value, list):
            stack += [((*path, index), item) for index, item in enumerate(value)]
    return None


def read_bounded(path: Path, limit: int) -> str:
    """A regular file's text. Anything else raises OSError (a FIFO would block the run, a
    device might never end), and so does a file over `limit` bytes."""
    if not path.is_file():
        raise OSError(f"not a regular file{'' if path.exists() else ' (it does not exist)'}")
    with path.open("rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"larger than {limit >> 20} MiB")
    return data.decode("utf-8", errors="replace")


def load_facts(path: Path) -> dict[str, Any]:
    """Read and validate a saved facts document."""
    try:
        text = read_bounded(path, MAX_BYTES)
    except OSError as exc:
        raise FactsError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    return facts_from_text(text, str(path))


def facts_from_text(text: str, where: str) -> dict[str, Any]:
    """A saved facts document's text, parsed and validated; FactsError names `where`."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FactsError(f"{where}: not JSON (line {exc.lineno}: {exc.msg})") from exc
    except (ValueError, RecursionError) as exc:  # 4,300-digit integers, absurd nesting
        raise FactsError(f"{where}: not a usable JSON document ({type(exc).__name__})") from exc
    return validated(doc, where)
