"""Profile keys of the kernel-log family: the window of XIDs, SXIDs and fabric manager errors."""

from __future__ import annotations

from pydantic import Field

from gpuhealth.limits import FamilyLimits, Number, Seconds


class KernelLimits(FamilyLimits):
    """Only the last xid_window_h hours of the current boot count."""

    xid_window_h: Number = Field(
        24, description="hours of kernel log the XID checks judge (0: since boot)"
    )
    kernel_log_timeout_s: Seconds = Field(
        15, description="each kernel-log reader of the probe (journalctl, dmesg)"
    )
