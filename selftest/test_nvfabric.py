"""The NVLink fabric: parsers, the NVML reader, the checks and triage, on the real Blackwell
samples (selftest/data/nvfabric/SOURCE.md), edits of them, and the fake NVML's GB200 trays."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pynvml
import pytest
from hypothesis import strategies as st

from gpuhealth import registry
from gpuhealth.checks import Finding, NodeView, judged
from gpuhealth.evidence import facts_from_file
from gpuhealth.families.gpu import parse_fabric, parse_smi_text
from gpuhealth.parsing import ParseError
from gpuhealth.results import Status
from selftest.facts import limits
from selftest.fakenvml import nvml_env, write_scenario
from selftest.mutations import garbled, mutated
from selftest.test_fuzz import EXAMPLES, fuzz, parses_or_refuses
from selftest.test_probe_nvml import run_probe, unexplained_nulls
from selftest.test_scenarios import HOST, suite_on

DATA = Path(__file__).parent / "data"
GB200 = DATA / "nvfabric" / "nvsmi-qx-gb200-k8stestinfra.xml"
B200 = DATA / "nvfabric" / "nvsmi-qx-b200-k8stestinfra.xml"
H100 = DATA / "nvfabric" / "nvsmi-qx-h100-k8stestinfra.xml"
NCCL = DATA / "nvfabric" / "nccl-info-mnnvl-fabric-gb200-nccl-issue1769-fragment.txt"
H100_TEXT = DATA / "nvidia-smi" / "gpud_h100x8_535.161.08_query.txt"
# The fabric registration checks (nvlink_errors, the family's other check, has its own tests:
# selftest/test_nvlink_errors.py).
FABRIC_CHECKS = [
    c.name
    for c in registry.checks().values()
    if c.family == "nvfabric" and c.name != "nvlink_errors"
]
MULTINODE = {"profile": "gb200", "nvlink_multinode": True}
PLACEHOLDER_UUID = "00000001-0000-0000-0000-000000000001"  # the sample's scrubbed clusterUuid


def outcomes(facts: dict[str, Any], profile: str, **overrides: Any) -> dict[Any, Finding]:
    """Every registered check on one node's facts: (check, gpu index or None) -> finding."""
    view = NodeView("node17", facts, limits(profile, **overrides))
    found = judged(list(registry.checks().values()), view, len(facts["gpus"] or []))
    return {(f.check, f.gpu): f for f in found}


def failing(found: dict[Any, Finding]) -> set[Any]:
    return {key for key, finding in found.items() if finding.status is Status.FAIL}


def fabric_findings(found: dict[Any, Finding]) -> dict[Any, Finding]:
    return {key: f for key, f in found.items() if key[0] in FABRIC_CHECKS}


def xml_facts(tmp_path: Path, text: str) -> dict[str, Any]:
    """The facts `gpuhealth triage` builds from a saved `nvidia-smi -q -x`."""
    path = tmp_path / "qx.xml"
    path.write_text(text)
    kind, facts = facts_from_file(path)
    assert kind.name == "nvidia-smi -q -x"
    return facts


def on_gpu(text: str, gpu: int, old: str, new: str) -> str:
    """`old` -> `new` inside the `<fabric>` block of GPU `gpu` only."""
    start = [m.start() for m in re.finditer("<fabric>", text)][gpu]
    end = text.index("</fabric>", start)
    block = text[start:end]
    assert old in block, (gpu, old)
    return text[:start] + block.replace(old, new, 1) + text[end:]


# ---------------------------------------------------------------- the real samples


def healthy_fabric(clique: int, cluster: str, config_gap: str) -> dict[str, Any]:
    """A registered GPU's fabric record: Completed/Success in `clique` of `cluster`, healthy,
    its incorrect-configuration field not reported (`config_gap` says by whom)."""
    return {
        "state": "Completed",
        "status": "Success",
        "clique_id": clique,
        "cluster_uuid": cluster,
        "health": {
            "summary": "Healthy",
            "bandwidth": "Full",
            "route_recovery_in_progress": False,
            "route_unhealthy": False,
            "access_timeout_recovery": False,
            "incorrect_configuration": None,
            "unavailable": {
                "incorrect_configuration": {"kind": "not_supported", "detail": config_gap}
            },
        },
        "unavailable": {},
    }


def test_gb200_sample_is_in_clique_2_of_its_cluster_and_passes(tmp_path):
    facts = xml_facts(tmp_path, GB200.read_text())
    assert facts["gpus"][0]["fabric"] == healthy_fabric(2, PLACEHOLDER_UUID, "nvidia-smi: N/A")
    assert all(g["fabric"] == facts["gpus"][0]["fabric"] for g in facts["gpus"])
    found = fabric_findings(outcomes(facts, **MULTINODE))
    assert len(found) == 1 + 2 * 4
    assert {f.status for f in found.values()} == {Status.PASS}, [f.text for f in found.values()]
    clique = found[("nvlink_clique", None)].result.message
    assert clique == f"all 4 GPUs in NVLink clique 2 of cluster {PLACEHOLDER_UUID}"
    health = found[("nvlink_fabric_health", 3)].result.message
    assert (
        health
        == "NVLink fabric health Healthy, no condition (incorrect_configuration not reported)"
    )


