"""The GPU slots a node is judged on: what per-GPU checks (`CheckSet.per(GPU, ...)`) of every
family are judged over, and what only the GPU family knows about them: how many slots a node
has, which record is in a slot, how findings name a GPU, and why an expected GPU has no
record (lost on the PCI bus, or lost by the driver).
"""

from __future__ import annotations

from typing import Any

from gpuhealth.checks import NodeView, Record, Scope
from gpuhealth.results import Action, Result, failed, skipped

# GPU slots parametrised when nothing says how many GPUs a host should have: enough for the
# 8-GPU nodes this tool is for; more GPUs than slots fail the gpu_count check with a hint.
UNKNOWN_GPU_SLOTS = 8


def expected_gpus(node: NodeView) -> int | None:
    """The GPU count the inventory or profile expects, if any."""
    return node.limits.values.get("gpu_count")


def gpu_record(facts: dict[str, Any], index: int) -> Record | None:
    """The GPU record with this index, if the node reported one."""
    for gpu in facts.get("gpus") or []:
        if isinstance(gpu, dict) and gpu.get("index") == index:
            return gpu
    return None


def no_nvidia(node: NodeView) -> bool:
    """Nothing NVIDIA here at all: no driver, no GPU on the PCI bus."""
    driver = node.facts.get("driver") or {}
    pci = (node.facts.get("pci") or {}).get("nvidia_gpus")
    return not driver.get("loaded") and not node.facts.get("gpus") and not pci


def none_expected(node: NodeView) -> bool:
    """Nothing NVIDIA here, and no GPU expected: GPU checks skip, the node is no GPU node."""
    return no_nvidia(node) and not expected_gpus(node)


def gpu_label(host: str, index: int, gpu: Record | None) -> str:
    """`node17 gpu3 (GPU-..., serial ..., bus ...)`: how findings name a GPU."""
    if not gpu:
        return f"{host} gpu{index}"
    ids = [str(gpu.get("uuid") or "uuid unknown")]
    if gpu.get("serial"):
        ids.append(f"serial {gpu['serial']}")
    if gpu.get("pci_bus_id"):
        ids.append(f"bus {gpu['pci_bus_id']}")
    return f"{host} gpu{index} ({', '.join(ids)})"


def gpu_slots(expected: int | None, facts: Record | None = None) -> int:
    """How many GPU slots a node is judged on: the expected count when there is one, else
    what its facts report (never fewer than it shows), else the 8 of the nodes gpuhealth is
    for (a node with more GPUs than slots fails gpu_count with a hint)."""
    if expected is not None:
        return expected
    if facts is not None:
        reported = facts.get("gpu_count")
        gpus = facts.get("gpus") or []
        return max(reported if isinstance(reported, int) and reported >= 0 else 0, len(gpus))
    return UNKNOWN_GPU_SLOTS


def missing_gpu(node: NodeView, index: int) -> Result:
    """The verdict for an expected GPU slot with no record: skipped where nothing says a GPU
    should be there (or a saved log does not show it); else failed, REBOOT_NODE when every
    GPU is still on the PCI bus (the driver lost one), RMA when one fell off the bus."""
    gpus = node.facts.get("gpus") or []
    found = len(gpus)
    expected = expected_gpus(node)
    if no_nvidia(node) and not expected:
        return skipped(f"no NVIDIA GPU/driver on {node.host}")
    reported = node.facts.get("gpu_count")
    # A saved output that lists every GPU it saw (reported) leaves out none of a smaller count;
    # a fragment that does not say how many there are leaves the others unknown, not missing.
    if node.from_evidence and (reported is None or isinstance(reported, int) and index < reported):
        return skipped(f"not evaluated: the evidence has no record of GPU {index}")
    if expected is None:
        return skipped(
            f"GPU index {index} not present on {node.host} (found {found}; set gpu_count in "
            "the inventory or --expected-gpus to assert a count)"
        )
    pci = (node.facts.get("pci") or {}).get("nvidia_gpus")
    if isinstance(pci, list) and len(pci) >= expected:
        # Every GPU is still on the PCI bus: the driver lost one (NVML renumbers the rest, so
        # this slot is not necessarily the lost GPU's), which a reboot brings back.
        return failed(
            f"expected {expected} GPUs, found {found} (all {len(pci)} on the PCI bus): GPU "
            f"index {index} missing on {node.host}",
            Action.REBOOT_NODE,
            "see gpu_count for the bus id the driver lost; drain and reboot the node, then "
            "reseat or RMA that GPU if it stays lost",
        )
    return failed(
        f"expected {expected} GPUs, found {found}: GPU index {index} missing on {node.host}",
        Action.RMA,
        "check `nvidia-smi -L`, `lspci -d 10de:` and dmesg for Xid 79 (fallen off the bus); "
        "reseat the GPU or RMA it",
    )


class GpuSlots(Scope):
    """The node's GPU slots, as `Scope` asks for them."""

    name = "gpu"
    section = "gpus"

    def slots(self, node: NodeView) -> int:
        """The expected count, else what the facts report."""
        return gpu_slots(expected_gpus(node), node.facts)

    def record(self, node: NodeView, index: int) -> Record | None:
        """The GPU record with this index."""
        return gpu_record(node.facts, index)

    def listed(self, node: NodeView) -> bool:
        """The facts hold a GPU list (a saved log with none leaves its GPUs unknown)."""
        return node.facts.get("gpus") is not None

    def label(self, host: str, index: int, record: Record | None) -> str:
        """`node17 gpu3 (GPU-..., serial ..., bus ...)`."""
        return gpu_label(host, index, record)

    def missing(self, node: NodeView, index: int) -> Result:
        """See missing_gpu."""
        return missing_gpu(node, index)


GPU = GpuSlots()
SCOPES = (GPU,)
