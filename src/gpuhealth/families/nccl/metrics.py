"""What the NCCL family measures over time: single-node all_reduce busbw at the profile's
reference size (from the load test, --level standard and up)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuhealth.families.nccl.checks import best_busbw
from gpuhealth.families.nccl.limits import NcclLimits
from gpuhealth.metrics import GAUGE, Export, Measures, Metric, Values

if TYPE_CHECKING:
    from gpuhealth.checks import NodeView

METRICS = (
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
        export=Export(
            "nccl_all_reduce_busbw_gbps",
            GAUGE,
            "Single-node NCCL all_reduce bus bandwidth at the profile's reference size, in GB/s "
            "(--level standard and up).",
        ),
    ),
)


def nccl_values(section: dict[str, Any], reference_bytes: int) -> Values:
    """Single-node all_reduce busbw at the reference size (nothing when the run failed)."""
    run = section.get("run")
    if section.get("nodes") != 1 or not isinstance(run, dict) or section.get("error"):
        return {}
    if run.get("collective") != "all_reduce":
        return {}
    best = best_busbw(run.get("rows") or [], reference_bytes)
    return {"nccl_busbw_gbps": float(best[0])} if best else {}


def load(view: NodeView, section: dict[str, Any]) -> dict[int | None, Values]:
    """The node's busbw, at its profile's reference size."""
    values = nccl_values(section, view.limits.get(NcclLimits).nccl_reference_size_bytes)
    return {None: values} if values else {}


MEASURES = Measures(
    METRICS, load=load, unmeasured="busbw: not measured this run (see nccl_bandwidth)"
)