def test_b200_sample_in_clique_0_passes_on_single_node_hgx_only(tmp_path):
    facts = xml_facts(tmp_path, B200.read_text())
    assert len(facts["gpus"]) == 8
    for gpu in facts["gpus"]:
        fabric = gpu["fabric"]
        assert (fabric["clique_id"], fabric["cluster_uuid"]) == (0, parse_fabric.ZERO_UUID)
        assert fabric["health"]["summary"] == "Healthy"
        assert fabric["health"]["access_timeout_recovery"] is False
        assert fabric["health"]["unavailable"]["route_unhealthy"]["kind"] == "not_supported"
    found = fabric_findings(outcomes(facts, "b200"))
    assert {f.status for f in found.values()} == {Status.PASS}, [f.text for f in found.values()]
    assert "single-node NVLink (nvlink_multinode: false)" in found[("nvlink_clique", None)].text
    # The same board claimed for a multi-node NVLink rack is out of its domain.
    multi = fabric_findings(outcomes(facts, "b200", nvlink_multinode=True))
    assert failing(multi) == {("nvlink_clique", None)}
    assert "not in an NVLink domain" in multi[("nvlink_clique", None)].text


def test_h100_sample_passes_with_every_health_field_na(tmp_path):
    facts = xml_facts(tmp_path, H100.read_text())
    fabric = facts["gpus"][5]["fabric"]
    assert (fabric["state"], fabric["status"], fabric["clique_id"]) == ("Completed", "Success", 0)
    assert fabric["health"] is None
    assert fabric["unavailable"]["health"] == {"kind": "not_supported", "detail": "nvidia-smi: N/A"}
    found = fabric_findings(outcomes(facts, "h100-sxm"))
    assert {f.status for f in found.values()} == {Status.PASS}
    assert found[("nvlink_fabric_health", 0)].result.message.startswith(
        "Hopper GPUs report no fabric health (nvidia-smi: N/A)"
    )


def test_the_535_text_sample_has_state_and_status_only():
    doc = parse_smi_text.parse(H100_TEXT.read_text())
    fabric = doc["gpus"][7]["fabric"]
    assert (fabric["state"], fabric["status"]) == ("Completed", "Success")
    absent = {"kind": "absent", "detail": "not in nvidia-smi -q output"}
    assert fabric["unavailable"] == dict.fromkeys(("clique_id", "cluster_uuid", "health"), absent)


@pytest.mark.parametrize(
    "name",
    [
        "telegraf_a100-sxm4-80gb_535.54.03_mig_v12.xml",
        "telegraf_rtx3060_570.124.04_v12.xml",
        "telegraf_rtx4000-sff-ada_595.84_v13.xml",
        "telegraf_tesla-t4_515.105.01_v11.xml",
    ],
)
def test_gpus_without_a_fabric_are_not_judged(name):
    """Ampere, Ada and Turing samples: `State : N/A` or no Fabric block at all."""
    kind, facts = facts_from_file(DATA / "nvidia-smi" / name)
    for gpu in facts["gpus"]:
        assert gpu["fabric"] is None
        assert gpu["unavailable"]["fabric"]["kind"] in ("not_supported", "absent")
    found = fabric_findings(outcomes(facts, "default"))
    assert {f.status for f in found.values() if f.gpu is not None} == {Status.SKIP}


def test_nccl_health_mask_0xaa_is_every_condition_false():
    masks = {int(m, 16) for m in re.findall(r"healthMask (0x[0-9a-f]+)", NCCL.read_text())}
    assert masks == {0xAA}
    health = parse_fabric.decode_health(0xAA, None, "nccl", "NCCL logs no summary")
    assert health == {
        "summary": None,
        "bandwidth": "Full",
        "route_recovery_in_progress": False,
        "route_unhealthy": False,
        "access_timeout_recovery": False,
        "incorrect_configuration": None,
        "unavailable": {
            "summary": {"kind": "not_supported", "detail": "NCCL logs no summary"},
            "incorrect_configuration": {
                "kind": "not_supported",
                "detail": "nccl: health mask 0xaa does not report it",
            },
        },
    }


