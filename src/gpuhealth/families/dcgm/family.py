"""The DCGM family: the diagnostic (a load test) and the health watches (from the probe)."""

from gpuhealth.families.dcgm import active, checks, evidence, limits
from gpuhealth.registry import ActiveRun, Family

FAMILY = Family(
    name="dcgm",
    title="DCGM",
    checks=checks.CHECKS,
    limits=limits.DcgmLimits,
    sections=("dcgm_health", "dcgm"),
    evidence=evidence.KINDS,
    markers={"dcgm": "DCGM diagnostic and health checks"},
    active=(ActiveRun("dcgm", "standard", active.launch),),
)
