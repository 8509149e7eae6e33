"""What the DCGM family measures over time: each GPU's failed results in the diagnostic (from
the load test, --level standard and up)."""

from __future__ import annotations

from typing import Any

from gpuhealth.metrics import GAUGE, Export, Measures, Metric, Values

METRICS = (
    Metric(
        "dcgm_diag_failures",
        "failed DCGM diagnostic results",
        "growth",
        "regression_dcgm_failures_growth",
        advice="run `dcgmi diag -r 3` on the GPU; reset it, and RMA it if it fails again",
        export=Export(
            "gpu_dcgm_diag_failed_results",
            GAUGE,
            "Failed results of the GPU in the run's DCGM diagnostic (--level standard and up).",
        ),
    ),
)


def dcgm_values(section: dict[str, Any]) -> dict[int | None, Values]:
    """Per GPU index, how many of its DCGM diagnostic results failed (GPUs with results)."""
    diag = section.get("diag")
    if section.get("error") or not isinstance(diag, dict):
        return {}
    found: dict[int | None, Values] = {}
    for test in diag.get("tests") or []:
        for result in test.get("results") or []:
            gpus = result.get("gpus") or []
            if len(gpus) != 1 or result.get("entity") is not None:
                continue
            values = found.setdefault(int(gpus[0]), {"dcgm_diag_failures": 0.0})
            if result.get("status") == "Fail":
                values["dcgm_diag_failures"] += 1
    return found


MEASURES = Measures(
    METRICS,
    load=lambda _view, section: dcgm_values(section),
    unmeasured="DCGM: no per-GPU results this run (see dcgm_diag)",
)