def test_the_decoding_tables_are_nvidia_ml_pys():
    """parse_fabric spells out nvidia-ml-py's values (a node may have no pynvml): the same."""
    mask = "NVML_GPU_FABRIC_HEALTH_MASK_"
    names = {
        "bandwidth": "DEGRADED_BW",
        "route_recovery_in_progress": "ROUTE_RECOVERY",
        "route_unhealthy": "ROUTE_UNHEALTHY",
        "access_timeout_recovery": "ACCESS_TIMEOUT_RECOVERY",
    }
    for key, name in names.items():
        assert parse_fabric.CONDITION_SHIFTS[key] == getattr(pynvml, f"{mask}SHIFT_{name}")
        assert parse_fabric.CONDITION_WIDTH == getattr(pynvml, f"{mask}WIDTH_{name}")
        assert parse_fabric.MASK_NOT_SUPPORTED == getattr(pynvml, f"{mask}{name}_NOT_SUPPORTED")
        assert parse_fabric.MASK_TRUE == getattr(pynvml, f"{mask}{name}_TRUE")
        assert parse_fabric.MASK_FALSE == getattr(pynvml, f"{mask}{name}_FALSE")
    assert parse_fabric.INCORRECT_CONFIGURATION_SHIFT == getattr(
        pynvml, f"{mask}SHIFT_INCORRECT_CONFIGURATION"
    )
    assert parse_fabric.INCORRECT_CONFIGURATION_WIDTH == getattr(
        pynvml, f"{mask}WIDTH_INCORRECT_CONFIGURATION"
    )
    prefix = f"{mask}INCORRECT_CONFIGURATION_"
    values = {k[len(prefix) :]: v for k, v in vars(pynvml).items() if k.startswith(prefix)}
    assert values.pop("NOT_SUPPORTED") == 0 and values["NONE"] == 1
    assert set(values.values()) == set(parse_fabric.INCORRECT_CONFIGURATIONS)
    assert parse_fabric.INCORRECT_CONFIGURATIONS[1] == "None"
    assert parse_fabric.STATES == {
        pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "Not Started",
        pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "In Progress",
        pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "Completed",
    }
    assert pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED == parse_fabric.STATE_NOT_SUPPORTED
    assert parse_fabric.SUMMARIES == {
        pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY: "Healthy",
        pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY: "Unhealthy",
        pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY: "Limited Capacity",
    }


# ---------------------------------------------------------------- faults: edits of the GB200 sample

# (name, GPU, old, new, the check that fails, on which GPU, action, words of the message)
VARIANTS = [
    (
        "insufficient-resources",
        1,
        "<status>Success<",
        "<status>Insufficient Resources<",
        ("nvlink_fabric_state", 1),
        "RESET_GPU",
        "NVLink fabric state Completed but status Insufficient Resources, expected Success",
    ),
    (
        "not-started",
        0,
        "<state>Completed<",
        "<state>Not Started<",
        ("nvlink_fabric_state", 0),
        "FIX_CONFIG",
        "NVLink fabric state Not Started, expected Completed",
    ),
    (
        "in-progress",
        3,
        "<state>Completed<",
        "<state>In Progress<",
        ("nvlink_fabric_state", 3),
        "RERUN",
        "NVLink fabric state In Progress, expected Completed",
    ),
    (
        "summary-unhealthy",
        0,
        "<summary>Healthy<",
        "<summary>Unhealthy<",
        ("nvlink_fabric_health", 0),
        "INSPECT",
        "NVLink fabric health Unhealthy, expected Healthy with no condition",
    ),
    (
        "bandwidth-degraded",
        3,
        "<bandwidth>Full<",
        "<bandwidth>Degraded<",
        ("nvlink_fabric_health", 3),
        "INSPECT",
        "NVLink fabric health Healthy: bandwidth Degraded, expected Healthy",
    ),
    (
        "route-recovery",
        2,
        "<route_recovery_in_progress>False<",
        "<route_recovery_in_progress>True<",
        ("nvlink_fabric_health", 2),
        "DRAIN",
        "health Healthy: route recovery in progress, expected",
    ),
    (
        "route-unhealthy",
        2,
        "<route_unhealthy>False<",
        "<route_unhealthy>True<",
        ("nvlink_fabric_health", 2),
        "INSPECT",
        "health Healthy: route unhealthy, expected",
    ),
    (
        "access-timeout",
        0,
        "<access_timeout_recovery>False<",
        "<access_timeout_recovery>True<",
        ("nvlink_fabric_health", 0),
        "RESET_GPU",
        "health Healthy: access timeout recovery, expected",
    ),
    (
        "incorrect-configuration",
        1,
        "<incorrect_configuration>N/A<",
        "<incorrect_configuration>Insufficient NVLinks<",
        ("nvlink_fabric_health", 1),
        "FIX_CONFIG",
        "health Healthy: incorrect configuration: Insufficient NVLinks, expected",
    ),
    (
        "other-clique",
        3,
        "<cliqueId>2<",
        "<cliqueId>3<",
        ("nvlink_clique", None),
        "RESET_GPU",
        f"GPUs of one node in different NVLink domains: gpu0, gpu1, gpu2: clique 2, cluster "
        f"{PLACEHOLDER_UUID}; gpu3: clique 3, cluster {PLACEHOLDER_UUID}",
    ),
]


@pytest.fixture(scope="module")
def gb200_failing(tmp_path_factory) -> set[Any]:
    """What fails on the unedited GB200 sample (none of the fabric checks, see above)."""
    facts = xml_facts(tmp_path_factory.mktemp("gb200"), GB200.read_text())
    found = outcomes(facts, **MULTINODE)
    assert not {key for key in failing(found) if key[0] in FABRIC_CHECKS}
    return failing(found)


