"""Profile keys of the system family: NUMA layout, host resources, memlock, services.

Sizes in _gb are GiB (2^30 bytes), as `df -h` and `free -g` print them.
"""

from __future__ import annotations

from pydantic import Field

from gpuhealth.limits import AbsolutePath, Count, FamilyLimits, Flag, Number, Seconds


class SystemLimits(FamilyLimits):
    """What a GPU job needs from the host around the GPUs."""

    numa_nodes_expected: Count | None = Field(
        None, description="NUMA nodes the kernel shows (null: not asserted)"
    )
    gpus_even_over_numa_nodes: Flag = Field(
        False, description="GPUs split evenly over the NUMA nodes with CPUs"
    )
    min_cpus: Count | None = Field(None, description="online logical CPUs the node must have")
    min_memory_gb: Number | None = Field(None, description="MemTotal the node must have")
    min_memory_available_pct: Number | None = Field(
        10, description="MemAvailable as a share of MemTotal"
    )
    min_root_free_gb: Number | None = Field(
        10, description="free space on / (for non-root users, like df Avail)"
    )
    scratch_paths: list[AbsolutePath] = Field(
        [], description="local scratch directories whose free space is checked"
    )
    min_scratch_free_gb: Number | None = Field(
        100, description="free space each scratch path must have"
    )
    min_memlock_kb: Count | None = Field(
        None, description="memlock limit floor (null: unlimited for efa/infiniband)"
    )
    require_nvidia_peermem: Flag | None = Field(
        None, description="nvidia_peermem loaded (null: when fabric is infiniband or efa)"
    )
    requires_fabric_manager: Flag = Field(
        False, description="NVSwitch baseboard: nvidia-fabricmanager must run"
    )
    system_command_timeout_s: Seconds = Field(
        10, description="numactl, systemctl and statvfs calls of the probe"
    )
