"""The system family: parsers, the `system` sub-probe on fixture trees with stand-in tools,
the checks on the resulting facts, and the health suite end to end.

The fixture tree (data/system/hgx-h100-2socket) is a 2-socket 8-GPU HGX H100 node whose GPU bus
ids are those of the real 8x H100 nvidia-smi sample, so its `system` section joins with the
GPU records of `healthy_h100()`.
"""

from __future__ import annotations

import copy
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuhealth import registry
from gpuhealth.config import ConfigError, expectations_from_vars
from gpuhealth.families.system import parse_numactl as numactl
from gpuhealth.families.system import parse_proc as proc
from gpuhealth.families.system import probe as host
from gpuhealth.parsing import ParseError
from gpuhealth.transport import parse_output, probe_call
from selftest.facts import (
    PROFILES,
    healthy_h100,
    healthy_system,
    judge,
    probe,
    probe_config,
    write_facts,
)
from selftest.suite import ToolPath, run_suite

DATA = Path(__file__).parent / "data" / "system"
TREE = DATA / "hgx-h100-2socket"
NUMACTL_2NODE = DATA / "numactl" / "hgx-h100-2node.txt"
NUMACTL_VM = DATA / "numactl" / "debian12-vm-1node.txt"
SYSTEM_CHECKS = (
    "numa_topology",
    "numactl",
    "host_resources",
    "memlock_limit",
    "kernel_modules",
    "gpu_services",
)
ALL_ACTIVE = "\n".join(["active"] * len(host.UNITS)) + "\n"
ONLY_SYSTEM = ("-k", " or ".join(SYSTEM_CHECKS))  # suite runs limited to this family's tests


# ---------------------------------------------------------------- stand-in tools


class Tools(ToolPath):
    """The stand-in tools of this family's tests."""

    def numactl(self, sample: Path = NUMACTL_2NODE) -> None:
        self.add("numactl", f'[ "$1" = --hardware ] && exec /bin/cat {sample}\nexit 2\n')

    def systemctl(self, states: str = ALL_ACTIVE) -> None:
        """`systemctl is-active UNITS` printing one state per line, rc 0 only if all active."""
        out = self.folder / "systemctl.out"
        out.write_text(states)
        rc = 0 if set(states.split()) == {"active"} else 3
        self.add("systemctl", f'[ "$1" = is-active ] || exit 1\n/bin/cat {out}\nexit {rc}\n')


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Tools:
    return Tools(tmp_path / "bin", monkeypatch)


def tree_copy(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(TREE, root)
    return root


def collect(root: Path = TREE, **expect: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    sections, errors = probe("system", root, **expect)
    return sections["system"], errors


def healthy_node(**expect: Any) -> dict[str, Any]:
    """healthy_h100() facts (GPU bus ids of the real sample) with the fixture's system section."""
    facts = healthy_h100()
    facts["system"] = healthy_system(**expect)
    return facts


# ---------------------------------------------------------------- parsers


def test_numactl_parses_this_machines_real_output():
    parsed = numactl.parse_hardware(NUMACTL_VM.read_text())
    assert parsed["available_nodes"] == 1
    assert parsed["nodes"] == [
        {"node": 0, "cpus": "0-1", "cpu_count": 2, "size_mb": 4442, "free_mb": 3524}
    ]
    assert parsed["distances"] == [[10]]


def test_numactl_parses_a_two_socket_node():
    parsed = numactl.parse_hardware(NUMACTL_2NODE.read_text())
    assert parsed["available_nodes"] == 2
    assert [(n["node"], n["cpus"], n["cpu_count"]) for n in parsed["nodes"]] == [
        (0, "0-55,112-167", 112),
        (1, "56-111,168-223", 112),
    ]
    assert parsed["nodes"][1]["size_mb"] == 1032166
    assert parsed["distances"] == [[10, 21], [21, 10]]


def test_numactl_memory_only_node_and_missing_slit():
    text = (
        "available: 2 nodes (0-1)\nnode 0 cpus: 0 1 2 3\nnode 0 size: 64000 MB\n"
        "node 0 free: 60000 MB\nnode 1 cpus:\nnode 1 size: <not available>\n"
        "node 1 free: <not available>\nNo distance information available.\n"
    )
    parsed = numactl.parse_hardware(text)
    assert parsed["nodes"][1] == {
        "node": 1,
        "cpus": "",
        "cpu_count": 0,
        "size_mb": None,
        "free_mb": None,
    }
    assert parsed["distances"] is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "printed nothing"),
        ("No NUMA available on this system\n", "line 1: expected 'available: N nodes"),
        ("available: 2 nodes (0-1)\nnode 0 cpus: 0 1\n", "announces 2 nodes but describes 1"),
        ("available: 1 nodes (0)\nnode 0 size: lots\n", "line 2: expected 'N MB'"),
        (
            "available: 1 nodes (0)\nnode 0 cpus: 0\nnode distances:\nnode 0\n  0:  10 x\n",
            "line 5: expected row '0:'",
        ),
        ("available: 1 nodes (0)\nnode 0 cpus: 0\nbanana\n", "line 3: unexpected line"),
    ],
)
def test_numactl_garbage_names_the_line(text, message):
    with pytest.raises(ParseError, match=message):
        numactl.parse_hardware(text)


