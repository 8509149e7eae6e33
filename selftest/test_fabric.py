"""The fabric family on real samples: fi_info of a healthy p4de, /sys/class/infiniband of an
H100 InfiniBand node, and EFA sysfs trees built here (with the driver links a copy loses)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuhealth import registry
from gpuhealth.config import ConfigError, Platform, ProfileSet, expectations_from_vars
from gpuhealth.families.fabric import parse_fi_info as fi_info
from gpuhealth.families.fabric import parse_ibstat
from gpuhealth.families.fabric import parse_rdma as rdma_sysfs
from gpuhealth.families.fabric import probe as fabric
from gpuhealth.families.gpu.scope import UNKNOWN_GPU_SLOTS
from gpuhealth.parsing import ParseError
from gpuhealth.probe.main import collect
from selftest.facts import PROFILES, healthy_h100, limits, probe_config
from selftest.facts import judge as judge_facts
from selftest.facts import probe as run_probe
from selftest.suite import run_suite

DATA = Path(__file__).parent / "data" / "efa"
FI_INFO_P4DE = DATA / "awesome-networking_p4de_fi_info_efa_rdm_4dev.txt"
IB_ROOT = DATA / "h100-ib-root"
IB_CLASS = IB_ROOT / "sys" / "class" / "infiniband"
P4DE_DEVICES = ["rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"]
FABRIC_CHECKS = [c.name for c in registry.checks().values() if c.family == "fabric"]
# The checks of one fabric; gpu_nic_affinity (per GPU, either fabric) has its own tests in
# test_gpu_nic_affinity.py.
NODE_CHECKS = [n for n in FABRIC_CHECKS if registry.check(n).scope == "node"]
IB = {"fabric": "infiniband", "ib_ports_expected": 8}


def judge(name: str, section: dict[str, Any], profile: str = "h100-sxm", **overrides: Any):
    """One fabric check on a live-looking facts document holding `section` as `fabric`."""
    return judge_facts(name, {"source": "nvml", "fabric": section}, None, profile, **overrides)


def probe(root: Path | str, profile: str = "default", **overrides: Any) -> dict[str, Any]:
    """The probe's fabric section for a root, told what the profile + inventory expect."""
    sections, errors = run_probe("fabric", root, **limits(profile, **overrides).values)
    return {**sections["fabric"], "probe_errors": errors}


def ib_section() -> dict[str, Any]:
    return probe(IB_ROOT)


def efa_tree(root: Path, names: list[str], states: dict[str, str] | None = None) -> Path:
    """A /sys/class/infiniband of EFA devices as the kernel links it: device/driver -> efa.

    Next to them an mlx5 device (a RoCE NIC), which must not count as EFA.
    """
    drivers = root / "sys" / "bus" / "pci" / "drivers"
    for driver in ("efa", "mlx5_core"):
        (drivers / driver).mkdir(parents=True, exist_ok=True)
    base = root / "sys" / "class" / "infiniband"
    for name, driver in [*((n, "efa") for n in names), ("mlx5_0", "mlx5_core")]:
        port = base / name / "ports" / "1"
        (port / "hw_counters").mkdir(parents=True)
        (base / name / "device").mkdir()
        target = os.path.relpath(drivers / driver, base / name / "device")
        (base / name / "device" / "driver").symlink_to(target)
        (port / "state").write_text((states or {}).get(name, "4: ACTIVE") + "\n")
        (port / "phys_state").write_text("5: LinkUp\n")
        (port / "link_layer").write_text("Unspecified\n" if driver == "efa" else "Ethernet\n")
        (port / "hw_counters" / "rx_bytes").write_text("123456\n")
    return root


def stand_in(folder: Path, script: str) -> Path:
    """An `fi_info` on PATH that runs `script` (sh)."""
    folder.mkdir(exist_ok=True)
    path = folder / "fi_info"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    return folder


@pytest.fixture
def fi_info_on_path(tmp_path, monkeypatch):
    """Put a stand-in fi_info first on PATH; returns a function taking its script."""

    def install(script: str) -> None:
        folder = stand_in(tmp_path / "bin", script)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")

    monkeypatch.setattr(fabric, "FI_INFO_DIRS", ())
    return install


# The sample with its shell prompt line cut: what fi_info itself prints.
REPLAY_P4DE = f"tail -n +2 '{FI_INFO_P4DE}'\n"


