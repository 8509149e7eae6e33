"""NCCL bandwidth (nccl-tests): per node over NVLink at --level standard, across all nodes at
--level full (one test for the whole host set; bisection names the slow nodes).

Active checks: each launches a load test on the nodes. Select them with `-m nccl`.
"""

import pytest

from gpuhealth.families.nccl.fleet import run_fleet_nccl
from gpuhealth.plugin import judge, with_active

pytestmark = pytest.mark.nccl


@pytest.mark.level("standard")
def test_nccl_bandwidth(node):
    """all_reduce busbw on all local GPUs at the reference size >= the profile's threshold."""
    judge("nccl_bandwidth", with_active(node, "nccl"))


@pytest.mark.level("standard")
def test_nccl_data_integrity(node):
    """No wrong elements (#wrong 0, no out-of-bounds values) where nccl-tests validated."""
    judge("nccl_data_integrity", with_active(node, "nccl"))


@pytest.mark.level("full")
@pytest.mark.parametrize("fleet", ["fleet"])
def test_nccl_multinode(fleet, request):
    """all_reduce busbw of all hosts together >= the inter-node threshold; else bisect."""
    run_fleet_nccl(request.node)
