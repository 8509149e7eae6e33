"""What a run measures that matters over time, read from a facts document, and the rules that
compare it with the past.

One table (METRICS) says for every metric where it comes from, which rule judges it and which
profile key holds the rule's limit. Values are numbers; what cannot be read is left out
(unknown), never stored as zero.

Rules:
- growth: a counter that must not grow; compared with the last run that measured the same GPU
  (by serial) or port. A lower value of a counter that resets (PCIe replays, IB counters, on a
  reboot or driver reload) means it was reset: its growth is then the value itself.
- rate: a counter that may grow slowly; growth since the last run per day, a gap shorter than a
  day counted as a day (a run repeated in the morning has a day's allowance, not a minute's).
- drop / rise / rise_pct: a measurement against two baselines of the good runs (node PASS or
  WARN, and no regression reported for the night) since the GPU's, driver's and firmware's
  identity last changed or the node (or GPU) was pinned: the rolling one, the median of the
  last good runs, and the reference, the median of the first ones, which stays put so that a
  slow decay cannot drag it down; and a trend (`trend_key`): a steady slope over the last good
  runs (checks.trend says how it is measured).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from gpuhealth.families.kernel.checks import xid_table
from gpuhealth.families.nccl.checks import best_busbw
from gpuhealth.results import Status

Values = dict[str, float]


@dataclass(frozen=True)
class Metric:
    """One measured value and how history judges it."""

    name: str  # for IB ports a pattern: ib.<device>.<port>.<counter>
    what: str
    rule: str  # growth | rate | drop | rise | rise_pct | new_events
    key: str  # the profile key with the rule's limit
    unit: str = ""
    resets: bool = False  # a since-boot counter: lower than last time means reset
    saturates: int | None = None  # a counter that sticks at this value (IB PortCounters)
    advice: str = ""
    trend_key: str = ""  # drop / rise / rise_pct: the profile key of the trend rule's slope


_MEMORY = (
    "the GPU's memory is wearing: read the ecc_errors and row_remapping checks, reset the GPU "
    "to apply pending remaps, and RMA it if the count keeps growing"
)
_IB_CABLE = "reseat or replace the port's cable or transceiver and check its switch port"


_IB_RATE = "regression_ib_errors_per_day"
# Per GPU, the sum over its active links of each NVLink error counter: the legacy ones
# (nvmlNvLinkErrorCounter_t), or on Blackwell the NVLink5 field values (schema.
# NVLINK_FIELD_COUNTERS; successful recoveries are left out: link_recovery counts every
# recovery, recovery_failed the failed ones). They restart at a driver reload or GPU reset. The
# probe's own window catches a link erroring during the run (nvlink_errors check); this catches
# one that erred between runs.
NVLINK_COUNTERS = (
    ("replay", "NVLink replays"),
    ("recovery", "NVLink link recoveries"),
    ("crc_flit", "NVLink flow-control CRC errors"),
    ("crc_data", "NVLink data CRC errors"),
    ("ecc_data", "NVLink data ECC errors"),
    ("malformed_packet", "NVLink malformed packets received"),
    ("buffer_overrun", "NVLink receive buffer overruns"),
    ("rcv", "NVLink packets received with errors"),
    ("rcv_remote", "NVLink packets received with a remote error marker"),
    ("rcv_general", "NVLink packets received with a header mismatch"),
    ("local_link_integrity", "NVLink local link integrity errors"),
    ("recovery_failed", "NVLink failed link recoveries (link declared down)"),
    ("link_recovery", "NVLink link recovery events"),
    ("effective", "NVLink effective errors"),
    ("symbol", "NVLink symbol errors"),
)
METRICS = (
    # per GPU (section `gpus`)
    Metric(
        "ecc_uncorrected_aggregate",
        "uncorrectable ECC errors",
        "growth",
        "regression_ecc_uncorrected_growth",
        advice=_MEMORY,
    ),
    Metric(
        "remapped_rows_uncorrectable",
        "rows remapped for uncorrectable errors",
        "growth",
        "regression_remapped_rows_growth",
        advice=_MEMORY,
    ),
    Metric(
        "remapped_rows_correctable",
        "rows remapped for correctable errors",
        "growth",
        "regression_remapped_rows_growth",
        advice=_MEMORY,
    ),
    Metric(
        "retired_pages",
        "retired pages",
        "growth",
        "regression_retired_pages_growth",
        advice=_MEMORY,
    ),
    Metric(
        "ecc_corrected_aggregate",
        "correctable ECC errors",
        "rate",
        "regression_ecc_corrected_per_day",
        advice="a rising rate of correctable errors often comes before uncorrectable ones: "
        "watch the trend (gpuhealth history --metric ecc_corrected_aggregate) and run "
        "`dcgmi diag -r 3`",
    ),
    Metric(
        "pcie_replays",
        "PCIe replays",
        "rate",
        "regression_pcie_replays_per_day",
        resets=True,
        advice="check the GPU's PCIe path (riser, slot, retimer: `nvidia-smi -q -d PCIE`, "
        "`lspci -vv`) and reseat the GPU if replays keep growing",
    ),
    Metric(
        "idle_temperature_c",
        "idle temperature",
        "rise",
        "regression_idle_temp_rise_c",
        "C",
        trend_key="regression_idle_temp_trend_c_per_run",
        advice="check the node's cooling (fans, airflow, liquid loop) and the GPU's thermal "
        "interface",
    ),
    Metric(
        "idle_power_w",
        "idle power draw",
        "rise_pct",
        "regression_idle_power_rise_pct",
        "W",
        trend_key="regression_idle_power_trend_pct_per_run",
        advice="an idle GPU drawing more than it did: look for stray processes or clocks "
        "pinned high, then have the GPU's power delivery inspected",
    ),
    *(
        Metric(
            f"nvlink_{counter}_errors",
            what,
            "rate",
            "regression_nvlink_errors_per_day",
            resets=True,
            advice="read `nvidia-smi nvlink -e` for the GPU's links, reseat or replace the "
            "cable, cartridge or tray of the link whose count grows, then reset the GPU",
        )
        for counter, what in NVLINK_COUNTERS
    ),
    # per GPU, from the DCGM diagnostic (--level standard)
    Metric(
        "dcgm_diag_failures",
        "failed DCGM diagnostic results",
        "growth",
        "regression_dcgm_failures_growth",
        advice="run `dcgmi diag -r 3` on the GPU; reset it, and RMA it if it fails again",
    ),
    # per node
    Metric(
        "xid_fatal_events",
        "XID events of kinds that fail a node",
        "new_events",
        "regression_fatal_xid_growth",
        advice="read the new XIDs (xid_errors and kernel_log checks) and follow their advice",
    ),
    Metric(
        "nccl_busbw_gbps",
        "single-node all_reduce busbw",
        "drop",
        "regression_busbw_drop_pct",
        "GB/s",
        trend_key="regression_busbw_trend_pct_per_run",
        advice="compare with the node's earlier runs (gpuhealth history HOST --metric "
        "nccl_busbw_gbps); check NVLink, clocks and throttling; drain the node if it stays "
        "low",
    ),
    Metric(
        "ib.*.link_downed",
        "link_downed events",
        "growth",
        "regression_ib_link_downed_growth",
        resets=True,
        saturates=255,
        advice=_IB_CABLE,
    ),
    *(
        Metric(
            f"ib.*.{counter}", what, "rate", _IB_RATE, resets=True, saturates=top, advice=_IB_CABLE
        )
        for counter, what, top in (
            ("symbol_error", "symbol errors", 65535),
            ("port_rcv_errors", "receive errors", 65535),
            ("link_error_recovery", "link error recoveries", 255),
        )
    ),
)
_BY_NAME = {m.name: m for m in METRICS}
IB_COUNTERS = tuple(m.name.rpartition(".")[2] for m in METRICS if m.name.startswith("ib."))
# Not a judged metric: where the last run's kernel log reading ended, so the next run can
# tell new XID events from ones already seen.
KERNEL_LOG_UNTIL = "kernel_log_until"
# Not judged over time either: what a GPU reads now, busy or idle, for exporters (history
# compares only the idle readings of gpu_values, which a busy GPU does not have).
READINGS = ("temperature_c", "power_draw_w")


def metric(name: str) -> Metric:
    """The table entry of a stored metric name (`ib.mlx5_0.1.symbol_error` matches its pattern)."""
    if name.startswith("ib."):
        return _BY_NAME["ib.*." + name.rpartition(".")[2]]
    return _BY_NAME[name]


def _number(value: Any) -> float | None:
    """A measured number; booleans, negatives and non-numbers are unknown."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return float(value)