# ---------------------------------------------------------------- parsers


def test_fi_info_parser_reads_the_p4de_sample():
    parsed = fi_info.parse(FI_INFO_P4DE.read_text())
    assert [e["domain"] for e in parsed["entries"]] == [f"{n}-rdm" for n in P4DE_DEVICES]
    assert parsed["entries"][0] == {
        "provider": "efa",
        "fabric": "efa",
        "domain": "rdmap16s27-rdm",
        "version": "119.0",
        "type": "FI_EP_RDM",
        "protocol": "FI_PROTO_EFA",
    }
    summary = fi_info.summary(parsed)
    assert summary["status"] == "ok" and summary["error"] is None
    assert summary["libfabric_version"] == "1.19.0" and summary["provider_version"] == "119.0"
    assert len(summary["domains"]) == 4


@pytest.mark.parametrize("line", ["fi_getinfo: -61", "fi_getinfo: -61 (No data available)"])
def test_fi_getinfo_61_means_no_devices(line):
    summary = fi_info.summary(fi_info.parse(line + "\n"))
    assert summary["status"] == "no_devices" and summary["getinfo_error"] == -61
    assert summary["domains"] == [] and "-61" in summary["error"]


@pytest.mark.parametrize(
    ("version", "libfabric"),
    [("119.0", "1.19.0"), ("122.10", "1.22.1"), ("1.0", None), ("", None)],
)
def test_libfabric_version_from_the_provider_version(version, libfabric):
    assert fi_info.libfabric_version(version) == libfabric


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("provider: efa\n    fabric: efa\nSegmentation fault\n", "line 3: not a fi_info field"),
        ("provider: efa\n    fabric: efa\n    version: 119.0\n", "line 1: provider 'efa' block"),
        ("bash: fi_info: command not found\n", "no fi_info provider block"),
        ("", "no fi_info provider block"),
    ],
)
def test_fi_info_parser_names_the_line_of_garbage(text, message):
    with pytest.raises(ParseError, match=message):
        fi_info.parse(text)


def test_sysfs_value_parsers():
    assert rdma_sysfs.parse_enum("4: ACTIVE\n") == (4, "ACTIVE")
    assert rdma_sysfs.parse_enum("5: LinkUp\n") == (5, "LinkUp")
    assert rdma_sysfs.parse_rate("400 Gb/sec (4X NDR)\n") == 400.0
    assert rdma_sysfs.parse_rate("2.5 Gb/sec (1X SDR)\n") == 2.5
    assert rdma_sysfs.parse_counter("255\n") == 255
    for parse, text in (
        (rdma_sysfs.parse_enum, "ACTIVE"),
        (rdma_sysfs.parse_rate, "fast"),
        (rdma_sysfs.parse_counter, "-1"),
    ):
        with pytest.raises(ParseError, match="line 1"):
            parse(text)


# ---------------------------------------------------------------- probe


def test_probe_reads_the_h100_sysfs_copy_through_root():
    section = ib_section()
    assert section["probe_errors"] == []
    devices = {d["name"]: d for d in section["devices"]}
    assert list(devices) == [f"mlx5_{n}" for n in (0, 1, 4, 5, 6, 7, 8, 9)] + ["mlx5_bond_0"]
    mlx5_1 = devices["mlx5_1"]
    assert (mlx5_1["fw_ver"], mlx5_1["board_id"], mlx5_1["hca_type"]) == (
        "28.41.1000",
        "MT_0000000838",
        "MT4129",
    )
    assert mlx5_1["driver"] is None and mlx5_1["unavailable"]["driver"]["kind"] == "absent"
    port = mlx5_1["ports"][0]
    assert (port["port"], port["state"], port["state_code"]) == (1, "ACTIVE", 4)
    assert (port["phys_state"], port["phys_state_code"]) == ("LinkUp", 5)
    assert (port["rate"], port["rate_gbps"]) == ("400 Gb/sec (4X NDR)", 400.0)
    assert port["link_layer"] == "InfiniBand"
    assert port["counters"]["link_downed"] == 255 and len(port["counters"]) == 21
    assert port["hw_counters"]["rx_write_requests"] == 3809045607
    assert devices["mlx5_bond_0"]["ports"][0]["link_layer"] == "Ethernet"
    assert section["fi_info"] is None and section["unavailable"]["fi_info"]["kind"] == "absent"


