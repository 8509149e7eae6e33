"""Lost and unreadable GPUs: NVML's GPU-is-lost and a GPU on the PCI bus that the driver does
not list are the GPU's own hardware finding, first in the node's reasons; values nobody could
read never make the node's GPUs "mixed models"."""

from __future__ import annotations

from gpuhealth.checks import NodeView, evaluate, judged
from gpuhealth.facts import IN_USE
from gpuhealth.families.gpu.schema import new_gpu
from gpuhealth.registry import check, checks
from gpuhealth.report import Outcome, VerdictBook
from selftest.facts import healthy_h100, judge, limits

LOST = {"call": "nvmlDeviceGetHandleByIndex(gpu=3)", "error": "GPU is lost"}


def lost_gpu3() -> dict:
    """The healthy node with GPU 3's handle lost: every value of it unreadable, as the
    NVML collector records it."""
    facts = healthy_h100()
    gpu = new_gpu(3)
    for key in list(gpu):
        if key not in ("index", "unavailable"):
            gpu[key] = None
            gpu["unavailable"][key] = {"kind": "error", "detail": f"{LOST['call']}: GPU is lost"}
    gpu["lost"] = dict(LOST)
    del gpu["unavailable"]["lost"]
    facts["gpus"][3] = gpu
    return facts


def test_a_lost_gpu_fails_with_a_reboot_naming_the_call():
    result = judge("gpu_lost", lost_gpu3(), 3)
    assert result.status == "FAIL" and result.action == "REBOOT_NODE"
    assert result.text.startswith(
        "node17 gpu3 (uuid unknown): GPU lost: NVML answered "
        "nvmlDeviceGetHandleByIndex(gpu=3) with GPU is lost (NVML_ERROR_GPU_IS_LOST"
    )
    assert "Xid 79" in (result.advice or "")
    assert judge("gpu_lost", lost_gpu3(), 2).status == "PASS"


def test_a_lost_gpu_is_judged_on_a_node_in_use():
    assert check("gpu_lost").in_use
    view = NodeView("node17", lost_gpu3(), limits("h100-sxm"), IN_USE)
    assert evaluate(check("gpu_lost"), view, 3).result.action == "REBOOT_NODE"


def test_unknown_lost_state_is_never_a_pass():
    facts = healthy_h100()
    gpu = facts["gpus"][4]
    gpu["lost"] = None
    hung = "NVML hung at nvmlDeviceGetTemperatureV(gpu=4) (no answer within 2 s)"
    gpu["unavailable"]["lost"] = {"kind": "timeout", "detail": hung}
    result = judge("gpu_lost", facts, 4)
    assert result.status == "FAIL" and result.action == "RERUN" and hung in result.text
    gpu["unavailable"]["lost"] = {"kind": "absent", "detail": "only NVML tells a lost GPU here"}
    assert judge("gpu_lost", facts, 4).status == "SKIP"
    del gpu["lost"], gpu["unavailable"]["lost"]  # facts from a probe before the record
    skipped = judge("gpu_lost", facts, 4)
    assert skipped.status == "SKIP" and "collect them again" in skipped.text


def test_the_lost_gpu_is_the_headline_not_mixed_models():
    facts = lost_gpu3()
    view = NodeView("node17", facts, limits("h100-sxm"))
    found = judged(list(checks().values()), view, 8)
    uniformity = next(f for f in found if f.check == "gpu_uniformity")
    assert uniformity.status.value == "SKIP"
    assert "mixed" not in uniformity.result.message
    assert "not read: gpu3 (model, VBIOS)" in uniformity.result.message
    assert "the GPUs read agree: NVIDIA H100 80GB HBM3" in uniformity.result.message
    book = VerdictBook()
    for finding in found:
        book.add(Outcome.of(finding))
    (verdict,) = book.finish()
    assert verdict.verdict == "FAIL"
    assert verdict.reasons[0].startswith("node17 gpu3 (uuid unknown): GPU lost: ")
    assert verdict.reasons[0].endswith("[gpu_lost]") and verdict.actions[0] == "REBOOT_NODE"


def test_uniformity_compares_the_gpus_read_and_still_finds_mixed_ones():
    facts = lost_gpu3()
    facts["gpus"][5]["name"] = "NVIDIA H200"
    result = judge("gpu_uniformity", facts)
    assert result.status == "FAIL"
    assert "mixed GPU models on one node: NVIDIA H100 80GB HBM3, NVIDIA H200" in result.text
    assert "unknown" not in result.text
    facts = lost_gpu3()
    facts["gpus"][6]["vbios_version"] = "97.00.01.00.01"
    assert "VBIOS families differ" in judge("gpu_uniformity", facts).text


def test_gpus_on_the_bus_the_driver_does_not_list_are_lost():
    facts = healthy_h100()
    gone = facts["gpus"].pop(4)["pci_bus_id"]
    facts["gpu_count"] = 7
    for expected in (8, None):
        result = judge("gpu_count", facts, profile=None, gpu_count=expected)
        assert result.status == "FAIL" and result.action == "REBOOT_NODE", result.text
        assert f"the driver lists 7: {gone} lost (on the bus, not listed by the driver)" in (
            result.text
        )
    facts["driver"]["loaded"] = False  # no driver: the driver gate says so, nothing is lost
    assert "lost" not in judge("gpu_count", facts, profile=None, gpu_count=8).text
    facts["driver"]["loaded"], facts["pci"]["nvidia_gpus"] = True, None  # bus not read
    assert judge("gpu_count", facts, profile=None).status == "SKIP"


def test_an_unreadable_bus_id_leaves_the_candidates_named():
    facts = lost_gpu3()  # GPU 3's bus id unknown, and one more GPU not listed at all
    gone = facts["gpus"].pop(6)["pci_bus_id"]
    facts["gpu_count"] = 7
    text = judge("gpu_count", facts).text
    listed_lost = facts["pci"]["nvidia_gpus"][3]
    assert f"the driver lists 7: 1 of {listed_lost}, {gone} lost" in text


def test_a_container_s_share_of_the_gpus_is_not_a_lost_gpu():
    """In a pod or a job that holds 4 of 8 GPUs NVML lists 4 and sysfs shows 8; the process's
    /dev/nvidiaN nodes are that share, so the other 4 are not called lost. On a host (8 device
    nodes) the same gap is a GPU the driver lost."""
    from selftest.facts import healthy_h100, judge

    facts = healthy_h100()
    facts["gpus"], facts["gpu_count"] = facts["gpus"][:4], 4
    facts["pci"]["device_nodes"] = 4
    share = judge("gpu_count", facts, profile=None)  # the API asks without a count
    assert share.status.value == "SKIP" and "lost" not in share.result.message, share.text
    facts["pci"]["device_nodes"] = 8
    host = judge("gpu_count", facts, profile=None)
    assert host.status.value == "FAIL" and "lost (on the bus, not listed" in host.result.message
