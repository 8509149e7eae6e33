"""Facts documents coming in from outside: the probe's answer, saved files, older versions.

A document is validated (pydantic) before any check reads it, so a garbled or hand-edited
file is one clear error for its host, never a crash inside a check. Documents of
schema_version 2 (gpuhealth 0.1) are upgraded, so last month's saved facts can still be
re-judged.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError

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
# Identities the run store keeps in bounded columns (its gpus and nodes tables).
Id64 = Annotated[StrictStr, Field(max_length=64)]


class FactsError(ValueError):
    """A facts document that cannot be used; the message names its source and the problem."""


Number = Signed


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


Count = Annotated[StrictInt, Field(ge=0)]


class LostCall(_Record):
    """The call NVML answered NVML_ERROR_GPU_IS_LOST for a GPU (a GPU record's `lost`)."""

    call: StrictStr
    error: StrictStr


Text = StrictStr | None
Int = StrictInt | None
Flag = StrictBool | None
Value = Number | None
Reasons = dict[str, dict[str, Any]]  # a record's `unavailable`: field -> {kind, detail}


class EccGroup(_Record):
    """Volatile or aggregate ECC counts; a count that is null says why under `unavailable`."""

    corrected: Count | None = None
    uncorrected: Count | None = None
    sram_corrected: Count | None = None
    sram_uncorrected: Count | None = None
    dram_corrected: Count | None = None
    dram_uncorrected: Count | None = None
    unavailable: Reasons = {}


class ClockReasons(_Record):
    """The clock event (throttle) reasons active on a GPU."""

    active: list[StrictStr] | None = None
    mask: Int = None
    unavailable: Reasons = {}


class CounterReads(_Record):
    """One NVLink error counter read twice."""

    first: Count | None = None
    second: Count | None = None
    unavailable: Reasons = {}


class LinkCounters(_Record):
    """One link's error counters (each counter a CounterReads, kept as extra fields)."""

    link: StrictInt
    unavailable: Reasons = {}
    __pydantic_extra__: dict[str, CounterReads | None]


class NvlinkErrors(_Record):
    """A GPU's NVLink error counters, read `window_s` apart."""

    window_s: Value = None
    links: list[LinkCounters] | None = None
    unavailable: Reasons = {}


class GpuFabric(_Record):
    """The GPU's NVLink fabric (clique, cluster, health)."""

    state: Text = None
    status: Text = None
    clique_id: Int = None
    cluster_uuid: Text = None
    health: dict[str, StrictStr | StrictBool | Reasons | None] | None = None
    unavailable: Reasons = {}


class GpuRecord(_Record):
    """The fields of a GPU record the checks compute with, typed; the rest is kept as is."""

    index: StrictInt = Field(ge=0)
    name: Annotated[StrictStr, Field(max_length=128)] | None = None
    uuid: Id64 | None = None
    serial: Id64 | None = None
    pci_bus_id: StrictStr | None = None
    architecture: Text = None
    vbios_version: Id64 | None = None
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
    clock_event_reasons: ClockReasons | None = None
    nvlink: list[dict[str, Any]] | None = None
    nvlink_errors: NvlinkErrors | None = None
    fabric: GpuFabric | None = None
    processes: list[dict[str, Any]] | None = None
    lost: Literal[False] | LostCall | None = None
    unavailable: Reasons = {}


class _Section(_Record):
    """A facts section: its fields, or `{"skipped": why}` where it does not apply."""

    skipped: Text = None
    unavailable: Reasons = {}


class NumaNode(_Record):
    """A NUMA node as the kernel or numactl lists it."""

    node: StrictInt
    cpus: Text = None
    cpu_count: Count | None = None


class Numactl(_Record):
    """`numactl --hardware`: whether it ran and what it printed."""

    available: Flag = None
    rc: Int = None
    error: Text = None
    hardware: _NumactlHardware | None = None


class _NumactlHardware(_Record):
    available_nodes: Count
    nodes: list[NumaNode]
    distances: list[list[Count]] | None = None


class Disk(_Record):
    """A path's filesystem space."""

    path: StrictStr
    total_bytes: Count | None = None
    free_bytes: Count | None = None
    unavailable: Reasons = {}


class System(_Section):
    """The `system` section (CPUs, memory, NUMA, disks, limits, modules, services)."""

    numa_nodes: list[NumaNode] | None = None
    gpu_numa_nodes: dict[str, Int] | None = None
    numactl: Numactl | None = None
    cpus_online: Count | None = None
    cpus_present: Count | None = None
    cpus_usable: Count | None = None
    memory_total_kb: Count | None = None
    memory_available_kb: Count | None = None
    disks: list[Disk] | None = None
    memlock_kb: dict[str, Count | StrictStr | None] | None = None
    kernel_modules: list[StrictStr] | None = None
    services: dict[str, Text] | None = None


class StoragePath(_Record):
    """One configured storage path as the probe found it."""

    path: StrictStr
    ok: Flag = None
    error: Text = None
    timed_out: Flag = None
    elapsed_s: Value = None
    kind: Text = None
    entries: Count | None = None
    bytes_read: Count | None = None
    free_gb: Value = None
    wrote: Flag = None


class Mount(_Record):
    """One network filesystem mount."""

    mountpoint: StrictStr
    device: Text = None
    fstype: Text = None
    ok: Flag = None
    error: Text = None
    timed_out: Flag = None
    elapsed_s: Value = None


class Storage(_Section):
    """The `storage` section."""

    timeout_s: Value = None
    mount_types: list[StrictStr] | None = None
    paths: list[StoragePath] | None = None
    mounts: list[Mount] | None = None
    lustre_health_check: Text = None


class LogGroup(_Record):
    """Kernel-log events of one kind, code and device, counted."""

    kind: StrictStr
    bus_id: Text
    code: Int
    count: Annotated[StrictInt, Field(ge=1)]
    first: Text
    first_uptime_s: Value
    last: Text
    last_uptime_s: Value
    sample: StrictStr


class LogEvent(_Record):
    """One kernel-log event."""

    kind: StrictStr
    time: Text
    uptime_s: Value
    bus_id: Text = None
    code: Int = None
    text: StrictStr


class KernelLog(_Section):
    """The `kernel_log` and `fabric_manager` sections."""

    source: Text = None
    window_h: Value = None
    since: Text = None
    until: Text = None
    until_uptime_s: Value = None
    notes: list[StrictStr] | None = None
    counts: list[LogGroup] | None = None
    events: list[LogEvent] | None = None
    dropped: Count | None = None


class ReclaimGpu(_Record):
    """One GPU's memory before and after the reclaim wait."""

    index: StrictInt
    used_mib: Value = None
    initial_used_mib: Value = None
    total_mib: Value = None
    processes: list[dict[str, Any]] | None = None
    unavailable: Reasons = {}


class Reclaim(_Section):
    """The `memory_reclaim` section."""

    threshold_mib: Value = None
    wait_s: Value = None
    poll_s: Value = None
    waited_s: Value = None
    polls: Count | None = None
    error: Text = None
    gpus: list[ReclaimGpu] | None = None


class GpudState(_Record):
    """One GPUd health state."""

    component: StrictStr
    name: Text = None
    health: Text = None
    reason: Text = None
    error: Text = None
    repair_actions: list[StrictStr] | None = None


class GpudEvent(_Record):
    """One GPUd event."""

    component: StrictStr
    time: Text = None
    name: Text = None
    type: Text = None
    message: Text = None
    unknown: Flag = None


class Gpud(_Section):
    """The `gpud` and `gpud_events` sections."""

    address: Text = None
    healthz: dict[str, Any] | None = None
    states: list[GpudState] | None = None
    events: list[GpudEvent] | None = None


class DcgmResult(_Record):
    """One result of a DCGM diagnostic test."""

    gpus: list[StrictInt]
    entity: Text
    status: Text
    info: list[StrictStr] = []
    warnings: list[StrictStr] = []


class DcgmTest(_Record):
    """One DCGM diagnostic test and its results."""

    name: StrictStr
    summary: Text = None
    results: list[DcgmResult]


class DcgmDiag(_Record):
    """`dcgmi diag -j`, parsed."""

    runtime_error: Text = None
    tests: list[DcgmTest]


class NcclPlace(_Record):
    """One row's out-of-place or in-place result."""

    time_us: Value = None
    algbw_gbps: Value = None
    busbw_gbps: Value = None
    wrong: Count | None = None


class NcclRow(_Record):
    """One row of an nccl-tests table."""

    size: Count
    out_of_place: NcclPlace | None = None
    in_place: NcclPlace | None = None


class NcclRun(_Record):
    """An nccl-tests log, parsed."""

    hosts: list[StrictStr] | None = None
    rows: list[NcclRow]


class ActiveRun(_Section):
    """The `nccl` and `dcgm` sections a load test (or triage) adds."""

    nodes: Int = None
    error: Text = None
    action: Text = None
    advice: Text = None
    run: NcclRun | None = None
    diag: DcgmDiag | None = None


Numactl.model_rebuild()


class Driver(_Record):
    """The `driver` section: whether the driver is loaded and its versions."""

    loaded: Flag = None
    version: Id64 | None = None
    cuda_driver_version: Text = None
    nvml_version: Text = None
    unavailable: Reasons = {}


class Port(_Record):
    """An RDMA device's port: its state and error counters."""

    port: StrictInt
    state: Text = None
    phys_state: Text = None
    rate_gbps: Value = None
    counters: dict[str, Count | None] | None = None
    hw_counters: dict[str, Count | None] | None = None
    unavailable: Reasons = {}


class RdmaDevice(_Record):
    """An RDMA device (EFA, InfiniBand, RoCE) and its ports."""

    name: Annotated[StrictStr, Field(max_length=64)]
    driver: Text = None
    fw_ver: Id64 | None = None
    ports: list[Port] | None = None
    unavailable: Reasons = {}


class Fabric(_Section):
    """The `fabric` section: RDMA devices, the GPUs' PCI placement, fi_info."""

    devices: list[RdmaDevice] | None = None
    fi_info: dict[str, Any] | None = None


class Pci(_Record):
    """The `pci` section: the NVIDIA GPUs on the bus, driver or not."""

    nvidia_gpus: list[StrictStr] | None = None
    device_nodes: Count | None = None
    unavailable: Reasons = {}


class FactsDocument(_Record):
    """The top level of a facts document (docs/facts-schema.md)."""

    schema_version: Literal[3]
    source: StrictStr
    host: dict[str, Any] | None = None
    errors: list[dict[str, Any]] = []
    driver: Driver | None = None
    pci: Pci | None = None
    gpu_count: StrictInt | None = Field(None, ge=0)
    gpus: list[GpuRecord] | None = None
    system: System | None = None
    fabric: Fabric | None = None
    storage: Storage | None = None
    kernel_log: KernelLog | None = None
    fabric_manager: KernelLog | None = None
    memory_reclaim: Reclaim | None = None
    gpud: Gpud | None = None
    gpud_events: Gpud | None = None
    dcgm_health: _Section | None = None
    nccl: ActiveRun | None = None
    dcgm: ActiveRun | None = None


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
        FactsDocument.model_validate(doc)
        LoadResults.model_validate(doc)
    except ValidationError as exc:
        error = exc.errors()[0]
        path = ".".join(str(part) for part in error["loc"])
        got = repr(error.get("input"))[:80]
        raise FactsError(f"{where}: {path}: {error['msg']} (got {got})") from None
    return doc


def _unstorable(doc: dict[str, Any]) -> str | None:
    """The first value no report can store, as `path: why`: an integer beyond 64 bits, NaN
    or an infinity (Python's json reads them), a text over MAX_TEXT, nesting over MAX_DEPTH."""
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
