"""Profile keys of the DCGM family: is DCGM there, which diagnostic level, how long."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gpuhealth.limits import FamilyLimits, Seconds


class DcgmLimits(FamilyLimits):
    """`dcgmi health` from the probe; `dcgmi diag` as a load test."""

    dcgm_diag_level: Literal[1, 2, 3, 4] | None = Field(
        None, description="dcgmi diag -r level (null: 2 at standard, 3 at full)"
    )
    dcgm_diag_timeout_s: Seconds | None = Field(
        None, description="dcgmi diag timeout (null: by level, 120 s to 6 h)"
    )
    dcgm_health_timeout_s: Seconds = Field(30, description="`dcgmi health -c -j` in the probe")