def test_meminfo_reads_the_system_and_the_per_node_files():
    system = proc.meminfo((TREE / "proc/meminfo").read_text())
    assert system["MemTotal"] == 2113389516 and system["MemAvailable"] == 2081265312
    assert system["HugePages_Total"] == 0
    node = proc.meminfo((TREE / "sys/devices/system/node/node1/meminfo").read_text())
    assert node["MemTotal"] == 1056938108
    assert proc.meminfo(Path("/proc/meminfo").read_text())["MemTotal"] > 0
    with pytest.raises(ParseError, match="meminfo line 2"):
        proc.meminfo("MemTotal: 1 kB\nMemFree 2 kB\n")


def test_modules_reads_names_and_states():
    mods = proc.modules((TREE / "proc/modules").read_text())
    assert {"name": "nvidia_peermem", "state": "Live"} in mods
    assert len(mods) == 29
    assert proc.modules("nvidia 1 0 - Loading 0x0\n") == [{"name": "nvidia", "state": "Loading"}]
    with pytest.raises(ParseError, match="line 1"):
        proc.modules("nvidia_uvm\n")


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]), ("", []), ("5", [5])],
)
def test_cpulist_round_trip(text, cpus):
    assert proc.cpulist(text) == cpus
    assert proc.format_cpulist(cpus) == text.strip()


def test_cpulist_garbage():
    with pytest.raises(ParseError, match="runs backwards"):
        proc.cpulist("7-3")
    with pytest.raises(ParseError, match="cannot read 'x'"):
        proc.cpulist("0,x")


# ---------------------------------------------------------------- the sub-probe


def test_family_writes_the_system_section():
    assert registry.sections()["system"] == "system" and host.SECTIONS == ("system",)


def test_collects_the_two_socket_tree(tools):
    tools.numactl()
    tools.systemctl("active\ninactive\nactive\nactive\n")
    system, errors = collect()
    assert errors == []
    assert system["numa_nodes"] == [
        {"node": 0, "cpus": "0-55,112-167", "cpu_count": 112, "memory_total_kb": 1056451408},
        {"node": 1, "cpus": "56-111,168-223", "cpu_count": 112, "memory_total_kb": 1056938108},
    ]
    # 8 GPUs, not the NVSwitches or NICs, keyed like NVML prints bus ids.
    assert system["gpu_numa_nodes"] == {
        "00000000:19:00.0": 0,
        "00000000:3B:00.0": 0,
        "00000000:4C:00.0": 0,
        "00000000:5D:00.0": 0,
        "00000000:9B:00.0": 1,
        "00000000:BB:00.0": 1,
        "00000000:CB:00.0": 1,
        "00000000:DB:00.0": 1,
    }
    assert system["numactl"]["available"] and system["numactl"]["rc"] == 0
    assert system["numactl"]["hardware"]["available_nodes"] == 2
    assert (system["cpus_online"], system["cpus_present"]) == (224, 224)
    assert system["cpus_usable"] == len(os.sched_getaffinity(0))
    assert system["memory_total_kb"] == 2113389516
    assert "nvidia_peermem" in system["kernel_modules"] and "nvidia" in system["kernel_modules"]
    assert system["services"] == {
        "nvidia-persistenced": "active",
        "nvidia-fabricmanager": "inactive",
        "nvidia-dcgm": "active",
        "gpud": "active",
    }
    assert system["disks"][0]["path"] == "/" and system["disks"][0]["free_bytes"] > 0
    assert system["unavailable"] == {}


