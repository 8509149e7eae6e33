"""Profile keys of the GPUd family: is GPUd there, where it answers, how far back to look."""

from __future__ import annotations

from pydantic import Field

from gpuhealth.limits import FamilyLimits, Number, Seconds, Text


class GpudLimits(FamilyLimits):
    """GPUd is asked on the node over loopback (host:port is HTTPS; http://host:port plain)."""

    gpud_address: Text = Field(
        "127.0.0.1:15132", description="GPUd API on the node: host:port (https) or http://..."
    )
    gpud_timeout_s: Seconds = Field(5, description="each GPUd API request of the probe")
    gpud_events_window_h: Number = Field(24, description="hours of GPUd events the probe asks for")