@pytest.mark.parametrize(
    ("gpu", "old", "new", "check", "action", "words"),
    [variant[1:] for variant in VARIANTS],
    ids=[variant[0] for variant in VARIANTS],
)
def test_one_fault_fails_exactly_its_check(
    tmp_path, gb200_failing, gpu, old, new, check, action, words
):
    facts = xml_facts(tmp_path, on_gpu(GB200.read_text(), gpu, old, new))
    found = outcomes(facts, **MULTINODE)
    assert failing(found) - gb200_failing == {check}
    assert gb200_failing <= failing(found)
    finding = found[check]
    assert words in finding.result.message
    assert finding.action == action and finding.advice
    where = "node17" if check[1] is None else f"node17 gpu{gpu} (GPU-"
    assert finding.text.startswith(where) and f". Action {action}: " in finding.text


def test_a_tray_in_clique_0_is_out_of_its_nvlink_domain(tmp_path, gb200_failing):
    text = GB200.read_text().replace("<cliqueId>2<", "<cliqueId>0<")
    text = text.replace(PLACEHOLDER_UUID, parse_fabric.ZERO_UUID)
    found = outcomes(xml_facts(tmp_path, text), **MULTINODE)
    assert failing(found) - gb200_failing == {("nvlink_clique", None)}
    finding = found[("nvlink_clique", None)]
    assert finding.result.message.startswith(
        "not in an NVLink domain: gpu0, gpu1, gpu2, gpu3: clique 0, cluster "
        f"{parse_fabric.ZERO_UUID}; expected one non-zero clique and cluster UUID "
        "(nvlink_multinode: true)"
    )
    assert finding.action == "FIX_CONFIG"
    # The gb200 profile says the tray is multi-node: it fails there too ...
    assert outcomes(xml_facts(tmp_path, text), "gb200")[("nvlink_clique", None)].status is (
        Status.FAIL
    )
    # ... and an inventory that says otherwise (single-node NVLink) passes it.
    single = outcomes(xml_facts(tmp_path, text), "gb200", nvlink_multinode=False)
    assert single[("nvlink_clique", None)].status is Status.PASS


def test_an_unknown_blackwell_health_summary_never_passes(tmp_path):
    na = on_gpu(GB200.read_text(), 2, "<summary>Healthy<", "<summary>N/A<")
    found = outcomes(xml_facts(tmp_path, na), **MULTINODE)
    warned = found[("nvlink_fabric_health", 2)]
    assert warned.status is Status.WARN and warned.action == "FIX_CONFIG"
    assert warned.result.message == (
        "NVLink fabric health summary not reported on a Blackwell GPU (nvidia-smi: N/A); the "
        "conditions reported are clear"
    )
    unread = on_gpu(GB200.read_text(), 1, "<summary>Healthy<", "<summary>[Unknown Error]<")
    found = outcomes(xml_facts(tmp_path, unread), **MULTINODE)
    assert found[("nvlink_fabric_health", 1)].status is Status.FAIL
    assert found[("nvlink_fabric_health", 1)].action == "RERUN"
    # A saved log without the line is not evaluated; a live probe without it is not vouched for.
    cut = on_gpu(GB200.read_text(), 0, "<summary>Healthy</summary>", "")
    facts = xml_facts(tmp_path, cut)
    assert outcomes(facts, **MULTINODE)[("nvlink_fabric_health", 0)].status is Status.SKIP
    facts["source"] = "nvidia-smi"
    assert outcomes(facts, **MULTINODE)[("nvlink_fabric_health", 0)].status is Status.WARN


def test_facts_from_before_the_fabric_record_are_not_evaluated(tmp_path):
    facts = xml_facts(tmp_path, GB200.read_text())
    for gpu in facts["gpus"]:
        del gpu["fabric"]
    found = fabric_findings(outcomes(facts, **MULTINODE))
    assert {f.status for f in found.values()} == {Status.SKIP}
    assert all("predate the GPU fabric record" in f.result.message for f in found.values())


def test_no_fabric_on_a_multinode_profile_fails(tmp_path):
    text = on_gpu(GB200.read_text(), 1, "<state>Completed<", "<state>N/A<")
    facts = xml_facts(tmp_path, text)
    assert facts["gpus"][1]["unavailable"]["fabric"] == {
        "kind": "not_supported",
        "detail": "nvidia-smi: N/A (no NVLink fabric on this GPU)",
    }
    found = outcomes(facts, **MULTINODE)
    for check in ("nvlink_fabric_state", "nvlink_fabric_health"):
        assert found[(check, 1)].status is Status.FAIL
        assert found[(check, 1)].action == "FIX_CONFIG"
    clique = found[("nvlink_clique", None)]  # gpu1 is in no clique
    assert clique.status is Status.FAIL and clique.action == "FIX_CONFIG"
    assert clique.result.message.startswith("the NVLink fabric of gpu1 not supported")
    single = outcomes(facts, "b200")
    assert single[("nvlink_fabric_state", 1)].status is Status.SKIP


def test_single_node_nvlink_with_no_clique_reported_is_not_passed(tmp_path):
    text = GB200.read_text()
    for index in range(4):
        text = on_gpu(text, index, "<state>Completed<", "<state>N/A<")
    found = outcomes(xml_facts(tmp_path, text), "b200")
    clique = found[("nvlink_clique", None)]
    assert clique.status is Status.SKIP, clique.text
    assert "no GPU reported a clique and cluster UUID" in clique.text


# ---------------------------------------------------------------- pasted `grep -A8 Fabric`