def test_scratch_paths_are_measured_and_a_missing_one_is_recorded(tools, tmp_path):
    root = tree_copy(tmp_path)
    (root / "scratch").mkdir()
    system, _ = collect(root, scratch_paths=["/scratch", "/raid"])
    disks = {d["path"]: d for d in system["disks"]}
    assert list(disks) == ["/", "/scratch", "/raid"]
    assert disks["/scratch"]["free_bytes"] > 0
    assert disks["/raid"]["free_bytes"] is None
    assert "No such file or directory" in disks["/raid"]["unavailable"]["free_bytes"]["detail"]


def test_hung_statvfs_is_a_timeout_not_a_hung_probe(monkeypatch):
    release = threading.Event()
    real = os.statvfs

    def statvfs(path: str) -> os.statvfs_result:
        if path.endswith("nfs-scratch"):
            release.wait(30)  # a dead NFS server: the call does not come back
        return real(path)

    monkeypatch.setattr(host.os, "statvfs", statvfs)
    started = time.monotonic()
    record = host.disk_free(str(TREE), "/nfs-scratch", 0.5)
    release.set()
    assert time.monotonic() - started < 5
    assert record["free_bytes"] is None
    assert record["unavailable"]["free_bytes"] == {
        "kind": "timeout",
        "detail": "/nfs-scratch: statvfs did not return within 0.5 s (hung mount?)",
    }
    facts = healthy_node()
    facts["system"]["disks"].append(record)
    result = judge("host_resources", facts, scratch_paths=["/nfs-scratch"])
    assert result.status == "FAIL"
    assert "/nfs-scratch: free space unknown (/nfs-scratch: statvfs did not return" in (result.text)