def test_fabric_is_a_subprobe_of_the_probe():
    doc = collect(probe_config(IB_ROOT))
    assert len(doc["fabric"]["devices"]) == 9
    json.dumps(doc)


def test_probe_records_the_efa_driver_from_the_device_link(tmp_path):
    root = efa_tree(tmp_path, P4DE_DEVICES)
    devices = {d["name"]: d for d in probe(root)["devices"]}
    assert [devices[n]["driver"] for n in P4DE_DEVICES] == ["efa"] * 4
    assert devices["mlx5_0"]["driver"] == "mlx5_core"
    port = devices["rdmap16s27"]["ports"][0]
    assert port["rate"] is None and port["unavailable"]["rate"]["kind"] == "not_supported"
    assert port["counters"] is None and port["hw_counters"] == {"rx_bytes": 123456}


def test_no_rdma_devices_is_an_empty_list_not_an_error(tmp_path):
    section = probe(tmp_path)
    assert section["devices"] == [] and section["probe_errors"] == []


def test_fi_info_runs_only_on_efa_hosts(tmp_path, fi_info_on_path):
    marker = tmp_path / "ran"
    fi_info_on_path(f"touch '{marker}'\n{REPLAY_P4DE}")
    probe(tmp_path, "h100-sxm")
    assert not marker.exists()
    section = probe(tmp_path, "p4de.24xlarge")
    assert marker.exists()
    assert section["fi_info"]["status"] == "ok" and section["fi_info"]["rc"] == 0


# ---------------------------------------------------------------- EFA checks


def test_p4de_fi_info_passes_p4de_and_fails_p5(tmp_path, fi_info_on_path):
    fi_info_on_path(REPLAY_P4DE)
    section = probe(efa_tree(tmp_path, P4DE_DEVICES), "p4de.24xlarge")
    for name in ("efa_device_count", "efa_fi_info", "efa_ports_active"):
        result = judge(name, section, "p4de.24xlarge")
        assert result.status == "PASS", result.text
    ok = judge("efa_fi_info", section, "p4de.24xlarge").text
    assert "4 EFA RDM domains as expected" in ok and "libfabric 1.19.0" in ok
    wrong = judge("efa_fi_info", section, "p5.48xlarge")
    assert wrong.status == "FAIL"
    assert "expected 32, found 4" in wrong.text and "libfabric 1.19.0" in wrong.text
    count = judge("efa_device_count", section, "p5.48xlarge")
    assert count.status == "FAIL" and "expected 32 EFA devices, found 4" in count.text
    assert "mlx5_0" not in count.text.split("Action")[0]


def test_efa_host_with_no_devices_fails_count_and_ports(tmp_path, fi_info_on_path):
    fi_info_on_path("echo 'fi_getinfo: -61 (No data available)' >&2\nexit 61\n")
    section = probe(tmp_path, "p5.48xlarge")
    count = judge("efa_device_count", section, "p5.48xlarge")
    assert count.status == "FAIL" and "node17: expected 32 EFA devices, found 0" in count.text
    assert "efa kernel module" in count.advice
    assert judge("efa_ports_active", section, "p5.48xlarge").status == "FAIL"
    info = judge("efa_fi_info", section, "p5.48xlarge")
    assert info.status == "FAIL" and "found no EFA device (fi_getinfo -61)" in info.text
    assert section["fi_info"]["rc"] == 61


def test_efa_port_down_fails_naming_device_and_port(tmp_path):
    root = efa_tree(tmp_path, P4DE_DEVICES, {"rdmap144s27": "1: DOWN"})
    result = judge("efa_ports_active", probe(root), "p4de.24xlarge")
    assert result.status == "FAIL"
    assert "rdmap144s27 port 1 DOWN (1)" in result.text
    assert "rdmap16s27" not in result.text