def grep_after(text: str, word: str, after: int) -> str:
    """What `grep -A<after> <word>` prints: each matching line and the `after` lines after it,
    groups that do not touch separated by a `--` line."""
    lines = text.splitlines()
    keep = sorted(
        {
            j
            for i, line in enumerate(lines)
            if word in line
            for j in range(i, min(i + after + 1, len(lines)))
        }
    )
    out: list[str] = []
    for position, j in enumerate(keep):
        if position and j != keep[position - 1] + 1:
            out.append("--")
        out.append(lines[j])
    return "\n".join(out) + "\n"


# One GPU of `nvidia-smi -q` on a 580 driver around its Fabric block, in the text layout of
# the real samples (labels as 580-era outputs print them); values are the GB200 sample's.
GPU_TEXT = """\
GPU {bus}
    Product Name                          : NVIDIA GB200
    Product Architecture                  : Blackwell
    GPU Fabric GUID                       : 0x{guid:016x}
    Inforom Version
        Image Version                     : G548.0201.00.04
        OEM Object                        : 2.1
        ECC Object                        : 7.16
        Power Management Object           : N/A
        Inforom BBX Object Flush
            Latest Timestamp              : N/A
            Latest Duration               : N/A
    Inforom Reserved                      : N/A
    Fabric
        State                             : Completed
        Status                            : Success
        CliqueId                          : 2
        ClusterUUID                       : 00000001-0000-0000-0000-000000000001
        Health
            Summary                       : {summary}
            Bandwidth                     : Full
            Route Recovery in progress    : False
            Route Unhealthy               : {route_unhealthy}
            Access Timeout Recovery       : False
            Incorrect Configuration       : N/A
    Processes                             : None
"""
TRAY_BUSES = ("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0")


def gb200_text(unhealthy_gpu: int | None = None) -> str:
    """The four GPUs of a tray; `unhealthy_gpu` has an unhealthy route."""
    return "".join(
        GPU_TEXT.format(
            bus=bus,
            guid=0x6D9419000347BB4C + index,
            summary="Unhealthy" if index == unhealthy_gpu else "Healthy",
            route_unhealthy="True" if index == unhealthy_gpu else "False",
        )
        + "\n"
        for index, bus in enumerate(TRAY_BUSES)
    )


def test_grep_fragment_of_a_gb200_tray():
    pasted = grep_after(gb200_text(), "Fabric", 8)
    assert pasted.count("GPU Fabric GUID") == 4 and "--\n" in pasted
    assert "Route Unhealthy" not in pasted  # -A8 ends at "Route Recovery in progress"
    doc = parse_smi_text.parse_fabric_fragment(pasted)
    assert doc["gpu_count"] is None and len(doc["gpus"]) == 4
    fabric = doc["gpus"][3]["fabric"]
    assert (fabric["state"], fabric["status"], fabric["clique_id"]) == ("Completed", "Success", 2)
    assert fabric["health"]["summary"] == "Healthy"
    assert fabric["health"]["unavailable"]["route_unhealthy"] == {
        "kind": "absent",
        "detail": "not in the pasted Fabric lines of nvidia-smi -q",
    }
    assert [g["pci_bus_id"] for g in doc["gpus"]] == [None] * 4  # no "GPU ..." line pasted
    assert unexplained_nulls(doc["gpus"]) == []


def test_grep_fragment_of_the_535_h100_sample_names_the_gpus_it_shows():
    pasted = grep_after(H100_TEXT.read_text(), "Fabric", 8)
    doc = parse_smi_text.parse_fabric_fragment(pasted)
    full = parse_smi_text.parse(H100_TEXT.read_text())
    # The header of the next GPU falls inside each block's 8 lines; the first one's does not.
    assert [g["pci_bus_id"] for g in doc["gpus"]] == [None] + [
        g["pci_bus_id"] for g in full["gpus"][1:]
    ]
    assert [g["fabric"] for g in doc["gpus"]] == [
        dict(g["fabric"], unavailable=doc["gpus"][0]["fabric"]["unavailable"]) for g in full["gpus"]
    ]


@pytest.mark.parametrize(
    "text", ["", "    Fabric\n", "Fabric : Completed\n", "GPU Fabric GUID : 0x1\n    State : x\n"]
)
def test_text_without_a_fabric_block_is_refused(text):
    with pytest.raises(ParseError):
        parse_smi_text.parse_fabric_fragment(text)


def triage(path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuhealth.cli", "triage", str(path), "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, json.loads(proc.stdout or "{}"), proc.stderr


def test_triage_of_pasted_fabric_lines(tmp_path):
    """As a user pastes them into a ticket, judged by a GB200 NVL profile of their own."""
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "gb200-nvl.yml").write_text(
        "description: GB200 tray of an NVL72 rack\nextends: gb200\nnvlink_multinode: true\n"
    )
    args = ("--profile-dir", str(profiles), "--profile", "gb200-nvl")
    healthy = tmp_path / "fabric.txt"
    healthy.write_text(grep_after(gb200_text(), "Fabric", 8))
    rc, doc, err = triage(healthy, *args)
    assert rc == 0, (doc, err)
    fabric = [f for f in doc["findings"] if f["check"] in FABRIC_CHECKS]
    assert len(fabric) == 9 and {f["status"] for f in fabric} == {"PASS"}
    unhealthy = tmp_path / "fabric-gpu2.txt"
    unhealthy.write_text(grep_after(gb200_text(unhealthy_gpu=2), "Fabric", 8))
    rc, doc, err = triage(unhealthy, *args)
    assert rc == 1, (doc, err)
    failed = [f for f in doc["findings"] if f["status"] == "FAIL"]
    assert [(f["check"], f["gpu"]) for f in failed] == [("nvlink_fabric_health", 2)]
    assert "NVLink fabric health Unhealthy, expected Healthy" in failed[0]["message"]