def test_missing_tools_and_files_are_recorded_not_raised(tools, tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    system, errors = collect(root)
    assert system["numactl"] == {
        "available": False,
        "rc": None,
        "error": "numactl: command not found",
        "hardware": None,
    }
    why = system["unavailable"]
    assert why["services"]["kind"] == "not_supported"
    assert why["services"]["detail"] == "systemctl not available: systemctl: command not found"
    assert why["numa_nodes"]["kind"] == "not_supported"
    assert why["kernel_modules"]["kind"] == "not_supported"
    assert why["memory_total_kb"]["detail"] == "cannot read /proc/meminfo"
    assert system["gpu_numa_nodes"] is None and system["kernel_modules"] is None
    assert errors == []  # a missing tool is a fact about the node, not a probe failure


def test_systemctl_without_systemd_is_not_available(tools):
    # What systemctl prints in a container whose PID 1 is not systemd (this build VM).
    tools.add(
        "systemctl",
        'echo "System has not been booted with systemd as init system (PID 1). Can\'t operate."'
        " >&2\necho 'Failed to connect to bus: Host is down' >&2\nexit 1\n",
    )
    system, errors = collect()
    assert system["services"] is None
    assert system["unavailable"]["services"] == {
        "kind": "not_supported",
        "detail": "systemctl not available: System has not been booted with systemd as init "
        "system (PID 1). Can't operate. Failed to connect to bus: Host is down",
    }
    assert errors == []


def test_hanging_tools_are_killed_and_recorded(tools):
    tools.add("numactl", "exec /bin/sleep 600\n")
    tools.add("systemctl", "exec /bin/sleep 600\n")
    started = time.monotonic()
    system, errors = collect(system_command_timeout_s=1.0)
    assert time.monotonic() - started < 8
    assert system["numactl"]["available"] and "timed out after 1 s" in system["numactl"]["error"]
    assert system["unavailable"]["services"]["kind"] == "timeout"
    assert {e["call"] for e in errors} == {"numactl --hardware", "systemctl is-active"}


def test_failing_numactl_is_recorded(tools):
    tools.add("numactl", "echo 'No NUMA available on this system'\nexit 1\n")
    system, errors = collect()
    assert system["numactl"]["rc"] == 1
    assert system["numactl"]["error"] == "exit 1: No NUMA available on this system"
    assert errors[0]["call"] == "numactl --hardware"


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        ("65536:65536", {"soft": 64, "hard": 64}),
        ("16384:65536", {"soft": 16, "hard": 64}),
        ("unlimited:unlimited", {"soft": "unlimited", "hard": "unlimited"}),
    ],
)
def test_memlock_of_the_probe_process_through_the_shipped_bundle(limit, expected):
    """The real bundle under `prlimit`, as a job started the same way would run."""
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) not installed")
    call = probe_call(probe_config(TREE), python=sys.executable)
    run = subprocess.run(
        ["prlimit", f"--memlock={limit}", "--", "/bin/sh", "-c", call.command],
        input=call.stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if "Operation not permitted" in run.stderr:
        pytest.skip(f"this sandbox may not raise RLIMIT_MEMLOCK: {run.stderr.strip()}")
    doc = parse_output(run.stdout)
    assert doc["system"]["memlock_kb"] == expected
    assert doc["system"]["numa_nodes"][1]["cpus"] == "56-111,168-223"


# ---------------------------------------------------------------- checks on the facts


def test_healthy_two_socket_node_passes_every_system_check(tools):
    """Probe (with stand-in numactl and systemctl) to checks; memlock as a tuned node has it."""
    tools.numactl()
    tools.systemctl()
    facts = healthy_h100()
    facts["system"], errors = collect()
    assert errors == []
    facts["system"]["memlock_kb"] = {"soft": "unlimited", "hard": "unlimited"}
    limits = {"fabric": "infiniband", "dcgm_installed": True, "gpud_installed": True}
    results = {name: judge(name, facts, **limits) for name in SYSTEM_CHECKS}
    assert {n: r.status for n, r in results.items()} == dict.fromkeys(SYSTEM_CHECKS, "PASS")
    assert results["numa_topology"].text == (
        "node17: 2 NUMA nodes; GPUs by node: node0: gpu0, gpu1, gpu2, gpu3; "
        "node1: gpu4, gpu5, gpu6, gpu7"
    )
    assert results["kernel_modules"].text.endswith("nvidia, nvidia_uvm, nvidia_peermem")
    assert "nvidia-fabricmanager, nvidia-dcgm, gpud" in results["gpu_services"].text


def test_numa_node_count_must_match():
    result = judge("numa_topology", healthy_node(), numa_nodes_expected=4)
    assert result.status == "FAIL"
    assert "node17: 2 NUMA nodes, expected 4" in result.text
    assert "node interleaving off" in result.advice
    assert judge("numa_topology", healthy_node(), numa_nodes_expected=2).status == "PASS"


def test_gpu_without_numa_affinity_fails_naming_gpu_and_bus(tmp_path):
    root = tree_copy(tmp_path)
    (root / "sys/bus/pci/devices/0000:bb:00.0/numa_node").write_text("-1\n")
    facts = healthy_node()
    facts["system"] = healthy_system(root)
    result = judge("numa_topology", facts)
    assert result.status == "FAIL"
    assert result.text == (
        "node17: NUMA affinity unknown on a 2-node host for gpu5 (bus 00000000:BB:00.0: "
        f"numa_node -1). Action FIX_CONFIG: {result.advice}"
    )
    assert "update the BIOS" in result.advice


def test_all_gpus_on_one_socket_is_uneven(tmp_path):
    root = tree_copy(tmp_path)
    for bus in ("9b", "bb", "cb", "db"):
        (root / f"sys/bus/pci/devices/0000:{bus}:00.0/numa_node").write_text("0\n")
    facts = healthy_node()
    facts["system"] = healthy_system(root)
    result = judge("numa_topology", facts)
    assert result.status == "FAIL"
    assert "GPUs not split evenly over the 2 NUMA nodes with CPUs (node0: 8, node1: 0; " in (
        result.text
    )
    assert "expected 4 each): node0: gpu0, gpu1, gpu2, gpu3, gpu4, gpu5, gpu6, gpu7" in (
        result.text
    )
    # A profile without the spread rule accepts it.
    assert judge("numa_topology", facts, profile="default").status == "PASS"


def test_odd_gpu_count_cannot_be_split_evenly():
    facts = healthy_node()
    del facts["gpus"][7]
    result = judge("numa_topology", facts)
    assert result.status == "FAIL"
    assert "(node0: 4, node1: 3; 7 GPUs do not divide)" in result.text


def test_kernel_without_numa_counts_as_one_node():
    facts = healthy_node()
    system = facts["system"]
    system["numa_nodes"] = None
    system["unavailable"]["numa_nodes"] = {"kind": "not_supported", "detail": "no node dir"}
    system["gpu_numa_nodes"] = dict.fromkeys(system["gpu_numa_nodes"])
    assert judge("numa_topology", facts, numa_nodes_expected=1).status == "PASS"
    result = judge("numa_topology", facts, numa_nodes_expected=2)
    assert result.status == "FAIL" and "1 NUMA node, expected 2" in result.text


def test_single_node_host_with_unknown_affinity_passes():
    facts = healthy_node()
    system = facts["system"]
    system["numa_nodes"] = system["numa_nodes"][:1]
    system["gpu_numa_nodes"] = dict.fromkeys(system["gpu_numa_nodes"], -1)
    result = judge("numa_topology", facts, profile="default")
    assert result.status == "PASS"
    assert "1 NUMA node; GPUs by node: node0: gpu0" in result.text


def test_numactl_missing_fails_with_the_install_hint():
    facts = healthy_node()
    facts["system"]["numactl"] = {
        "available": False,
        "rc": None,
        "error": "numactl: command not found",
        "hardware": None,
    }
    result = judge("numactl", facts)
    assert result.status == "FAIL"
    assert "node17: numactl not installed (numactl: command not found)" in result.text
    assert "apt-get install numactl" in result.advice and "role numactl" in result.advice


def test_numactl_failing_fails(tools):
    tools.add("numactl", "echo 'No NUMA available on this system'\nexit 1\n")
    tools.systemctl()
    facts = healthy_h100()
    facts["system"], _ = collect()
    result = judge("numactl", facts)
    assert result.status == "FAIL"
    assert "numactl --hardware failed: exit 1: No NUMA available on this system" in result.text


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"min_cpus": 256}, "224 CPUs online < 256"),
        ({"min_memory_gb": 4096}, "memory 2015.5 GiB < 4096 GiB"),
        ({"min_root_free_gb": 10**9}, "/: "),
        ({"scratch_paths": ["/raid"]}, "/raid: no free-space record (the probe was not asked"),
    ],
)
def test_resource_thresholds_fail_with_measured_and_limit(limits, message):
    result = judge("host_resources", healthy_node(), **limits)
    assert result.status == "FAIL"
    assert message in result.text
    assert result.action.value in ("INSPECT", "FIX_CONFIG") and result.advice


