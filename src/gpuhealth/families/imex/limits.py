"""Profile keys of the IMEX family: is the node in an IMEX domain, and how big the domain is."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpuhealth.limits import Count, FamilyLimits, Flag, Seconds


class ImexLimits(FamilyLimits):
    """IMEX runs on the nodes of a multi-node NVLink domain (a GB200/GB300 NVL72 rack)."""

    imex_required: Flag = Field(
        False, description="node is in a multi-node NVLink domain that needs IMEX (nvidia-imex)"
    )
    imex_expected_nodes: Annotated[Count, Field(ge=1)] | None = Field(
        None, description="nodes the IMEX domain lists (an NVL72 rack: 18; null: not asserted)"
    )
    imex_ctl_timeout_s: Seconds = Field(
        10, description="how long the probe waits for nvidia-imex-ctl -N"
    )
