"""Profile keys of the NCCL family: where nccl-tests are, what to run, what busbw to expect.

Bandwidths in GB/s (busbw), judged at message sizes >= nccl_reference_size_bytes; no threshold
for an unknown GPU (measured and reported, not judged).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field, StrictInt

from gpuhealth.limits import Count, FamilyLimits, Number, Seconds, Text


def _whole_number_key(value: object) -> object:
    """Inventory vars reach gpuhealth with string mapping keys ("2"): read those as counts."""
    return int(value) if isinstance(value, str) and value.isdecimal() else value


Domains = Annotated[StrictInt, BeforeValidator(_whole_number_key), Field(ge=1)]
Nodes = Annotated[StrictInt, BeforeValidator(_whole_number_key), Field(ge=2)]


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
    nccl_internode_min_busbw_gbps: Number | dict[Nodes, Number] | None = Field(
        None,
        description="multi-node all_reduce busbw (the network): one floor for any node count, "
        "or by node count, e.g. {2: 420, 64: 330} (two nodes measure more than many: NCCL's "
        "tree); a count between two listed counts takes the larger count's floor, one beyond "
        "the largest is not judged",
    )
    nccl_nvlink_domains_min_busbw_gbps: dict[Domains, Number] | None = Field(
        None,
        description="multi-node NVLink (NVL72): all_reduce busbw by how many NVLink domains "
        "(inventory nvlink_domain) the run spans, e.g. {1: 750, 2: 730, 20: 365}; a span "
        "between two listed counts takes the larger count's floor, one beyond the largest is "
        "not judged",
    )
    nccl_timeout_s: Seconds = Field(600, description="each nccl-tests launch is killed after this")
    nccl_launcher: Text = Field(
        "mpirun", description="multi-node launcher: mpirun (or its path) or srun"
    )
    nccl_launcher_args: Text = Field(
        "", description="extra launcher options (-x VAR, --mca, --mpi=pmix)"
    )