def test_low_available_memory_and_missing_scratch_fail(tmp_path):
    facts = healthy_node(scratch_paths=["/raid"])
    facts["system"]["memory_available_kb"] = facts["system"]["memory_total_kb"] // 20
    result = judge("host_resources", facts, scratch_paths=["/raid"])
    assert result.status == "FAIL"
    assert "memory available 5% < 10%" in result.text
    assert "/raid: free space unknown (/raid: No such file or directory)" in result.text
    assert "check the scratch mount" in result.advice


def test_resources_pass_names_what_was_measured():
    result = judge("host_resources", healthy_node(), min_cpus=224, min_memory_gb=2000)
    assert result.status == "PASS"
    assert "224 CPUs" in result.text and "memory 2015.5 GiB (98% available)" in result.text
    assert "/ " in result.text and "GiB free" in result.text


@pytest.mark.parametrize(
    ("memlock", "limits", "status", "message"),
    [
        ({"soft": "unlimited", "hard": "unlimited"}, {"fabric": "efa"}, "PASS", "unlimited"),
        (
            {"soft": 64, "hard": 64},
            {"fabric": "infiniband"},
            "FAIL",
            "memlock limit 64 KB, RDMA over infiniband needs unlimited",
        ),
        (
            {"soft": 8192, "hard": "unlimited"},
            {"fabric": "efa"},
            "FAIL",
            "memlock limit 8192 KB (hard limit unlimited), RDMA over efa needs unlimited",
        ),
        (
            {"soft": 8192, "hard": 8192},
            {"fabric": "efa", "min_memlock_kb": 16384},
            "FAIL",
            "memlock limit 8192 KB < 16384 KB",
        ),
        (
            {"soft": 65536, "hard": 65536},
            {"fabric": "efa", "min_memlock_kb": 16384},
            "PASS",
            "memlock 65536 KB >= 16384 KB",
        ),
        ({"soft": 64, "hard": 64}, {"fabric": "none"}, "SKIP", "no minimum (fabric none"),
    ],
)
def test_memlock(memlock, limits, status, message):
    facts = healthy_node()
    facts["system"]["memlock_kb"] = memlock
    result = judge("memlock_limit", facts, **limits)
    assert (result.status, message in result.text) == (status, True), result.text
    if status == "FAIL":
        assert "memlock unlimited" in result.advice and "DefaultLimitMEMLOCK" in result.advice


