"""The GPU family: the driver gate and the health of every GPU, first of the families."""

from gpuhealth.families.gpu import checks, evidence, limits
from gpuhealth.registry import Family

FAMILY = Family(
    name="gpu",
    title="GPUs",
    checks=checks.CHECKS,
    limits=limits.GpuLimits,
    sections=("source", "driver", "gpu_count", "gpus"),
    evidence=evidence.KINDS,
)