def _sum(record: Any, keys: tuple[str, ...]) -> float | None:
    """The sum of record[keys], unknown when any part is."""
    if not isinstance(record, dict):
        return None
    parts = [_number(record.get(key)) for key in keys]
    return None if None in parts else float(sum(p for p in parts if p is not None))


def gpu_key(gpu: dict[str, Any]) -> str | None:
    """What identifies a GPU across runs: its serial, else its UUID (never its index)."""
    for key in ("serial", "uuid"):
        value = gpu.get(key)
        if isinstance(value, str) and value.strip() and value.strip() not in ("N/A", "0"):
            return value.strip()
    return None


def _nvlink_errors(record: Any) -> dict[str, float | None]:
    """Each NVLink error counter summed over the GPU's active links, as last read; unknown
    when any link's value of it is (a partial sum would look like a reset next time)."""
    links = record.get("links") if isinstance(record, dict) else None
    if not isinstance(links, list) or not links:
        return {}
    found: dict[str, float | None] = {}
    for counter, _ in NVLINK_COUNTERS:
        values: list[float | None] = []
        for entry in links:
            reads = entry.get(counter) if isinstance(entry, dict) else None
            if not isinstance(reads, dict):
                values.append(None)
                continue
            second = _number(reads.get("second"))
            values.append(second if second is not None else _number(reads.get("first")))
        known = [value for value in values if value is not None]
        found[f"nvlink_{counter}_errors"] = sum(known) if len(known) == len(values) else None
    return found