def test_missing_peermem_fails_on_infiniband_only(tmp_path):
    root = tree_copy(tmp_path)
    modules = (root / "proc/modules").read_text().splitlines(keepends=True)
    (root / "proc/modules").write_text("".join(m for m in modules if "peermem " not in m))
    facts = healthy_node()
    facts["system"] = healthy_system(root)
    result = judge("kernel_modules", facts, fabric="infiniband")
    assert result.status == "FAIL"
    assert "kernel modules not loaded: nvidia_peermem (GPUDirect RDMA over infiniband)" in (
        result.text
    )
    assert "modprobe nvidia_peermem" in result.advice
    assert judge("kernel_modules", facts, fabric="none").status == "PASS"
    assert (
        judge("kernel_modules", facts, fabric="infiniband", require_nvidia_peermem=False).status
        == "PASS"
    )


def test_efa_fabric_needs_the_efa_module():
    result = judge("kernel_modules", healthy_node(), fabric="efa")
    assert result.status == "FAIL"
    assert "efa (the EFA driver" in result.text and "nvidia_peermem" not in result.text


def test_no_proc_modules_skips_with_the_reason():
    facts = healthy_node()
    facts["system"]["kernel_modules"] = None
    facts["system"]["unavailable"]["kernel_modules"] = {
        "kind": "not_supported",
        "detail": "no /proc/modules (kernel without loadable modules, or a sandbox hiding them)",
    }
    result = judge("kernel_modules", facts)
    assert result.status == "SKIP"
    assert "loaded kernel modules not supported here (no /proc/modules" in result.text
    facts["system"]["unavailable"]["kernel_modules"] = {
        "kind": "error",
        "detail": "/proc/modules line 3: cannot read 'x'",
    }
    result = judge("kernel_modules", facts)
    assert result.status == "FAIL" and "could not read loaded kernel modules" in result.text


def test_inactive_fabric_manager_fails_on_nvswitch_profiles():
    facts = healthy_node()
    facts["system"]["services"]["nvidia-fabricmanager"] = "failed"
    result = judge("gpu_services", facts)
    assert result.status == "FAIL"
    assert "nvidia-fabricmanager is failed (expected active)" in result.text
    assert "systemctl enable --now nvidia-fabricmanager" in result.advice
    # A PCIe SKU needs no fabric manager.
    assert judge("gpu_services", facts, profile="l40s").status == "PASS"


def test_dcgm_and_gpud_must_run_where_the_inventory_installs_them():
    facts = healthy_node()
    facts["system"]["services"].update({"nvidia-dcgm": "inactive", "gpud": "activating"})
    assert judge("gpu_services", facts).status == "PASS"
    result = judge("gpu_services", facts, dcgm_installed=True, gpud_installed=True)
    assert result.status == "FAIL"
    assert "nvidia-dcgm is inactive; gpud is activating (expected active)" in result.text


def test_services_skip_without_systemctl_and_fail_when_it_hangs():
    facts = healthy_node()
    facts["system"]["services"] = None
    facts["system"]["unavailable"]["services"] = {
        "kind": "not_supported",
        "detail": "systemctl not available: systemctl: command not found",
    }
    result = judge("gpu_services", facts)
    assert result.status == "SKIP"
    assert "systemctl not available" in result.text
    facts["system"]["unavailable"]["services"] = {
        "kind": "timeout",
        "detail": "systemctl is-active ... timed out after 10 s",
    }
    result = judge("gpu_services", facts)
    assert result.status == "FAIL" and "timed out" in result.text


