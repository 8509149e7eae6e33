"""Profile keys of the history family: how many runs make a baseline, and each rule's limit.

The trend defaults were chosen on synthetic nights (selftest/test_history_series.py): busbw
falling 1 % a night from commissioning is flagged on the 7th night (6 % down; after a healthy
fortnight, 6 nights into the fall), idle temperature rising 2 C a night at 42 C from 30 C,
while busbw with +-4 % uniform run-to-run noise (more than a healthy node shows) raised a false
trend in 2-4 % of 30-night series (1 in 40 seeds through the store, about 4 % of 2,000 in a
simulation): a slope of 1 % a run is hard to tell from such noise in fewer runs.

Every rule can be switched off for a profile or host by setting its key to null.
"""

from __future__ import annotations

from pydantic import Field

from gpuhealth.limits import Count, FamilyLimits, Number


class HistoryLimits(FamilyLimits):
    """Baselines from the last good runs; counters compared with the last run."""

    history_baseline_runs: Count = Field(
        7,
        ge=1,
        description="good runs (node PASS or WARN, no regression) the rolling "
        "drift baseline is the median of",
    )
    history_min_runs: Count = Field(
        3, ge=1, description="good runs needed before a drift rule (busbw, idle temp/power) applies"
    )
    history_reference_runs: Count | None = Field(
        5,
        ge=1,
        description="the first good runs (after commissioning, a GPU swap, a driver, firmware or "
        "VBIOS change, or `gpuhealth history pin`) the fixed reference baseline is the median "
        "of; it is held to the drift limits like the rolling one (null: no reference)",
    )
    history_trend_runs: Count = Field(
        10, ge=3, description="good runs (this one included) a drift trend's slope is measured over"
    )
    history_trend_min_runs: Count = Field(
        6, ge=2, description="earlier good runs needed before a drift trend is judged"
    )
    regression_busbw_drop_pct: Number | None = Field(
        10,
        description="NCCL busbw this far below the node's rolling or reference "
        "baseline is a regression",
    )
    regression_ecc_uncorrected_growth: Count | None = Field(
        0, description="uncorrectable ECC errors (lifetime) a GPU may gain since the last run"
    )
    regression_remapped_rows_growth: Count | None = Field(
        0, description="remapped rows (either kind) a GPU may gain since the last run"
    )
    regression_retired_pages_growth: Count | None = Field(
        0, description="retired pages a GPU may gain since the last run"
    )
    regression_fatal_xid_growth: Count | None = Field(
        0, description="new XID events of the kinds that fail a node, since the last run"
    )
    regression_dcgm_failures_growth: Count | None = Field(
        0, description="DCGM diagnostic results a GPU may newly fail since the last run"
    )
    regression_ib_link_downed_growth: Count | None = Field(
        0, description="link_downed events an InfiniBand port may gain since the last run"
    )
    regression_ecc_corrected_per_day: Number | None = Field(
        1000, description="correctable ECC errors (lifetime) a GPU may gain per day"
    )
    regression_pcie_replays_per_day: Number | None = Field(
        100, description="PCIe replays a GPU may gain per day"
    )
    regression_nvlink_errors_per_day: Number | None = Field(
        10,
        description="NVLink errors of one kind (replay, recovery, CRC, data ECC; on Blackwell "
        "the NVLink5 counters; summed over the GPU's links) a GPU may gain per day",
    )
    regression_ib_errors_per_day: Number | None = Field(
        10, description="symbol, receive and link-recovery errors an IB port may gain per day"
    )
    regression_idle_temp_rise_c: Number | None = Field(
        10,
        description="idle GPU temperature this far above its rolling or "
        "reference baseline is a regression",
    )
    regression_idle_power_rise_pct: Number | None = Field(
        25,
        description="idle GPU power this far above its rolling or reference baseline is a "
        "regression",
    )
    regression_busbw_trend_pct_per_run: Number | None = Field(
        0.8,
        description="NCCL busbw falling this steadily (% of its level per run, over "
        "history_trend_runs) is a regression before it reaches the drop limit",
    )
    regression_idle_temp_trend_c_per_run: Number | None = Field(
        1.0, description="idle GPU temperature rising this steadily (C per run) is a regression"
    )
    regression_idle_power_trend_pct_per_run: Number | None = Field(
        2.0,
        description="idle GPU power rising this steadily (% of its level per run) is a regression",
    )
