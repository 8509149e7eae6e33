"""Profile keys of the NVLink fabric family."""

from __future__ import annotations

from pydantic import Field

from gpuhealth.limits import FamilyLimits, Flag, Number


class NvFabricLimits(FamilyLimits):
    """Whether the GPUs' NVLink domain spans nodes (a GB200/GB300 NVL rack) or one board, and
    how the NVLink error counters are watched (limits from DCGM's NVLink health watch)."""

    nvlink_multinode: Flag = Field(
        False,
        description="multi-node NVLink (GB200/GB300 NVL): every GPU must be in one non-zero "
        "clique and cluster UUID",
    )
    nvlink_error_window_s: Number = Field(
        2,
        le=60,
        description="the probe reads the NVLink error counters twice, this far apart (one wait "
        "for all GPUs; 0: read once, growth not judged)",
    )
    nvlink_crc_errors_fail_per_s: Number = Field(
        100,
        description="NVLink CRC or data-ECC errors per second over the window that fail a link "
        "(any growth below warns; replay or recovery growth always fails)",
    )
