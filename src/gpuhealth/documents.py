"""Facts documents coming in from outside: the probe's answer, saved files, older versions.

A document is validated (pydantic) before any check reads it, so a garbled or hand-edited
file is one clear error for its host, never a crash inside a check. Documents of
schema_version 2 (gpuhealth 0.1) are upgraded, so last month's saved facts can still be
re-judged.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

from gpuhealth.facts import SCHEMA_VERSION, skipped
from gpuhealth.limits import Signed

# Larger than any real document (8 GPUs with every section: ~100 KB; a kernel log's events
# are capped at 1,000): a file beyond this is not a facts document.
MAX_BYTES = 64 * 1024 * 1024


class FactsError(ValueError):
    """A facts document that cannot be used; the message names its source and the problem."""


Number = Signed
Section = dict[str, Any] | None


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


Count = Annotated[StrictInt, Field(ge=0)]


class EccGroup(_Record):
    """Volatile or aggregate ECC counts; a count that is null says why under `unavailable`."""

    corrected: Count | None = None
    uncorrected: Count | None = None
    unavailable: dict[str, dict[str, Any]] = {}


class LostCall(_Record):
    """The call NVML answered NVML_ERROR_GPU_IS_LOST for a GPU (a GPU record's `lost`)."""

    call: StrictStr
    error: StrictStr


class GpuRecord(_Record):
    """The fields of a GPU record the checks compute with, typed; the rest is kept as is."""

    index: StrictInt = Field(ge=0)
    name: StrictStr | None = None
    uuid: StrictStr | None = None
    serial: StrictStr | None = None
    pci_bus_id: StrictStr | None = None
    persistence_mode: StrictBool | None = None
    memory_total_mib: Number | None = None
    memory_used_mib: Number | None = None
    temperature_c: Number | None = None
    temp_slowdown_c: Number | None = None
    power_draw_w: Number | None = None
    power_limit_w: Number | None = None
    performance_state: Annotated[StrictStr, Field(pattern=r"^P([0-9]|1[0-5])$")] | None = None
    utilization_gpu_pct: Annotated[StrictInt, Field(ge=0, le=100)] | None = None
    recovery_action: StrictInt | None = None
    ecc: dict[str, EccGroup | None] | None = None
    retired_pages: dict[str, Count | StrictBool | None] | None = None
    remapped_rows: dict[str, Count | StrictBool | None] | None = None
    pcie: dict[str, Count | None] | None = None
    nvlink: list[dict[str, Any]] | None = None
    processes: list[dict[str, Any]] | None = None
    lost: Literal[False] | LostCall | None = None
    unavailable: dict[str, dict[str, Any]] = {}


class FactsDocument(_Record):
    """The top level of a facts document (docs/facts-schema.md)."""

    schema_version: Literal[3]
    source: StrictStr
    host: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = []
    driver: Section = None
    pci: Section = None
    gpu_count: StrictInt | None = Field(None, ge=0)
    gpus: list[GpuRecord] | None = None


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
            f"{where}: schema_version {version!r}, this gpuhealth reads 2 and {SCHEMA_VERSION}"
        )
    doc = upgrade(doc)
    try:
        FactsDocument.model_validate(doc)
    except ValidationError as exc:
        error = exc.errors()[0]
        path = ".".join(str(part) for part in error["loc"])
        got = repr(error.get("input"))[:80]
        raise FactsError(f"{where}: {path}: {error['msg']} (got {got})") from None
    return doc


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
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FactsError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from exc
    except (ValueError, RecursionError) as exc:  # 4,300-digit integers, absurd nesting
        raise FactsError(f"{path}: not a usable JSON document ({type(exc).__name__})") from exc
    return validated(doc, str(path))
