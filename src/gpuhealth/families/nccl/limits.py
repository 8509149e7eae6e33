"""Profile keys of the NCCL family: where nccl-tests are, what to run, what busbw to expect.

Bandwidths in GB/s (busbw), judged at message sizes >= nccl_reference_size_bytes; no threshold
for an unknown GPU (measured and reported, not judged).
"""

from __future__ import annotations

from pydantic import Field

from gpuhealth.limits import Count, FamilyLimits, Number, Seconds, Text


class NcclLimits(FamilyLimits):
    """all_reduce_perf on all local GPUs (--level standard) and across nodes (--level full)."""

    nccl_tests_dir: Text = Field(
        "/opt/nccl-tests/build", description="directory of the nccl-tests binaries"
    )
    nccl_sizes: Text = Field(
        "-b 8 -e 4G -f 2", description="nccl-tests size arguments (4G fits any 24 GB GPU)"
    )
    nccl_reference_size_bytes: Count = Field(
        1073741824, description="busbw is judged at message sizes >= this"
    )
    nccl_allreduce_min_busbw_gbps: Number | None = Field(
        None, description="single-node all_reduce busbw (NVLink)"
    )
    nccl_internode_min_busbw_gbps: Number | None = Field(
        None, description="multi-node all_reduce busbw (the network)"
    )
    nccl_timeout_s: Seconds = Field(600, description="each nccl-tests launch is killed after this")
    nccl_launcher: Text = Field(
        "mpirun", description="multi-node launcher: mpirun (or its path) or srun"
    )
    nccl_launcher_args: Text = Field(
        "", description="extra launcher options (-x VAR, --mca, --mpi=pmix)"
    )
