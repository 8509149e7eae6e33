"""The kernel-log family: XIDs, NVSwitch SXIDs, peermem errors and the fabric manager log."""

from gpuhealth.families.kernel import checks, evidence, limits
from gpuhealth.registry import Family

FAMILY = Family(
    name="kernel",
    title="Kernel log",
    checks=checks.CHECKS,
    limits=limits.KernelLimits,
    sections=("kernel_log", "fabric_manager"),
    evidence=evidence.KINDS,
)
