"""Kernel-log checks: XIDs per GPU, the rest of the kernel log per node, fabric manager errors.

Only the last `xid_window_h` hours of the current boot count (0: the whole boot).
"""

from gpuhealth.plugin import judge


def test_xid_errors(gpu):
    """No hardware XIDs for this GPU in the window; application XIDs (13, 31, 43, 45) warn."""
    judge("xid_errors", gpu)


def test_kernel_log(node):
    """Kernel log readable; no XIDs of unknown GPUs, NVSwitch SXIDs or nvidia-peermem errors."""
    judge("kernel_log", node)


def test_fabric_manager(node):
    """No NVSwitch fatal errors (fail) or other errors (warn) in the fabric manager log."""
    judge("fabric_manager", node)
