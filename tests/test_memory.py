"""GPU memory reclaim on idle nodes (reclaim_wait_s, reclaim_poll_s, max_idle_memory_used_mib)."""

from gpuhealth.plugin import judge


def test_memory_reclaim(gpu):
    """GPU memory in use drops below the idle tolerance within the wait; leftover PIDs fail."""
    judge("memory_reclaim", gpu)
