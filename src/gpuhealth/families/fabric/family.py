"""The fabric family: EFA on AWS, InfiniBand elsewhere, as the host's `fabric` says."""

from gpuhealth.families.fabric import checks, evidence, limits
from gpuhealth.registry import Family

FAMILY = Family(
    name="fabric",
    title="Fabric",
    checks=checks.CHECKS,
    limits=limits.FabricLimits,
    sections=("fabric",),
    evidence=evidence.KINDS,
)