# ---------------------------------------------------------------- NVML, under the fake library

NVML_RUNS: dict[str, Any] = {
    "healthy": "gb200-tray-healthy",
    "out-of-domain": "gb200-tray-out-of-domain",
    "unhealthy": "gb200-fabric-unhealthy-gpu2",
    "h100": "healthy-h100x8",
    "v2-driver": {"extends": "gb200-tray-healthy", "fabric_info_version": 2},
    "no-v-call": {
        "extends": "gb200-tray-healthy",
        "fn": {"nvmlDeviceGetGpuFabricInfoV": "ERROR:13"},  # FUNCTION_NOT_FOUND
    },
    "no-fabric-calls": {
        "extends": "gb200-tray-healthy",
        "fn": {"nvmlDeviceGetGpuFabricInfoV": "ERROR:13", "nvmlDeviceGetGpuFabricInfo": "ERROR:13"},
    },
    "quirks": {
        "extends": "gb200-tray-healthy",
        "gpu": {
            0: {"fabric": {"clique_id": "ERROR:999"}},
            1: {"fabric": {"status": 23}},  # NVML_ERROR_INSUFFICIENT_RESOURCES
            2: {"fabric": {"health_mask": 0xAB}},  # degraded bandwidth 3: no such value
            3: {"fabric": {"state": 0}},  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
        },
    },
}


@pytest.fixture(scope="module")
def nvml(fake_nvml_lib, tmp_path_factory) -> dict[str, dict[str, Any]]:
    """nvml.collect() of every run above, each in a fresh interpreter (pynvml loads the
    library once per process), side by side."""
    folder = tmp_path_factory.mktemp("nvml")

    def run(name: str) -> dict[str, Any]:
        result = run_probe(fake_nvml_lib, write_scenario(NVML_RUNS[name], folder / f"{name}.txt"))
        result["facts"] = dict(result.pop("r"), source="nvml")
        return result

    with ThreadPoolExecutor(len(NVML_RUNS)) as pool:
        return dict(zip(NVML_RUNS, pool.map(run, NVML_RUNS), strict=True))


def gpu_findings(facts: dict[str, Any]) -> dict[Any, Finding]:
    """The GPU and NVLink fabric families' checks on an NVML facts fragment, as a GB200 tray
    of an NVL rack (the other families read sections this fragment does not have)."""
    view = NodeView("node17", facts, limits(**MULTINODE))
    checks = [c for c in registry.checks().values() if c.family in ("gpu", "nvfabric")]
    return {(f.check, f.gpu): f for f in judged(checks, view, 4)}


WHOLE_PROBE = """
import json, pynvml
inits = []
init = pynvml.nvmlInit
pynvml.nvmlInit = lambda: inits.append(1) or init()
from gpuhealth.probe.main import collect
from selftest.facts import probe_config
doc = collect(probe_config(kernel_log_timeout_s=1, nvlink_error_window_s=0))
print(json.dumps({"inits": len(inits), "source": doc["source"], "gpus": doc["gpus"]}))
"""


def test_the_probe_reads_the_fabric_in_the_gpu_family_s_nvml_pass(fake_nvml_lib, tmp_path):
    """The family's own node side (nvfabric/probe.py: GPU_READS) fills each GPU record's
    fabric in the pass of the GPU family, which it NEEDS, over that family's session: one
    nvmlInit for the whole probe."""
    scenario = write_scenario(NVML_RUNS["healthy"], tmp_path / "tray.txt")
    proc = subprocess.run(
        [sys.executable, "-c", WHOLE_PROBE],
        capture_output=True,
        text=True,
        env=nvml_env(fake_nvml_lib.parent, scenario),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert (found["inits"], found["source"]) == (1, "nvml")
    fabrics = [gpu["fabric"] for gpu in found["gpus"]]
    assert [(f["state"], f["status"]) for f in fabrics] == [("Completed", "Success")] * 4
    assert unexplained_nulls(found["gpus"]) == []


def test_nvml_reads_a_healthy_gb200_tray(nvml):
    result = nvml["healthy"]
    assert result["errors"] == []
    assert "nvmlDeviceGetGpuFabricInfo" not in result["symbols"]
    gpus = result["facts"]["gpus"]
    assert [g["pci_bus_id"] for g in gpus] == list(TRAY_BUSES)
    assert {g["architecture"] for g in gpus} == {"Blackwell"}
    mask = "nvmlDeviceGetGpuFabricInfoV(gpu=1, v3): health mask 0xaa does not report it"
    assert gpus[1]["fabric"] == healthy_fabric(32766, "3143b15b-c2cd-192b-28cc-9b5473fb5b93", mask)
    assert unexplained_nulls(gpus) == []


def test_nvml_on_hopper_has_no_fabric_health(nvml):
    fabric = nvml["h100"]["facts"]["gpus"][0]["fabric"]
    assert (fabric["clique_id"], fabric["cluster_uuid"]) == (0, parse_fabric.ZERO_UUID)
    assert fabric["health"] is None
    why = fabric["unavailable"]["health"]
    assert why["kind"] == "not_supported"
    assert why["detail"].startswith("nvmlDeviceGetGpuFabricInfoV(gpu=0, v3): summary not supported")


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        ("healthy", set()),
        ("out-of-domain", {("nvlink_clique", None)}),
        ("unhealthy", {("nvlink_fabric_health", 2)}),
    ],
)
def test_each_gb200_scenario_fails_exactly_its_check(nvml, run, expected):
    found = gpu_findings(nvml[run]["facts"])
    assert failing(found) == expected, [found[key].text for key in failing(found)]
    assert not [f.text for f in found.values() if f.status is Status.WARN]


