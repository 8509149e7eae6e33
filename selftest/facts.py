"""Shared helpers of the selftests: a healthy node's facts, the one judge helper, probe runs.

The healthy 8x H100 node is assembled from real samples and real collectors; every check
family's tests start from it and break one thing, so each test shows exactly which fact makes
which check fail. The GPU part is the real `nvidia-smi -q` sample (HW slowdown cleared, r570
recovery action NONE); the other sections come from the families' own probes run on a
constructed 2-socket HGX H100 tree whose GPU bus ids are the sample's.
"""

from __future__ import annotations

import importlib
import json
import time
from pathlib import Path
from typing import Any

from gpuhealth import registry
from gpuhealth.checks import Finding, NodeView, evaluate
from gpuhealth.config import Expectations, ProfileSet, resolve_limits
from gpuhealth.evidence import facts_from_file
from gpuhealth.families.gpu.schema import NVLINK_ERROR_COUNTERS as COUNTERS
from gpuhealth.families.kernel import evidence as kernel_evidence
from gpuhealth.families.kernel import parse_kernel_log
from gpuhealth.families.system import parse_numactl
from gpuhealth.families.system import probe as system_probe
from gpuhealth.probe.main import Context

DATA = Path(__file__).parent / "data"
H100_TEXT = DATA / "nvidia-smi" / "gpud_h100x8_535.161.08_query.txt"
TREE = DATA / "system" / "hgx-h100-2socket"
NUMACTL_2NODE = DATA / "system" / "numactl" / "hgx-h100-2node.txt"
PROFILES = ProfileSet()


def limits(profile: str | None = "h100-sxm", **overrides: Any) -> Any:
    """Resolved limits of a profile with inventory-style overrides (gpu_count included)."""
    gpu_count = overrides.pop("gpu_count", None)
    return resolve_limits(Expectations(profile, gpu_count, overrides), PROFILES, None)


def view(
    facts: dict[str, Any], profile: str | None = "h100-sxm", host: str = "node17", **overrides: Any
) -> NodeView:
    """A node view of `facts` named `host`, judged by `profile` plus inventory-style overrides."""
    return NodeView(host, facts, limits(profile, **overrides))


def judge(
    name: str,
    facts: dict[str, Any],
    index: int | None = None,
    profile: str | None = "h100-sxm",
    host: str = "node17",
    **overrides: Any,
) -> Finding:
    """Check `name` on `facts` (one GPU slot with `index`): the one judge of the selftests."""
    return evaluate(registry.check(name), view(facts, profile, host, **overrides), index)


def probe_config(root: str | Path = "/", **expect: Any) -> dict[str, Any]:
    """The probe's configuration as the controller sends it: the default profile's keys."""
    return {"root": str(root), "expect": {**limits("default").values, **expect}}


