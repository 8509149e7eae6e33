"""Profile keys of the NVLink fabric family."""

from __future__ import annotations

from pydantic import Field

from gpuhealth.limits import FamilyLimits, Flag


class NvFabricLimits(FamilyLimits):
    """Whether the GPUs' NVLink domain spans nodes (a GB200/GB300 NVL rack) or one board."""

    nvlink_multinode: Flag = Field(
        False,
        description="multi-node NVLink (GB200/GB300 NVL): every GPU must be in one non-zero "
        "clique and cluster UUID",
    )
