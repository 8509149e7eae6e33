"""The storage family: the paths jobs depend on, and the network filesystems under them."""

from gpuhealth.families.storage import checks, limits
from gpuhealth.registry import Family

FAMILY = Family(
    name="storage",
    title="Storage",
    checks=checks.CHECKS,
    limits=limits.StorageLimits,
    sections=("storage",),
)
