"""DCGM: the diagnostic (`dcgmi diag`, level 2 at --level standard, 3 at full) per node and per
GPU, and the health watches (`dcgmi health -c`, from the probe) where DCGM is installed.

Select them with `-m dcgm`.
"""

import pytest

from gpuhealth.plugin import judge, with_active

pytestmark = pytest.mark.dcgm


def test_dcgm_health(node):
    """DCGM's health watches report Healthy (dcgm_installed hosts)."""
    judge("dcgm_health", node)


@pytest.mark.level("standard")
def test_dcgm_diag(node):
    """`dcgmi diag` ran and its node-wide tests passed."""
    judge("dcgm_diag", with_active(node, "dcgm"))


@pytest.mark.level("standard")
def test_dcgm_diag_gpu(gpu):
    """Every `dcgmi diag` test on this GPU passed (Warn warns, Skip skips with DCGM's reason)."""
    judge("dcgm_diag_gpu", with_active(gpu, "dcgm"))