def probe(
    family: str, root: str | Path = "/", facts: dict[str, Any] | None = None, **expect: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run a family's node side with the default profile's keys (plus `expect`) on `root`:
    (the sections it wrote, the errors it recorded)."""
    errors: list[dict[str, Any]] = []
    values = {**limits("default").values, **expect}
    ctx = Context(str(root), values, errors, facts or {})
    module = importlib.import_module(f"gpuhealth.families.{family}.probe")
    return module.collect(ctx), errors


def section(family: str, name: str, root: str | Path = "/", **expect: Any) -> dict[str, Any]:
    """One section a family's probe writes (`probe("system", ...)["system"]`)."""
    return probe(family, root, **expect)[0][name]


def sample(name: str, live: bool = True) -> dict[str, Any]:
    """Facts from a real nvidia-smi sample; `live` makes it look like a probe result."""
    facts = facts_from_file(DATA / "nvidia-smi" / name)[1]
    if live:
        facts["source"] = "nvml"
        facts["driver"]["loaded"] = True
    return facts


def healthy_system(root: Path = TREE, **expect: Any) -> dict[str, Any]:
    """The tree's `system` section as a healthy node's probe gives it, independent of this
    machine's tools and limits: numactl answering with the 2-node sample, every service
    active, memlock unlimited, 224 usable CPUs and a roomy /."""
    system = section("system", "system", root, **expect)
    system["numactl"] = {
        "available": True,
        "rc": 0,
        "error": None,
        "hardware": parse_numactl.parse_hardware(NUMACTL_2NODE.read_text()),
    }
    system["services"] = dict.fromkeys(system_probe.UNITS, "active")
    system["unavailable"].pop("services", None)
    system["memlock_kb"] = {"soft": "unlimited", "hard": "unlimited"}
    system["cpus_usable"] = 224
    system["disks"][0].update(total_bytes=1_880_000_000_000, free_bytes=1_700_000_000_000)
    return system


def _quiet_log(name: str) -> dict[str, Any]:
    """A kernel-log style section with no events, as collected just now over 24 h."""
    empty = kernel_evidence.kernel_log_evidence("\n")["kernel_log"]
    now = parse_kernel_log.stamp(time.time())
    quiet = {**empty, "source": "journalctl -k -o short-iso", "anchored_at": "collection"}
    quiet.update(window_h=24, until=now)
    if name == "fabric_manager":
        quiet.update(source="fabric manager log", log="/var/log/fabricmanager.log", present=True)
    return quiet


def _reclaim_nothing(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "threshold_mib": 512,
        "wait_s": 50,
        "poll_s": 2,
        "waited_s": 0,
        "polls": 0,
        "error": None,
        "gpus": [
            {
                "index": g["index"],
                "used_mib": g["memory_used_mib"],
                "initial_used_mib": g["memory_used_mib"],
                "total_mib": g["memory_total_mib"],
                "processes": [],
            }
            for g in gpus
        ],
    }


def healthy_h100() -> dict[str, Any]:
    """Facts of a healthy 8x H100 SXM node as the live probe returns them."""
    facts = sample(H100_TEXT.name)
    facts["driver"]["version"] = "570.86.15"
    facts["pci"] = {"nvidia_gpus": [g["pci_bus_id"] for g in facts["gpus"]]}
    for gpu in facts["gpus"]:
        gpu["clock_event_reasons"] = {"active": [], "mask": 0, "unavailable": {}}
        gpu["recovery_action"] = 0
        gpu["lost"] = False  # NVML answered every call for it
        gpu["nvlink"] = [{"link": n, "up": True} for n in range(18)]
        gpu["nvlink_errors"] = {  # every counter read twice, 2 s apart, with no growth
            "window_s": 2.0,
            "links": [
                dict(
                    {name: {"first": 0, "second": 0, "unavailable": {}} for name, _, _ in COUNTERS},
                    link=n,
                    unavailable={},
                )
                for n in range(18)
            ],
            "unavailable": {},
        }
        gpu["unavailable"] = {key: gpu["unavailable"][key] for key in ("retired_pages", "platform")}
    facts["system"] = healthy_system()
    facts["fabric"] = section("fabric", "fabric", TREE)
    facts["storage"] = section("storage", "storage", TREE)
    facts["kernel_log"] = _quiet_log("kernel_log")
    facts["fabric_manager"] = _quiet_log("fabric_manager")
    facts["memory_reclaim"] = _reclaim_nothing(facts["gpus"])
    # DCGM and GPUd are not installed on this node: their probes record that and read nothing.
    facts.update(probe("dcgm")[0])
    facts.update(probe("gpud")[0])
    facts.update(probe("imex")[0])  # nor is the node in an IMEX domain
    return facts


def write_facts(folder: Path, **docs: dict[str, Any]) -> Path:
    """Save facts documents as <host>.json for `pytest --facts folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, doc in docs.items():
        (folder / f"{name}.json").write_text(json.dumps(doc))
    return folder


# Checks that rightly skip on the healthy baseline, and why: it is an H100 (row remapping, not
# page retirement) with no fabric, no storage paths, no DCGM/GPUd, judged without load tests;
# its nvidia-smi text sample predates the Fabric block, so no GPU reports a clique.
BASELINE_SKIPS = {
    "retired_pages": "not supported",
    "memlock_limit": "no minimum (fabric none",
    "storage_paths": "no storage_paths configured",
    "distributed_mounts": "no network filesystem mounted",
    "dcgm_health": "DCGM not expected",
    "gpud_health": "GPUd not expected",
    "gpud_events": "GPUd not expected",
    "imex_service": "IMEX not required here (imex_required: false",
    "imex_domain": "IMEX not required here (imex_required: false",
    "nvlink_clique": "no GPU reported a clique and cluster UUID",
}


def expected_baseline_skip(name: str) -> str | None:
    """Why check `name` skips on the healthy baseline (a text its message holds), or None."""
    chk = registry.check(name)
    if chk.family == "fabric":
        return "not an"
    if chk.family == "history":
        return "no run history given"
    if chk.level != "quick":
        return "is a load test"
    return BASELINE_SKIPS.get(name)
