"""Regressions: each node and GPU against its own earlier runs in the run store (--history).

A regression fails the run (`--regressions warn` makes it a warning); without earlier runs
these tests skip with "no baseline yet (N runs)". Select them with `-m history`.
"""

import pytest

from gpuhealth.plugin import judge, with_active

pytestmark = pytest.mark.history


def test_gpu_regression(gpu):
    """No error counter of the GPU grew since the last run; idle temperature and power near
    its own baseline; a GPU replaced or reflashed since then is named."""
    judge("gpu_regression", gpu)


def test_node_regression(node):
    """No new fatal XID since the last run; InfiniBand error counters within their rates; a
    driver or HCA firmware change is named."""
    judge("node_regression", node)


@pytest.mark.level("standard")
def test_load_regression(node):
    """Single-node NCCL busbw within its drop limit of the node's baseline; no GPU newly
    failing DCGM's diagnostic."""
    judge("load_regression", with_active(with_active(node, "nccl"), "dcgm"))
