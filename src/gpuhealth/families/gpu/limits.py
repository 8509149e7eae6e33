"""Profile keys of the GPU family: driver gate, GPU count and the per-GPU health limits."""

from __future__ import annotations

from pydantic import Field

from gpuhealth.limits import Celsius, Count, DriverVersion, FamilyLimits, Flag, Number, Seconds


class GpuLimits(FamilyLimits):
    """Limits of the driver, the GPUs and their health (temperatures in C, power in W)."""

    gpu_count: Count | None = Field(None, description="GPUs expected per node")
    min_driver_version: DriverVersion = Field(
        "570", description="lowest acceptable driver, e.g. '570' or '570.124.06'"
    )
    require_recovery_action: Flag = Field(
        True, description="fail when the driver cannot report the GPU recovery action"
    )
    require_ecc: Flag = Field(False, description="fail when ECC is off or unsupported")
    require_persistence_mode: Flag = Field(True, description="fail when persistence mode is off")
    vbios_prefix: str | None = Field(
        None, description="every GPU's VBIOS version must start with this"
    )
    max_ecc_uncorrected_volatile: Count = Field(
        0, description="uncorrectable ECC since driver load"
    )
    max_ecc_uncorrected_aggregate: Count = Field(
        0, description="uncorrectable ECC over the GPU's life"
    )
    max_ecc_corrected_volatile: Count | None = Field(
        10000, description="correctable ECC since driver load (null: not judged)"
    )
    max_ecc_corrected_aggregate: Count | None = Field(
        None, description="correctable ECC over the GPU's life (null: not judged)"
    )
    max_retired_pages: Count = Field(60, description="retired pages (pre-Ampere) before an RMA")
    temp_warn_c: Celsius = Field(75, description="GPU temperature that gives a warning")
    temp_fail_c: Celsius = Field(85, description="GPU temperature that fails the node")
    min_slowdown_margin_c: Number = Field(
        5, description="required headroom to the GPU's own slowdown point"
    )
    max_power_over_limit_pct: Number = Field(
        5, description="power draw tolerated above the enforced limit"
    )
    min_power_limit_w: Number | None = Field(
        None, description="an enforced power limit below this means a capped GPU"
    )
    pcie_gen_expected: Count | None = Field(None, description="PCIe generation the link must reach")
    pcie_width_expected: Count | None = Field(None, description="PCIe lanes the link must have")
    nvlink_links_expected: Count | None = Field(
        None, description="NVLink links that must be up per GPU (0: none, null: all it has)"
    )
    expect_idle: Flag = Field(True, description="the node must run no compute processes")
    max_idle_memory_used_mib: Number = Field(
        512, description="GPU memory in use tolerated on an idle node"
    )
    nvml_call_timeout_s: Seconds = Field(
        5, description="each NVML call of the probe (a hung driver costs one timeout)"
    )
    nvidia_smi_timeout_s: Seconds = Field(
        60, description="each nvidia-smi call of the probe when NVML cannot be used"
    )
