"""The memory-reclaim family: GPU memory left by the last job is freed within the wait."""

from gpuhealth.families.reclaim import checks, limits
from gpuhealth.registry import Family

FAMILY = Family(
    name="reclaim",
    title="Memory reclaim",
    checks=checks.CHECKS,
    limits=limits.ReclaimLimits,
    sections=("memory_reclaim",),
)
