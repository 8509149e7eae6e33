"""Profile keys of the memory-reclaim family (the threshold is max_idle_memory_used_mib)."""

from __future__ import annotations

from pydantic import Field

from gpuhealth.limits import FamilyLimits, Number, Seconds


class ReclaimLimits(FamilyLimits):
    """How long GPU memory a finished job left behind gets to be freed."""

    reclaim_wait_s: Number = Field(
        25,
        description="how long the probe waits for GPU memory to be freed (0: no wait; never "
        "past the probe's deadline less 10 s)",
    )
    reclaim_poll_s: Seconds = Field(2, description="how often it polls GPU memory while waiting")
