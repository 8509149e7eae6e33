"""The system family: the host around the GPUs."""

from gpuhealth.families.system import checks, limits
from gpuhealth.registry import Family

FAMILY = Family(
    name="system",
    title="Host",
    checks=checks.CHECKS,
    limits=limits.SystemLimits,
    sections=("system",),
)
