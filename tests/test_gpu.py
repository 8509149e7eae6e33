"""Per-GPU checks: parametrised as test_x[<host>-gpu<N>] for N in the expected GPU count.

A GPU the inventory expects but the node does not show fails every test of its index.
"""

from gpuhealth.plugin import judge


def test_gpu_lost(gpu):
    """NVML reaches the GPU: it has not fallen off the bus (NVML_ERROR_GPU_IS_LOST)."""
    judge("gpu_lost", gpu)


def test_recovery_action(gpu):
    """NVML GPU recovery action is NONE (r570+)."""
    judge("recovery_action", gpu)


def test_ecc_errors(gpu):
    """Uncorrectable ECC (volatile and aggregate) within limits; corrected below limits."""
    judge("ecc_errors", gpu)


def test_retired_pages(gpu):
    """No page retirement pending; retired pages below the RMA limit (pre-Ampere)."""
    judge("retired_pages", gpu)


def test_row_remapping(gpu):
    """No row remapping pending or failed (Ampere and later)."""
    judge("row_remapping", gpu)


def test_temperature(gpu):
    """Temperature below the profile limits and clear of the GPU's slowdown point."""
    judge("temperature", gpu)


def test_throttle(gpu):
    """No HW slowdown, HW thermal slowdown or HW power brake active."""
    judge("throttle", gpu)


def test_power(gpu):
    """Power draw within the enforced limit; limit not capped below the SKU's."""
    judge("power", gpu)


def test_pcie_link(gpu):
    """PCIe link at the expected generation and width."""
    judge("pcie_link", gpu)


def test_nvlink(gpu):
    """The expected NVLink links are up."""
    judge("nvlink", gpu)


def test_idle_processes(gpu):
    """No stray compute processes; GPU memory in use below the idle tolerance."""
    judge("idle_processes", gpu)