def gpu_values(gpu: dict[str, Any], node_in_use: bool = False) -> Values:
    """A GPU record's error counters, and its temperature and power when it is idle on a node
    judged idle: a node in use gives no idle readings (its jobs heat the GPUs they leave
    free), so they never enter an idle baseline."""
    found: dict[str, float | None] = {}
    ecc = gpu.get("ecc") if isinstance(gpu.get("ecc"), dict) else {}
    aggregate = ecc.get("aggregate") if isinstance(ecc, dict) else None
    if isinstance(aggregate, dict):
        found["ecc_uncorrected_aggregate"] = _number(aggregate.get("uncorrected"))
        found["ecc_corrected_aggregate"] = _number(aggregate.get("corrected"))
    rows = gpu.get("remapped_rows")
    if isinstance(rows, dict):
        found["remapped_rows_uncorrectable"] = _number(rows.get("uncorrectable"))
        found["remapped_rows_correctable"] = _number(rows.get("correctable"))
    found["retired_pages"] = _sum(gpu.get("retired_pages"), ("single_bit", "double_bit"))
    pcie = gpu.get("pcie")
    if isinstance(pcie, dict):
        found["pcie_replays"] = _number(pcie.get("replay_count"))
    found.update(_nvlink_errors(gpu.get("nvlink_errors")))
    processes = gpu.get("processes")
    idle = gpu.get("utilization_gpu_pct") == 0 and isinstance(processes, list) and not processes
    if idle and not node_in_use:
        found["idle_temperature_c"] = _number(gpu.get("temperature_c"))
        found["idle_power_w"] = _number(gpu.get("power_draw_w"))
    return {name: value for name, value in found.items() if value is not None}


def gpu_readings(gpu: dict[str, Any]) -> Values:
    """A GPU record's temperature and power draw as read, busy or idle (READINGS)."""
    found = {name: _number(gpu.get(name)) for name in READINGS}
    return {name: value for name, value in found.items() if value is not None}


def _epoch(text: Any) -> float | None:
    """An event time (`2024-11-15T12:02:03.47Z`; naive times are UTC) as epoch seconds."""
    if not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def collected_at(facts: dict[str, Any]) -> float | None:
    """When the facts were collected (their `collected_at`, epoch seconds): the time a host's
    night is dated by. None when they do not say (pasted evidence, older documents)."""
    return _epoch(facts.get("collected_at"))