def test_a_driver_without_the_v3_struct_gives_the_mask_without_summary(nvml):
    health = nvml["v2-driver"]["facts"]["gpus"][0]["fabric"]["health"]
    assert health["route_unhealthy"] is False and health["summary"] is None
    assert health["unavailable"]["summary"]["detail"] == (
        "nvmlDeviceGetGpuFabricInfoV(gpu=0, v2): the v2 struct has no health summary (the "
        "driver refused v3)"
    )
    finding = gpu_findings(nvml["v2-driver"]["facts"])[("nvlink_fabric_health", 0)]
    assert finding.status is Status.WARN and finding.action == "FIX_CONFIG"


def test_without_the_v_call_the_deprecated_one_gives_no_health(nvml):
    result = nvml["no-v-call"]
    assert "nvmlDeviceGetGpuFabricInfo" in result["symbols"] and result["errors"] == []
    fabric = result["facts"]["gpus"][3]["fabric"]
    assert (fabric["state"], fabric["clique_id"]) == ("Completed", 32766)
    assert fabric["health"] is None
    assert fabric["unavailable"]["health"] == {
        "kind": "not_supported",
        "detail": "nvmlDeviceGetGpuFabricInfo(gpu=3) reports no health "
        "(nvmlDeviceGetGpuFabricInfoV(gpu=3, v3): Function Not Found)",
    }
    found = gpu_findings(result["facts"])
    assert failing(found) == set()
    assert found[("nvlink_fabric_health", 3)].status is Status.WARN  # never a silent pass


def test_a_driver_without_either_fabric_call_says_so(nvml):
    result = nvml["no-fabric-calls"]
    assert result["errors"] == []  # not supported is no failure of the probe
    gpu = result["facts"]["gpus"][0]
    assert gpu["unavailable"]["fabric"] == {
        "kind": "not_supported",
        "detail": "nvmlDeviceGetGpuFabricInfo(gpu=0): Function Not Found; "
        "nvmlDeviceGetGpuFabricInfoV(gpu=0, v3): Function Not Found",
    }
    found = gpu_findings(result["facts"])  # a GB200 NVL profile expects the fabric
    assert {
        found[(check, 0)].action for check in ("nvlink_fabric_state", "nvlink_fabric_health")
    } == {"FIX_CONFIG"}


def test_nvml_quirks_fail_the_gpu_they_hit(nvml):
    result = nvml["quirks"]
    gpus = result["facts"]["gpus"]
    assert gpus[0]["unavailable"]["fabric"] == {
        "kind": "error",
        "detail": "nvmlDeviceGetGpuFabricInfoV(gpu=0, v3): Unknown Error",
    }
    assert result["errors"] == [
        {
            "probe": "nvml",
            "call": "nvmlDeviceGetGpuFabricInfoV(gpu=0, v3)",
            "error": "Unknown Error",
        }
    ]
    assert gpus[1]["fabric"]["status"] == "Insufficient Resources"
    assert gpus[2]["fabric"]["health"]["unavailable"]["bandwidth"] == {
        "kind": "error",
        "detail": "nvmlDeviceGetGpuFabricInfoV(gpu=2, v3): health mask 0xab has the undefined "
        "value 3",
    }
    assert gpus[3]["unavailable"]["fabric"]["kind"] == "not_supported"
    assert unexplained_nulls(gpus) == []
    found = gpu_findings(result["facts"])
    actions = {key: found[key].action for key in failing(found)}
    assert actions == {
        ("nvlink_fabric_state", 0): "RERUN",
        ("nvlink_fabric_health", 0): "RERUN",
        ("nvlink_fabric_state", 1): "RESET_GPU",
        ("nvlink_fabric_health", 2): "RERUN",
        ("nvlink_fabric_state", 3): "FIX_CONFIG",
        ("nvlink_fabric_health", 3): "FIX_CONFIG",
        ("nvlink_clique", None): "RERUN",
    }


# ---------------------------------------------------------------- the suite on the fake trays