def test_gpu_less_machine_skips_gpu_node_rules_but_judges_resources(tools):
    """This build VM's /proc and /sys, no numactl or systemctl: nothing NVIDIA, none expected."""
    facts = {
        "source": "none",
        "driver": {"loaded": False},
        "pci": {"nvidia_gpus": []},
        "gpus": [],
    }
    facts["system"], _ = collect(Path("/"))
    for name in SYSTEM_CHECKS:
        result = judge(name, facts, profile="default")
        expected = "PASS" if name == "host_resources" else "SKIP"
        assert result.status == expected, result.text
        if expected == "SKIP":
            assert result.text == "node17: no NVIDIA GPU/driver on node17"


def test_gpu_less_machine_that_should_have_gpus_is_judged(tools):
    facts = {"source": "none", "driver": {"loaded": False}, "pci": {"nvidia_gpus": []}}
    facts["gpus"] = []
    facts["system"], _ = collect(Path("/"))
    result = judge("numactl", facts, profile="default", gpu_count=8)
    assert result.status == "FAIL" and "numactl not installed" in result.text


def test_profiles_carry_the_system_keys():
    profiles = PROFILES
    for name in ("h100-sxm", "h200-sxm", "b200", "a100-sxm-80gb"):
        assert profiles.get(name).values["requires_fabric_manager"] is True, name
        assert profiles.get(name).values["gpus_even_over_numa_nodes"] is True, name
    default = profiles.get("default")
    assert (
        default.values["numa_nodes_expected"] is None and default.values["min_memlock_kb"] is None
    )
    assert default.values["requires_fabric_manager"] is False
    with pytest.raises(ConfigError, match="min_memlock_kb' must be int"):
        expectations_from_vars("n1", {"min_memlock_kb": "lots"}, profiles)


# ---------------------------------------------------------------- the suite


INVENTORY = """\
all:
  children:
    gpu_nodes:
      vars:
        gpu_profile: h100-sxm
        fabric: infiniband
      hosts:
        n1: {}
        n2: {}
"""


@pytest.mark.suite
def test_suite_on_saved_facts_fails_exactly_the_faulty_system_checks(tmp_path):
    n1 = healthy_node()
    n2 = copy.deepcopy(n1)
    system = n2["system"]
    system["memlock_kb"] = {"soft": 64, "hard": 64}
    system["kernel_modules"].remove("nvidia_peermem")
    system["services"]["nvidia-fabricmanager"] = "failed"
    system["gpu_numa_nodes"]["00000000:BB:00.0"] = -1
    facts = write_facts(tmp_path / "facts", n1=n1, n2=n2)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    run = run_suite(
        tmp_path / "r", "--facts", str(facts), "--inventory", str(inventory), *ONLY_SYSTEM
    )
    outcomes = run.outcomes()
    for name in SYSTEM_CHECKS:
        assert outcomes[f"test_{name}[n1]"] == "passed", run.messages().get(f"test_{name}[n1]")
    assert {n for n, s in outcomes.items() if s == "failed"} == {
        "test_numa_topology[n2]",
        "test_memlock_limit[n2]",
        "test_kernel_modules[n2]",
        "test_gpu_services[n2]",
    }
    assert run.rc == 1
    reasons = " | ".join(run.verdicts["nodes"]["n2"]["reasons"])
    assert "n2: memlock limit 64 KB, RDMA over infiniband needs unlimited" in reasons
    assert "nvidia-fabricmanager is failed" in reasons and "gpu5 (bus 00000000:BB:00.0" in reasons
    assert run.verdicts["nodes"]["n1"]["verdict"] == "PASS"


@pytest.mark.suite
def test_suite_on_this_gpu_less_machine(tmp_path):
    run = run_suite(tmp_path / "r", "--hosts", "local://", *ONLY_SYSTEM)
    me = socket.gethostname()
    outcomes = run.outcomes()
    assert outcomes[f"test_host_resources[{me}]"] == "passed", run.output
    messages = run.messages()
    for name in SYSTEM_CHECKS:
        if name != "host_resources":
            assert outcomes[f"test_{name}[{me}]"] == "skipped"
            assert f"no NVIDIA GPU/driver on {me}" in messages[f"test_{name}[{me}]"]
    facts = (tmp_path / "r" / "facts" / f"{me}.json").read_text()
    assert '"memlock_kb"' in facts and '"numa_nodes"' in facts
