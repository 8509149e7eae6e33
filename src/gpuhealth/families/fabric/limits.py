"""Profile keys of the fabric family: which RDMA fabric, and its device and port limits."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gpuhealth.limits import Count, FamilyLimits, Number, Seconds


class FabricLimits(FamilyLimits):
    """EFA on AWS, InfiniBand elsewhere; counters are integers, rates in Gb/s."""

    efa_devices_expected: Annotated[Count, Field(ge=1)] | None = Field(
        None, description="EFA devices (efa driver, fi_info RDM domains); null: at least 1"
    )
    fi_info_timeout_s: Seconds = Field(30, description="how long the probe waits for fi_info")
    ib_ports_expected: Count | None = Field(
        None, description="InfiniBand ports (Ethernet and bonds not counted)"
    )
    ib_devices: list[str] | None = Field(
        None, description="RDMA devices the IB checks judge (null: all IB ports)"
    )
    ib_min_rate_gbps: Number | None = Field(
        None, description="lowest IB port rate (null: the fastest port's rate)"
    )
    ib_max_link_downed: Count | None = Field(
        0, description="link_downed count per IB port (null: not judged)"
    )
    ib_max_symbol_error: Count | None = Field(
        0, description="symbol_error count per IB port (null: not judged)"
    )
    ib_max_port_rcv_errors: Count | None = Field(
        0, description="port_rcv_errors count per IB port (null: not judged)"
    )
    ib_max_local_link_integrity_errors: Count | None = Field(
        0, description="local_link_integrity_errors per IB port (null: not judged)"
    )
    ib_max_excessive_buffer_overrun_errors: Count | None = Field(
        0, description="excessive_buffer_overrun_errors per IB port (null: not judged)"
    )
    gpu_nic_max_distance: Literal["PIX", "PXB", "PHB", "NODE", "SYS"] | None = Field(
        None,
        description="farthest nvidia-smi topo level from each GPU to its nearest RDMA NIC "
        "(null: reported, not judged)",
    )