@pytest.mark.suite
def test_the_suite_fails_exactly_each_gb200_scenarios_tests(fake_nvml_lib, tmp_path):
    """The real suite, probe and nvidia-ml-py on the fake GB200 trays, NVLink tests only (the
    system checks read the fixture tree of an HGX H100 host, not a GB200 tray's)."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    {HOST}:\n      gpu_profile: gb200\n      gpu_count: 4\n"
        "      nvlink_multinode: true\n"
    )
    expected = {
        "gb200-tray-healthy": set(),
        "gb200-tray-out-of-domain": {f"test_nvlink_clique[{HOST}]"},
        "gb200-fabric-unhealthy-gpu2": {f"test_nvlink_fabric_health[{HOST}-gpu2]"},
        "gb200-nvlink-errors-gpu1": {f"test_nvlink_errors[{HOST}-gpu1]"},
    }

    def run(name: str) -> Any:
        (tmp_path / name).mkdir()
        return suite_on(name, tmp_path / name, fake_nvml_lib, inventory, "-k", "nvlink")

    with ThreadPoolExecutor(len(expected)) as pool:
        runs = dict(zip(expected, pool.map(run, expected), strict=True))
    for name, found in runs.items():
        outcomes_ = found.outcomes()
        assert len(outcomes_) == 1 + 4 * 4, (name, found.output[-2000:])
        failed = {test for test, status in outcomes_.items() if status != "passed"}
        assert failed == expected[name], (name, found.output[-3000:])
        assert found.verdicts["nodes"][HOST]["verdict"] == ("FAIL" if failed else "PASS")
    entry = runs["gb200-tray-out-of-domain"].verdicts["nodes"][HOST]["failed"][0]
    assert (entry["check"], entry["gpu"], entry["action"]) == ("nvlink_clique", None, "FIX_CONFIG")
    assert "not in an NVLink domain" in entry["message"]
    entry = runs["gb200-fabric-unhealthy-gpu2"].verdicts["nodes"][HOST]["failed"][0]
    assert (entry["check"], entry["gpu"], entry["action"]) == ("nvlink_fabric_health", 2, "INSPECT")
    assert f"{HOST} gpu2 (GPU-" in entry["message"]
    assert "NVLink fabric health Unhealthy: route unhealthy" in entry["message"]
    entry = runs["gb200-nvlink-errors-gpu1"].verdicts["nodes"][HOST]["failed"][0]
    assert (entry["check"], entry["gpu"], entry["action"]) == ("nvlink_errors", 1, "INSPECT")
    assert (
        "link 7 symbol errors +3; link 11 successful link recoveries +1; "
        "link 11 link recovery events +1"
    ) in entry["message"]
    assert f"{HOST} gpu1 (GPU-" in entry["message"]


# ---------------------------------------------------------------- fuzzing the pasted lines

SEEDS = [
    grep_after(gb200_text(), "Fabric", 8),
    grep_after(gb200_text(unhealthy_gpu=1), "Fabric", 12),
    grep_after(H100_TEXT.read_text(), "Fabric", 8),
]


def test_the_fragment_parser_gives_facts_or_a_parse_error(record_property):
    strategy = st.sampled_from(SEEDS).flatmap(mutated)
    prop = parses_or_refuses(parse_smi_text.parse_fabric_fragment)
    record_property("fuzz_cases", fuzz(strategy, prop, EXAMPLES // 2))


def test_destroying_an_unhealthy_summary_never_gives_pass(record_property):
    """One GPU's block, Unhealthy with an unhealthy route: lines lost, cut or spoiled may make
    the fault unreadable, never healthy."""
    seed = grep_after(
        GPU_TEXT.format(bus=TRAY_BUSES[0], guid=1, summary="Unhealthy", route_unhealthy="True"),
        "Fabric",
        12,
    )
    view = limits(**MULTINODE)

    def never_pass(text: str) -> None:
        try:
            doc = parse_smi_text.parse_fabric_fragment(text)
        except ParseError:
            return
        facts = {"source": "evidence-file", **doc}
        node = NodeView("node17", facts, view)
        found = judged([registry.check("nvlink_fabric_health")], node, len(doc["gpus"]))
        assert all(f.status is not Status.PASS for f in found), [f.text for f in found]

    record_property("fuzz_cases", fuzz(st.just(seed).flatmap(garbled), never_pass, EXAMPLES // 2))


def test_a_fabric_state_not_reported_fails_on_multi_node_nvlink():
    """Review find: on gb200 a state (or status) printed N/A skipped, where a missing fabric
    record fails: multi-node NVLink needs the registration."""
    na = {"kind": "not_supported", "detail": "nvidia-smi printed N/A"}
    fabric = {"state": None, "status": None, "unavailable": {"state": na, "status": na}}
    gpu = {"index": 0, "name": "NVIDIA GB200", "architecture": "Blackwell", "fabric": fabric}
    facts = {"source": "nvml", "driver": {"loaded": True}, "gpu_count": 1, "gpus": [gpu]}
    found = outcomes(facts, "gb200", gpu_count=1)[("nvlink_fabric_state", 0)]
    assert found.status is Status.FAIL
    assert "NVLink fabric state not supported (nvidia-smi printed N/A)" in found.result.message