def fatal_xid_groups(facts: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The kernel log's XID groups whose XID fails a node (None: the log was not read)."""
    log = facts.get("kernel_log")
    counts = log.get("counts") if isinstance(log, dict) else None
    if not isinstance(counts, list):
        return None
    table = xid_table()
    return [
        group
        for group in counts
        if isinstance(group, dict)
        and group.get("kind") == "xid"
        and group.get("code") in table
        and table[group["code"]][0] is Status.FAIL
    ]


def new_fatal_xids(facts: dict[str, Any], since: float) -> tuple[int, list[str], bool]:
    """Fatal XID events after `since` (epoch): (at least how many, descriptions, whether
    some could not be placed in time). A group that started before `since` and ended after it
    counts the events of its sample after `since` (at least one)."""
    count, seen, undated = 0, [], False
    for group in fatal_xid_groups(facts) or []:
        first, last = _epoch(group.get("first")), _epoch(group.get("last"))
        where = f"XID {group['code']} on {group.get('bus_id') or 'an unknown bus'}"
        if last is None:
            undated = True
            seen.append(f"{where} (no time)")
            continue
        if last <= since:
            continue
        if first is not None and first > since:
            count += int(group.get("count") or 1)
        else:
            events = [
                e
                for e in (facts.get("kernel_log") or {}).get("events") or []
                if isinstance(e, dict)
                and e.get("kind") == "xid"
                and e.get("code") == group["code"]
                and e.get("bus_id") == group.get("bus_id")
                and (_epoch(e.get("time")) or 0) > since
            ]
            count += max(1, len(events))
        seen.append(f"{where} at {group.get('last')}")
    return count, seen, undated


def node_values(facts: dict[str, Any]) -> Values:
    """A node's passive measurements: fatal XIDs in the log's window, where the log reading
    ended, and every InfiniBand port's error counters (`ib.<device>.<port>.<counter>`)."""
    found: Values = {}
    groups = fatal_xid_groups(facts)
    log = facts.get("kernel_log")
    until = _epoch(log.get("until")) if isinstance(log, dict) else None
    if groups is not None and until is not None:
        found["xid_fatal_events"] = float(sum(int(g.get("count") or 1) for g in groups))
        found[KERNEL_LOG_UNTIL] = until
    fabric = facts.get("fabric")
    devices = fabric.get("devices") if isinstance(fabric, dict) else None
    for device in devices if isinstance(devices, list) else []:
        if not isinstance(device, dict) or not isinstance(device.get("name"), str):
            continue
        for port in device.get("ports") or []:
            counters = port.get("counters") if isinstance(port, dict) else None
            if not isinstance(counters, dict) or not isinstance(port.get("port"), int):
                continue
            name = re.sub(r"[^A-Za-z0-9_-]", "_", device["name"])
            for counter in IB_COUNTERS:
                value = _number(counters.get(counter))
                if value is not None:
                    found[f"ib.{name}.{port['port']}.{counter}"] = value
    return found


def nccl_values(section: dict[str, Any], reference_bytes: int) -> Values:
    """Single-node all_reduce busbw at the reference size (nothing when the run failed)."""
    run = section.get("run") if isinstance(section, dict) else None
    if section.get("nodes") != 1 or not isinstance(run, dict) or section.get("error"):
        return {}
    if run.get("collective") != "all_reduce":
        return {}
    best = best_busbw(run.get("rows") or [], reference_bytes)
    return {"nccl_busbw_gbps": float(best[0])} if best else {}


def dcgm_values(section: dict[str, Any]) -> dict[int, Values]:
    """Per GPU index, how many of its DCGM diagnostic results failed (GPUs with results)."""
    diag = section.get("diag") if isinstance(section, dict) else None
    if section.get("error") or not isinstance(diag, dict):
        return {}
    found: dict[int, Values] = {}
    for test in diag.get("tests") or []:
        for result in test.get("results") or []:
            gpus = result.get("gpus") or []
            if len(gpus) != 1 or result.get("entity") is not None:
                continue
            values = found.setdefault(int(gpus[0]), {"dcgm_diag_failures": 0.0})
            if result.get("status") == "Fail":
                values["dcgm_diag_failures"] += 1
    return found


def identity(facts: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The node's driver and HCA firmware, and each GPU's index, UUID, serial, VBIOS, name."""
    driver = facts.get("driver") if isinstance(facts.get("driver"), dict) else {}
    firmware = {}
    fabric = facts.get("fabric")
    for device in (fabric.get("devices") if isinstance(fabric, dict) else None) or []:
        if isinstance(device, dict) and device.get("name") and device.get("fw_ver"):
            firmware[str(device["name"])] = str(device["fw_ver"])
    node = {"driver": driver.get("version") if driver else None, "firmware": firmware}
    gpus = [
        {
            "idx": gpu["index"],
            "uuid": gpu.get("uuid"),
            "serial": gpu.get("serial"),
            "vbios": gpu.get("vbios_version"),
            "name": gpu.get("name"),
        }
        for gpu in facts.get("gpus") or []
        if isinstance(gpu, dict) and isinstance(gpu.get("index"), int)
    ]
    return node, gpus
