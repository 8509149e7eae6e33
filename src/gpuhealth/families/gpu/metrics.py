"""What the GPU family measures over time: each GPU's error counters, its idle temperature and
power, and what a GPU reads now for exporters; and the driver and GPUs that identify the node."""

from __future__ import annotations

from typing import Any

from gpuhealth.metrics import COUNTER, GAUGE, Export, Measures, Metric, Values, known, number

_MEMORY = (
    "the GPU's memory is wearing: read the ecc_errors and row_remapping checks, reset the GPU "
    "to apply pending remaps, and RMA it if the count keeps growing"
)
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
    Metric(
        "temperature_c",
        "temperature",
        "reading",
        export=Export("gpu_temperature_celsius", GAUGE, "GPU temperature when the run read it."),
    ),
    Metric(
        "power_draw_w",
        "power draw",
        "reading",
        export=Export("gpu_power_draw_watts", GAUGE, "GPU power draw when the run read it."),
    ),
    Metric(
        "ecc_uncorrected_aggregate",
        "uncorrectable ECC errors",
        "growth",
        "regression_ecc_uncorrected_growth",
        advice=_MEMORY,
        export=Export(
            "gpu_ecc_uncorrected_errors",
            COUNTER,
            "Uncorrectable ECC errors over the GPU's lifetime (NVML aggregate count).",
        ),
    ),
    Metric(
        "remapped_rows_uncorrectable",
        "rows remapped for uncorrectable errors",
        "growth",
        "regression_remapped_rows_growth",
        advice=_MEMORY,
        export=Export(
            "gpu_remapped_rows_uncorrectable",
            COUNTER,
            "Memory rows remapped for uncorrectable errors (Ampere and later).",
        ),
    ),
    Metric(
        "remapped_rows_correctable",
        "rows remapped for correctable errors",
        "growth",
        "regression_remapped_rows_growth",
        advice=_MEMORY,
        export=Export(
            "gpu_remapped_rows_correctable",
            COUNTER,
            "Memory rows remapped for correctable errors (Ampere and later).",
        ),
    ),
    Metric(
        "retired_pages",
        "retired pages",
        "growth",
        "regression_retired_pages_growth",
        advice=_MEMORY,
        export=Export(
            "gpu_retired_pages",
            COUNTER,
            "Memory pages retired for single- and double-bit ECC errors (before Ampere).",
        ),
    ),
    Metric(
        "ecc_corrected_aggregate",
        "correctable ECC errors",
        "rate",
        "regression_ecc_corrected_per_day",
        advice="a rising rate of correctable errors often comes before uncorrectable ones: "
        "watch the trend (gpuhealth history --metric ecc_corrected_aggregate) and run "
        "`dcgmi diag -r 3`",
        export=Export(
            "gpu_ecc_corrected_errors",
            COUNTER,
            "Correctable ECC errors over the GPU's lifetime (NVML aggregate count).",
        ),
    ),
    Metric(
        "pcie_replays",
        "PCIe replays",
        "rate",
        "regression_pcie_replays_per_day",
        resets=True,
        advice="check the GPU's PCIe path (riser, slot, retimer: `nvidia-smi -q -d PCIE`, "
        "`lspci -vv`) and reseat the GPU if replays keep growing",
        export=Export(
            "gpu_pcie_replays", COUNTER, "PCIe replays of the GPU since the driver loaded."
        ),
    ),
    # The idle readings are temperature_c and power_draw_w taken only when the GPU is idle:
    # kept for history, exported as the readings.
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
            export=Export(
                f"gpu_nvlink_{counter}_errors",
                COUNTER,
                f"{what} of the GPU's links, summed, since the driver loaded.",
            ),
        )
        for counter, what in NVLINK_COUNTERS
    ),
)
READINGS = tuple(m.name for m in METRICS if m.rule == "reading")


def _sum(record: Any, keys: tuple[str, ...]) -> float | None:
    """The sum of record[keys], unknown when any part is."""
    if not isinstance(record, dict):
        return None
    parts = [number(record.get(key)) for key in keys]
    return None if None in parts else float(sum(p for p in parts if p is not None))


def _nvlink_errors(record: Any) -> dict[str, float | None]:
    """Each NVLink error counter summed over the GPU's active links, as last read; unknown
    when any link's value of it is (a partial sum would look like a reset next time)."""
    links = record.get("links") if isinstance(record, dict) else None
    if not isinstance(links, list) or not links:
        return {}
    found: dict[str, float | None] = {}
    for counter, _ in NVLINK_COUNTERS:
        total, known = 0.0, True
        for entry in links:  # up to the first link without it (most GPUs lack most counters)
            reads = entry.get(counter) if isinstance(entry, dict) else None
            value = None
            if isinstance(reads, dict):
                value = number(reads.get("second"))
                value = number(reads.get("first")) if value is None else value
            if value is None:
                known = False
                break
            total += value
        found[f"nvlink_{counter}_errors"] = total if known else None
    return found


def gpu_values(gpu: dict[str, Any], node_in_use: bool = False) -> Values:
    """A GPU record's error counters, and its temperature and power when it is idle on a node
    judged idle: a node in use gives no idle readings (its jobs heat the GPUs they leave
    free), so they never enter an idle baseline."""
    found: dict[str, float | None] = {}
    ecc = gpu.get("ecc") if isinstance(gpu.get("ecc"), dict) else {}
    aggregate = ecc.get("aggregate") if isinstance(ecc, dict) else None
    if isinstance(aggregate, dict):
        found["ecc_uncorrected_aggregate"] = number(aggregate.get("uncorrected"))
        found["ecc_corrected_aggregate"] = number(aggregate.get("corrected"))
    rows = gpu.get("remapped_rows")
    if isinstance(rows, dict):
        found["remapped_rows_uncorrectable"] = number(rows.get("uncorrectable"))
        found["remapped_rows_correctable"] = number(rows.get("correctable"))
    found["retired_pages"] = _sum(gpu.get("retired_pages"), ("single_bit", "double_bit"))
    pcie = gpu.get("pcie")
    if isinstance(pcie, dict):
        found["pcie_replays"] = number(pcie.get("replay_count"))
    found.update(_nvlink_errors(gpu.get("nvlink_errors")))
    processes = gpu.get("processes")
    idle = gpu.get("utilization_gpu_pct") == 0 and isinstance(processes, list) and not processes
    if idle and not node_in_use:
        found["idle_temperature_c"] = number(gpu.get("temperature_c"))
        found["idle_power_w"] = number(gpu.get("power_draw_w"))
    return known(found)


def gpu_readings(gpu: dict[str, Any]) -> Values:
    """A GPU record's temperature and power draw as read, busy or idle (READINGS)."""
    return known({name: number(gpu.get(name)) for name in READINGS})


def identity(facts: dict[str, Any]) -> dict[str, Any]:
    """The node's driver version, and each GPU's index, UUID, serial, VBIOS and name."""
    driver = facts.get("driver") if isinstance(facts.get("driver"), dict) else {}
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
    return {"driver": driver.get("version") if driver else None, "gpus": gpus}


MEASURES = Measures(METRICS, gpu=gpu_values, readings=gpu_readings, identity=identity)
