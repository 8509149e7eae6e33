"""The NCCL family: nccl-tests bandwidth and data integrity, per node and across nodes."""

from gpuhealth.families.nccl import active, checks, evidence, limits
from gpuhealth.registry import ActiveRun, Family

FAMILY = Family(
    name="nccl",
    title="NCCL",
    checks=checks.CHECKS,
    limits=limits.NcclLimits,
    sections=("nccl",),
    evidence=evidence.KINDS,
    markers={"nccl": "NCCL bandwidth checks (nccl-tests)"},
    active=(ActiveRun("nccl", "standard", active.launch),),
)
