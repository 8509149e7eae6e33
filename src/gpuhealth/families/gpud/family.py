"""The GPUd family: the health GPUd reports for every component it watches, and its events."""

from gpuhealth.families.gpud import checks, evidence, limits
from gpuhealth.registry import Family

FAMILY = Family(
    name="gpud",
    title="GPUd",
    checks=checks.CHECKS,
    limits=limits.GpudLimits,
    sections=("gpud", "gpud_events"),
    evidence=evidence.KINDS,
    markers={"gpud": "GPUd health checks"},
)
