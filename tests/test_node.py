"""Per-node checks: one test per check, parametrised as test_x[<host>].

The rules live in gpuhealth.checks (shared with `gpuhealth triage`); each test names one.
"""

from gpuhealth.plugin import judge


def test_driver_version(node):
    """NVIDIA driver loaded and >= the minimum branch (nvidia_driver_branch, default 570)."""
    judge("driver_version", node)


def test_gpu_count(node):
    """Exactly the GPU count the inventory or profile expects."""
    judge("gpu_count", node)


def test_gpu_uniformity(node):
    """One GPU model and one VBIOS family on the node (and the profile's VBIOS prefix)."""
    judge("gpu_uniformity", node)


def test_persistence_mode(node):
    """Persistence mode on for every GPU."""
    judge("persistence_mode", node)