def test_missing_fi_info_fails_with_an_install_hint(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(fabric, "FI_INFO_DIRS", ())
    section = probe(efa_tree(tmp_path, P4DE_DEVICES), "p4de.24xlarge")
    assert section["fi_info"]["status"] == "not_installed"
    result = judge("efa_fi_info", section, "p4de.24xlarge")
    assert result.status == "FAIL" and "fi_info is not installed" in result.text
    assert "efa_installer.sh" in result.advice


def test_fi_info_in_the_efa_installer_folder_is_found(tmp_path, monkeypatch):
    folder = stand_in(tmp_path / "opt-amazon-efa-bin", REPLAY_P4DE)
    monkeypatch.setenv("PATH", f"{tmp_path / 'empty'}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setattr(fabric, "FI_INFO_DIRS", (str(folder),))
    section = probe(tmp_path, "p4de.24xlarge")
    assert section["fi_info"]["status"] == "ok" and len(section["fi_info"]["domains"]) == 4


def test_hung_fi_info_fails_within_its_timeout(tmp_path, fi_info_on_path):
    fi_info_on_path("sleep 60\n")
    started = time.monotonic()
    section = probe(tmp_path, "p4de.24xlarge", fi_info_timeout_s=1)
    assert time.monotonic() - started < 10
    assert section["fi_info"]["status"] == "timeout"
    assert any(e.get("call") == "fi_info" for e in section["probe_errors"])
    result = judge("efa_fi_info", section, "p4de.24xlarge")
    assert result.status == "FAIL" and "timed out after 1 s" in result.text


def test_fi_info_not_run_by_the_probe_fails_a_live_efa_host(tmp_path):
    section = probe(efa_tree(tmp_path, P4DE_DEVICES))
    result = judge("efa_fi_info", section, "p4de.24xlarge")
    assert result.status == "FAIL" and "the probe did not run fi_info" in result.text


# ---------------------------------------------------------------- InfiniBand checks


def test_h100_ib_ports_pass_count_state_rate_and_firmware_with_the_bond_ignored():
    section = ib_section()
    results = {n: judge(n, section, **IB) for n in FABRIC_CHECKS if n.startswith("ib_")}
    for name in ("ib_port_count", "ib_port_state", "ib_port_rate", "ib_firmware_uniform"):
        assert results[name].status == "PASS", results[name].text
    assert "found 8 InfiniBand ports as expected" in results["ib_port_count"].text
    assert "not counted: mlx5_bond_0 port 1 (Ethernet)" in results["ib_port_count"].text
    assert "all 8 ports >= 400 Gb/s" in results["ib_port_rate"].text
    assert "28.41.1000 on 8 MT4129 HCAs" in results["ib_firmware_uniform"].text


def test_link_downed_255_on_mlx5_1_fails_the_counter_check():
    section = ib_section()
    result = judge(
        "ib_error_counters",
        section,
        **IB,
        ib_max_port_rcv_errors=20,
        ib_max_excessive_buffer_overrun_errors=15,
    )
    assert result.status == "FAIL"
    assert "node17: mlx5_1 port 1: link_downed 255 (saturated) > 0" in result.text
    assert "mlx5_0" not in result.text
    assert "cable or transceiver" in result.advice and "switch port" in result.advice


def test_default_counter_limits_also_flag_the_samples_rcv_and_overrun_errors():
    result = judge("ib_error_counters", ib_section(), **IB)
    assert result.status == "FAIL"
    assert "mlx5_0 port 1: port_rcv_errors 14 > 0" in result.text
    assert "excessive_buffer_overrun_errors 15 (saturated) > 0" in result.text


def test_counter_limits_set_to_null_skip_the_counter_check():
    off = {f"ib_max_{name}": None for name in ("link_downed", "symbol_error", "port_rcv_errors")}
    off |= {
        "ib_max_local_link_integrity_errors": None,
        "ib_max_excessive_buffer_overrun_errors": None,
    }
    assert judge("ib_error_counters", ib_section(), **IB, **off).status == "SKIP"


def test_missing_counter_fails_never_passes():
    section = ib_section()
    mlx5_5 = next(d for d in section["devices"] if d["name"] == "mlx5_5")
    del mlx5_5["ports"][0]["counters"]["symbol_error"]
    result = judge(
        "ib_error_counters",
        section,
        **IB,
        ib_max_port_rcv_errors=20,
        ib_max_excessive_buffer_overrun_errors=15,
    )
    assert result.status == "FAIL" and "mlx5_5 port 1: symbol_error not reported" in result.text


def test_port_count_below_expected_fails():
    result = judge("ib_port_count", ib_section(), fabric="infiniband", ib_ports_expected=10)
    assert result.status == "FAIL" and "expected 10 InfiniBand ports, found 8" in result.text


def test_ib_devices_can_add_the_bond_and_a_missing_one_fails():
    section = ib_section()
    names = [f"mlx5_{n}" for n in (0, 1, 4, 5, 6, 7, 8, 9)] + ["mlx5_bond_0"]
    with_bond = judge(
        "ib_port_count", section, fabric="infiniband", ib_ports_expected=9, ib_devices=names
    )
    assert with_bond.status == "PASS", with_bond.text
    firmware = judge("ib_firmware_uniform", section, fabric="infiniband", ib_devices=names)
    assert firmware.status == "PASS" and "32.38.3056 on 1 MT41692 HCAs" in firmware.text
    rate = judge("ib_port_rate", section, fabric="infiniband", ib_devices=names)
    assert rate.status == "FAIL" and "mlx5_bond_0 port 1 200 Gb/s" in rate.text
    missing = judge("ib_port_count", section, fabric="infiniband", ib_devices=[*names, "mlx5_2"])
    assert missing.status == "FAIL" and "mlx5_2: listed in ib_devices, not found" in missing.text


def test_down_port_slow_port_and_odd_firmware_fail_their_checks():
    section = ib_section()
    ports = {d["name"]: d["ports"][0] for d in section["devices"]}
    ports["mlx5_6"].update(state="INIT", state_code=2, phys_state="Polling", phys_state_code=2)
    ports["mlx5_4"].update(rate="200 Gb/sec (4X HDR)", rate_gbps=200.0)
    next(d for d in section["devices"] if d["name"] == "mlx5_7")["fw_ver"] = "28.39.1002"
    state = judge("ib_port_state", section, **IB)
    assert state.status == "FAIL"
    assert "mlx5_6 port 1 state INIT (2), phys_state Polling (2)" in state.text
    assert "mlx5_0" not in state.text and "subnet manager" in state.advice
    rate = judge("ib_port_rate", section, **IB)
    assert rate.status == "FAIL" and "below 400 Gb/s: mlx5_4 port 1 200 Gb/s" in rate.text
    fw = judge("ib_firmware_uniform", section, **IB)
    assert fw.status == "FAIL" and "mlx5_6, mlx5_8, mlx5_9; 28.39.1002 on mlx5_7" in fw.text


def test_without_a_minimum_rate_a_port_slower_than_its_peers_fails():
    section = ib_section()
    mlx5_4 = next(d for d in section["devices"] if d["name"] == "mlx5_4")
    mlx5_4["ports"][0].update(rate="100 Gb/sec (4X EDR)", rate_gbps=100.0)
    result = judge("ib_port_rate", section, "default", **IB)
    assert result.status == "FAIL" and "the fastest port's rate" in result.text
    assert "mlx5_4 port 1 100 Gb/s" in result.text


def test_ib_host_without_ports_fails_every_ib_check(tmp_path):
    section = probe(tmp_path)
    for name in ("ib_port_count", "ib_port_state", "ib_port_rate", "ib_firmware_uniform"):
        result = judge(name, section, **IB)
        assert result.status == "FAIL", name
    assert "expected 8 InfiniBand ports, found 0" in judge("ib_port_count", section, **IB).text


def test_efa_fabric_on_the_ib_node_fails_naming_the_unbound_devices():
    result = judge("efa_device_count", ib_section(), "p5.48xlarge")
    assert result.status == "FAIL"
    assert "expected 32 EFA devices, found 0; 9 RDMA devices with no driver link" in result.text


# ---------------------------------------------------------------- not this host's fabric


@pytest.mark.parametrize("fabric_name", ["none", "efa", "infiniband"])
def test_checks_of_another_fabric_skip_with_the_reason(tmp_path, fabric_name):
    section = probe(tmp_path)
    for name in NODE_CHECKS:
        mine = "efa" if name.startswith("efa_") else "infiniband"
        if mine == fabric_name:
            continue
        result = judge(name, section, fabric=fabric_name)
        assert result.status == "SKIP", name
        assert f"(fabric: {fabric_name}, from profile h100-sxm" in result.text


def test_fabric_key_accepts_only_known_fabrics(tmp_path):
    message = "key 'fabric' must be none, efa or infiniband, got 'roce'"
    with pytest.raises(ConfigError, match=f"inventory host n1: {message}"):
        expectations_from_vars("n1", {"fabric": "roce"}, PROFILES)
    (tmp_path / "lab.yml").write_text("fabric: roce\n")
    with pytest.raises(ConfigError, match=f"lab.yml: {message}"):
        ProfileSet(tmp_path)


def test_instance_profiles_extend_their_gpu_profile():
    expected = {
        "p4d.24xlarge": ("a100-sxm-40gb", 4),
        "p4de.24xlarge": ("a100-sxm-80gb", 4),
        "p5.48xlarge": ("h100-sxm", 32),
        "p5e.48xlarge": ("h200-sxm", 32),
        "p5en.48xlarge": ("h200-sxm", 16),
        "p6-b200.48xlarge": ("b200", 8),
    }
    for name, (gpu_profile, devices) in expected.items():
        limits = PROFILES.get(name)
        assert (
            limits.values["fabric"] == "efa" and limits.values["efa_devices_expected"] == devices
        ), name
        parent = PROFILES.get(gpu_profile)
        assert limits.values["nvlink_links_expected"] == parent.values["nvlink_links_expected"], (
            name
        )
        assert limits.values["min_power_limit_w"] == parent.values["min_power_limit_w"], name
    assert PROFILES.match(Platform(products=("NVIDIA A100-SXM4-40GB",))).name == "a100-sxm-40gb"


# ---------------------------------------------------------------- triage


def triage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuhealth.cli", "triage", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )


def fabric_findings(proc: subprocess.CompletedProcess) -> dict[str, dict[str, Any]]:
    doc = json.loads(proc.stdout)
    return {f["check"]: f for f in doc["findings"] if f["check"] in FABRIC_CHECKS}


def test_triage_of_the_p4de_fi_info_passes_p4de_and_fails_p5():
    ok = triage(str(FI_INFO_P4DE), "--profile", "p4de.24xlarge")
    assert ok.returncode == 0, ok.stderr
    found = fabric_findings(ok)
    assert found["efa_fi_info"]["status"] == "PASS"
    assert "not evaluated" in found["efa_device_count"]["message"]
    bad = triage(str(FI_INFO_P4DE), "--profile", "p5.48xlarge")
    assert bad.returncode == 1
    finding = fabric_findings(bad)["efa_fi_info"]
    assert finding["status"] == "FAIL" and "expected 32, found 4" in finding["message"]


def test_triage_of_the_sysfs_copy_with_an_ib_profile(tmp_path):
    (tmp_path / "h100-ib.yml").write_text(
        "extends: h100-sxm\nfabric: infiniband\nib_ports_expected: 8\n"
        "ib_max_port_rcv_errors: 20\nib_max_excessive_buffer_overrun_errors: 15\n"
    )
    proc = triage(str(IB_CLASS), "--profile", "h100-ib", "--profile-dir", str(tmp_path))
    assert proc.returncode == 1, proc.stderr
    found = fabric_findings(proc)
    assert found["ib_error_counters"]["status"] == "FAIL"
    assert "mlx5_1 port 1: link_downed 255" in found["ib_error_counters"]["message"]
    for name in ("ib_port_count", "ib_port_state", "ib_port_rate", "ib_firmware_uniform"):
        assert found[name]["status"] == "PASS", found[name]
    assert found["efa_device_count"]["status"] == "SKIP"
    assert "not an EFA host (fabric: infiniband" in found["efa_device_count"]["message"]


def test_triage_of_a_sysfs_copy_without_driver_links_does_not_judge_efa():
    found = fabric_findings(triage(str(IB_CLASS), "--profile", "p5.48xlarge"))
    for name in ("efa_device_count", "efa_ports_active"):
        assert found[name]["status"] == "SKIP"
        assert "no device/driver links to tell EFA devices" in found[name]["message"]


# ---------------------------------------------------------------- the suite


INVENTORY = """\
all:
  hosts:
    efa1:
      gpu_profile: p4de.24xlarge
    efa2:
      gpu_profile: p5.48xlarge
    ib1:
      gpu_profile: h100-sxm
      fabric: infiniband
      ib_ports_expected: 8
      ib_max_port_rcv_errors: 20
      ib_max_excessive_buffer_overrun_errors: 15
    plain1: {}
"""


@pytest.mark.suite
def test_suite_judges_fabric_sections_of_saved_facts(tmp_path, fi_info_on_path):
    fi_info_on_path(REPLAY_P4DE)
    efa = probe(efa_tree(tmp_path / "efa", P4DE_DEVICES), "p4de.24xlarge")
    sections = {"efa1": efa, "efa2": efa, "ib1": ib_section(), "plain1": probe(tmp_path / "none")}
    facts = tmp_path / "facts"
    facts.mkdir()
    for host, section in sections.items():
        doc = healthy_h100()
        # Probed without the GPUs, these sections hold no GPU positions: gpu_nic_affinity
        # skips as on facts that predate them (test_gpu_nic_affinity.py judges real ones).
        doc["fabric"] = {k: v for k, v in section.items() if k not in ("probe_errors", "gpu_pci")}
        (facts / f"{host}.json").write_text(json.dumps(doc))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    run = run_suite(
        tmp_path / "r", "--facts", str(facts), "--inventory", str(inventory), "-k", "test_fabric.py"
    )
    outcomes = run.outcomes()
    assert len(outcomes) == 4 * (len(NODE_CHECKS) + 8), run.output
    affinity = {k: v for k, v in outcomes.items() if k.startswith("test_gpu_nic_affinity[")}
    assert len(affinity) == 32 and set(affinity.values()) == {"skipped"}
    efa_tests = [f"test_{n}" for n in FABRIC_CHECKS if n.startswith("efa_")]
    ib_tests = [f"test_{n}" for n in FABRIC_CHECKS if n.startswith("ib_")]
    assert {outcomes[f"{t}[efa1]"] for t in efa_tests} == {"passed"}
    assert {outcomes[f"{t}[efa1]"] for t in ib_tests} == {"skipped"}
    assert outcomes["test_efa_device_count[efa2]"] == "failed"
    assert outcomes["test_efa_fi_info[efa2]"] == "failed"
    assert outcomes["test_efa_ports_active[efa2]"] == "passed"
    assert outcomes["test_ib_error_counters[ib1]"] == "failed"
    assert {outcomes[f"{t}[ib1]"] for t in ib_tests if t != "test_ib_error_counters"} == {"passed"}
    assert {outcomes[f"test_{n}[plain1]"] for n in NODE_CHECKS} == {"skipped"}
    assert run.rc == 1
    nodes = run.verdicts["nodes"]
    assert nodes["efa1"]["verdict"] == "PASS"
    # Only fabric checks ran and none applies: nothing vouches for plain1.
    assert nodes["plain1"]["verdict"] == "NOT_CHECKED"
    assert nodes["plain1"]["reasons"] == [
        f"no check passed or failed on plain1 ({len(NODE_CHECKS) + 8} skipped)"
    ]
    assert nodes["efa2"]["verdict"] == "FAIL"
    assert any("expected 32 EFA devices, found 4" in r for r in nodes["efa2"]["reasons"])
    assert any("expected 32, found 4" in r for r in nodes["efa2"]["reasons"])
    assert nodes["ib1"]["verdict"] == "FAIL"
    assert nodes["ib1"]["reasons"] == [
        "ib1: mlx5_1 port 1: link_downed 255 (saturated) > 0 [ib_error_counters]"
    ]
    assert nodes["ib1"]["actions"] == ["INSPECT"]
    assert any("cable or transceiver" in a for a in nodes["ib1"]["advice"])


@pytest.mark.suite
def test_machine_without_rdma_devices_skips_every_fabric_check(tmp_path):
    run = run_suite(tmp_path / "r", "-k", "test_fabric.py")
    me = socket.gethostname()
    messages = run.messages()
    assert run.rc == 0, run.output
    assert set(run.outcomes().values()) == {"skipped"}
    assert len(messages) == len(NODE_CHECKS) + UNKNOWN_GPU_SLOTS
    for name, message in messages.items():
        if name.startswith("test_gpu_nic_affinity["):  # no GPU here: no slot to judge
            assert f"no NVIDIA GPU/driver on {me}" in message, name
        else:
            assert f"{me}: not an" in message and "(fabric: none" in message, name


# ---------------------------------------------------------------- ibstat, ibv_devinfo pasted

IBSTAT_H100 = DATA / "gpud_ibstat_47.0_h100_all_active.txt"
IBSTAT_PANIC = DATA / "gpud_ibstat_39.0_a100_ibpanic_mlx5_8.txt"
DEVINFO = DATA / "heioy_ibv_devinfo_2x_mlx4_port2_down.txt"
DEVINFO_V = DATA / "heioy_ibv_devinfo_v_mlx4_port2_polling.txt"


def test_ibstat_gives_the_devices_the_sysfs_reader_gives():
    devices = {d["name"]: d for d in parse_ibstat.parse(IBSTAT_H100.read_text())}
    assert list(devices)[-1] == "mlx5_bond_0" and len(devices) == 9
    port = devices["mlx5_0"]["ports"][0]
    assert (port["state"], port["state_code"], port["phys_state"], port["phys_state_code"]) == (
        "ACTIVE",
        4,
        "LinkUp",
        5,
    )
    assert (port["rate_gbps"], port["link_layer"]) == (400.0, "InfiniBand")
    assert (devices["mlx5_0"]["fw_ver"], devices["mlx5_0"]["hca_type"]) == ("28.41.1000", "MT4129")
    assert port["counters"] is None and port["unavailable"]["counters"]["kind"] == "absent"
    assert devices["mlx5_bond_0"]["ports"][0]["link_layer"] == "Ethernet"


def test_ibv_devinfo_plain_and_verbose():
    plain = parse_ibstat.parse(DEVINFO.read_text())
    assert [(d["name"], [(p["port"], p["state"]) for p in d["ports"]]) for d in plain] == [
        ("mlx4_1", [(1, "ACTIVE"), (2, "DOWN")]),
        ("mlx4_0", [(1, "ACTIVE"), (2, "DOWN")]),
    ]
    assert plain[0]["ports"][0]["unavailable"]["phys_state"]["kind"] == "absent"
    (verbose,) = parse_ibstat.parse(DEVINFO_V.read_text())
    (port,) = verbose["ports"]
    assert (port["state"], port["phys_state"], port["rate_gbps"]) == ("DOWN", "Polling", 10.0)


def _ib_profile(tmp_path: Path, ports: int) -> tuple[str, ...]:
    (tmp_path / "ib.yml").write_text(
        "extends: h100-sxm\nfabric: infiniband\nib_min_rate_gbps: 200\n"
        f"ib_ports_expected: {ports}\n"
    )
    return ("--profile", "ib", "--profile-dir", str(tmp_path))


def test_triage_of_a_healthy_ibstat_passes_and_leaves_counters_not_evaluated(tmp_path):
    proc = triage(str(IBSTAT_H100), *_ib_profile(tmp_path, 8))
    assert proc.returncode == 0, proc.stderr
    found = fabric_findings(proc)
    for name in ("ib_port_count", "ib_port_state", "ib_port_rate", "ib_firmware_uniform"):
        assert found[name]["status"] == "PASS", found[name]
    counters = found["ib_error_counters"]
    assert counters["status"] == "SKIP" and "not evaluated" in counters["message"]


def test_triage_of_ibstat_that_could_not_read_an_hca_fails_the_port_count(tmp_path):
    found = fabric_findings(triage(str(IBSTAT_PANIC), *_ib_profile(tmp_path, 9)))
    assert found["ib_port_count"]["status"] == "FAIL"
    assert "mlx5_8: ports not readable" in found["ib_port_count"]["message"]


@pytest.mark.parametrize(("sample", "phys"), [(DEVINFO, "not reported"), (DEVINFO_V, "Polling")])
def test_triage_of_ibv_devinfo_fails_the_down_ports(tmp_path, sample, phys):
    found = fabric_findings(triage(str(sample), *_ib_profile(tmp_path, 4)))
    state = found["ib_port_state"]
    assert state["status"] == "FAIL" and "mlx4_1 port 2 state DOWN (1)" in state["message"]
    assert phys in state["message"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "CA 'mlx5_0'\n\tCA type: MT4129\n\tPort 1:\n\t\tState: Sideways\n",
            "unknown port state",
        ),
        ("CA 'mlx5_0'\n\tCA type: MT4129\n\tgarbage\n", "not a `key: value` line"),
        ("hello\n", "no device"),
    ],
)
def test_ibstat_that_cannot_be_read_is_refused(text, message):
    with pytest.raises(ParseError, match=message):
        parse_ibstat.parse(text)


def test_an_ibstat_device_cut_short_has_unreadable_ports():
    text = IBSTAT_H100.read_text()
    cut = text[: text.index("Physical state")]
    (device,) = parse_ibstat.parse(cut)
    assert device["ports"] is None and "cut short" in device["unavailable"]["ports"]["detail"]
