"""`gpuhealth node-check` on this machine under the fake NVML, and the Slurm rules it and
`gpuhealth act slurm` share (planned against sinfo's view; the real Slurm is on the bed:
selftest/test_roles.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuhealth.integrations import slurm
from gpuhealth.integrations import verdicts as runs
from selftest.fakenvml import nvml_env, write_scenario

GPUHEALTH = str(Path(sys.executable).with_name("gpuhealth"))
TREE = Path(__file__).parent / "data" / "system" / "hgx-h100-2socket"
H100 = ("--profile", "h100-sxm", "--expected-gpus", "8")


def node_check(lib: Path, scenario: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    conf = write_scenario(scenario, tmp / f"{scenario}.conf")
    return subprocess.run(
        [GPUHEALTH, "node-check", "--host", "gpu-node-1", *args],
        env=nvml_env(lib.parent, conf),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_healthy_node_passes(fake_nvml_lib, tmp_path):
    done = node_check(fake_nvml_lib, "healthy-h100x8", tmp_path, *H100, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert (doc["verdict"], doc["fail_count"], doc["failed_checks"]) == ("PASS", 0, [])
    assert doc["host"] == "gpu-node-1"


def test_a_faulty_node_fails_with_each_finding_and_its_action(fake_nvml_lib, tmp_path):
    done = node_check(fake_nvml_lib, "ecc-gpu3-recovery-gpu5", tmp_path, *H100, "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "FAIL"
    found = {(f["check"], f["gpu"]) for f in doc["failed_checks"]}
    assert {("ecc_errors", 3), ("recovery_action", 5)} <= found
    assert doc["fail_count"] == len(doc["failed_checks"])
    assert all(
        f["action"] and f["message"].startswith("gpu-node-1 gpu") for f in doc["failed_checks"]
    )
    text = node_check(fake_nvml_lib, "ecc-gpu3-recovery-gpu5", tmp_path, *H100)
    assert text.returncode == 1
    assert "gpu-node-1: FAIL (" in text.stdout
    assert "FAIL  ecc_errors" in text.stdout


def test_a_missing_gpu_fails_its_slot(fake_nvml_lib, tmp_path):
    done = node_check(fake_nvml_lib, "healthy-h100x8", tmp_path, "--expected-gpus", "9", "--json")
    doc = json.loads(done.stdout)
    assert done.returncode == 1
    assert ("gpu_count", None) in {(f["check"], f["gpu"]) for f in doc["failed_checks"]}


def test_a_lost_gpu_heads_the_verdict_on_a_node_in_use(fake_nvml_lib, tmp_path):
    done = node_check(
        fake_nvml_lib, "gpu-lost-gpu3", tmp_path, *H100, "--node-state", "in-use", "--json"
    )
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert (doc["verdict"], doc["node_state"]) == ("FAIL", "in-use")
    assert doc["reasons"][0].startswith(
        "gpu-node-1 gpu3 (uuid unknown): GPU lost: NVML answered "
        "nvmlDeviceGetHandleByIndex(gpu=3) with GPU is lost"
    )
    assert doc["actions"][0] == "REBOOT_NODE"
    lost = [f for f in doc["failed_checks"] if f["check"] == "gpu_lost"]
    assert [(f["gpu"], f["action"]) for f in lost] == [(3, "REBOOT_NODE")]
    assert not any("mixed GPU models" in reason for reason in doc["reasons"])


def test_a_gpu_on_the_bus_the_driver_does_not_list_heads_the_verdict(fake_nvml_lib, tmp_path):
    """The probe reads the bus under --root: 8 GPUs there, 7 listed by the driver."""
    done = node_check(fake_nvml_lib, "gpu-unlisted-bus5d", tmp_path, "--root", str(TREE), "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["reasons"][0] == (
        "gpu-node-1: expected 8 GPUs, found 7; 8 NVIDIA GPUs on the PCI bus, the driver lists 7: "
        "00000000:5D:00.0 lost (on the bus, not listed by the driver) [gpu_count]"
    )
    assert ("gpu_count", None, "REBOOT_NODE") in {
        (f["check"], f["gpu"], f["action"]) for f in doc["failed_checks"]
    }


def test_npd_plugin_mode_is_one_line_and_the_npd_exit_codes(fake_nvml_lib, tmp_path):
    ok = node_check(fake_nvml_lib, "healthy-h100x8", tmp_path, *H100, "--npd")
    bad = node_check(fake_nvml_lib, "ecc-gpu3-recovery-gpu5", tmp_path, *H100, "--npd")
    unknown = node_check(fake_nvml_lib, "healthy-h100x8", tmp_path, "--profile", "nosuch", "--npd")
    assert [ok.returncode, bad.returncode, unknown.returncode] == [0, 1, 2]
    for done in (ok, bad, unknown):
        assert done.stdout.count("\n") == 1 and len(done.stdout.strip()) <= 80, done.stdout
    assert bad.stdout.startswith("FAIL (+1): gpu3 ecc_errors: "), bad.stdout
    assert ok.stdout.startswith("PASS: ") and "PASS: PASS" not in ok.stdout, ok.stdout


def test_a_hung_probe_fails_the_node_on_its_deadline(fake_nvml_lib, tmp_path):
    """A driver call that never returns: the probe is killed at --timeout, the node fails
    closed with the reason, and node-check returns soon after."""
    hang = tmp_path / "hang-python3"
    hang.write_text("#!/bin/sh\nexec sleep 600\n")
    hang.chmod(0o755)
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  hosts:\n    gpu-node-1:\n"
        f"      gpuhealth_python: {hang}\n      gpu_profile: h100-sxm\n"
    )
    start = time.monotonic()
    done = node_check(
        fake_nvml_lib,
        "healthy-h100x8",
        tmp_path,
        "--inventory",
        str(inventory),
        "--timeout",
        "2",
        "--json",
    )
    took = time.monotonic() - start
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["failed_checks"][0]["check"] == "probe"
    assert "the probe failed: probe killed after 2 s" in doc["failed_checks"][0]["message"]
    assert took < 20, took


def test_bad_selection_is_a_usage_error(fake_nvml_lib, tmp_path):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all:\n  hosts:\n    other-node: {}\n")
    done = node_check(fake_nvml_lib, "healthy-h100x8", tmp_path, "--inventory", str(inventory))
    assert done.returncode == 2
    assert "does not list this host (gpu-node-1)" in done.stderr
    negative = node_check(fake_nvml_lib, "healthy-h100x8", tmp_path, "--timeout", "0")
    assert negative.returncode == 2 and "--timeout" in negative.stderr


# ---------------------------------------------------------------- the Slurm rules


def _run(**nodes: tuple[str, list[str]]) -> runs.Run:
    return runs.Run(
        Path("verdicts.json"),
        "now",
        True,
        {h: runs.NodeState(h, v, reasons, []) for h, (v, reasons) in nodes.items()},
    )


SINFO = (
    "n1|idle|none\n"
    "n1|idle|none\n"  # a node in two partitions is listed twice
    "n2|idle|none\n"
    "n3|drained|gpuhealth: FAIL old reason\n"
    "n4|drained*|maintenance: PSU swap | ticket 42\n"
    "n5|draining|gpuhealth: FAIL n5 gpu1: x\n"
    "n6|down*|Not responding\n"
)


def test_sinfo_is_read_with_the_reason_last():
    nodes = slurm.parse_sinfo(SINFO)
    assert list(nodes) == ["n1", "n2", "n3", "n4", "n5", "n6"]
    assert nodes["n4"].reason == "maintenance: PSU swap | ticket 42"
    assert nodes["n4"].drained and not nodes["n4"].ours
    assert nodes["n5"].drained and nodes["n5"].ours
    assert nodes["n6"].drained and not nodes["n1"].drained
    assert nodes["n1"].reason == ""


def test_the_plan_drains_fails_resumes_its_own_and_leaves_others_alone():
    run = _run(
        n1=("PASS", []),
        n2=("FAIL", ["n2 gpu3: 4 uncorrectable ECC errors [ecc_errors]"]),
        n3=("PASS", []),
        n4=("UNREACHABLE", ["ssh failed"]),
        n5=("WARN", ["w"]),
        n6=("FAIL", ["x"]),
        n7=("FAIL", ["not in Slurm"]),
    )
    changes, notes = slurm.plan(run, {h: h for h in run.nodes}, slurm.parse_sinfo(SINFO))
    assert [(c.node, c.state) for c in changes] == [("n2", "DRAIN"), ("n3", "RESUME")]
    assert changes[0].reason == "gpuhealth: FAIL n2 gpu3: 4 uncorrectable ECC errors [ecc_errors]"
    assert changes[0].shown() == (
        "scontrol update NodeName=n2 State=DRAIN "
        "'Reason=gpuhealth: FAIL n2 gpu3: 4 uncorrectable ECC errors [ecc_errors]'"
    )
    assert changes[1].argv() == ["scontrol", "update", "NodeName=n3", "State=RESUME"]
    text = "\n".join(notes)
    assert "n4: UNREACHABLE, left alone: already drained* by someone else" in text
    assert "n5: WARN, kept drained" in text
    assert "n6: FAIL, left alone: already down* by someone else (Not responding)" in text
    assert "n7: FAIL, but Slurm has no node n7" in text
    # ... and it fails the command: a node to drain that Slurm does not know keeps its jobs.
    assert slurm.lost(run, {h: h for h in run.nodes}, slurm.parse_sinfo(SINFO)) == ["n7"]


def test_an_incomplete_run_never_resumes():
    run = _run(n3=("PASS", []))
    incomplete = runs.Run(run.path, run.generated_at, False, run.nodes)
    changes, notes = slurm.plan(incomplete, {"n3": "n3"}, slurm.parse_sinfo(SINFO))
    assert changes == []
    assert notes == ["n3: PASS, not resumed: the run did not finish"]


def test_inventory_names_map_to_slurm_names():
    run = _run(**{"dgx-gpu3": ("FAIL", ["x"])})
    changes, _ = slurm.plan(run, {"dgx-gpu3": "n2"}, slurm.parse_sinfo(SINFO))
    assert [(c.node, c.host) for c in changes] == [("n2", "dgx-gpu3")]
    assert slurm.node_name("node7.cluster.local", {}) == "node7.cluster.local"
    assert slurm.node_name("node7", {"slurm_node_name": "gpu007"}) == "gpu007"
    assert slurm.node_name("node7", {"slurm_node_name": ""}) == "node7"


@pytest.mark.parametrize(
    "headline",
    ["x" * 1000, 'a "quoted"\nmulti-line\treason\x00', "ünïcode ✓ " * 40],
)
def test_a_reason_is_one_printable_line_within_the_limit(headline):
    reason = slurm.reason(headline)
    assert reason.startswith("gpuhealth: ") and len(reason) <= slurm.REASON_MAX
    assert reason.isprintable() and '"' not in reason


def test_act_slurm_says_what_is_wrong_with_its_input(tmp_path):
    missing = subprocess.run(
        [GPUHEALTH, "act", "slurm", "--verdicts", str(tmp_path / "none.json")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2
    assert "none.json: no such file (run the suite first)" in missing.stdout
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": {"n1": {"verdict": "GREAT"}}}')
    done = subprocess.run(
        [GPUHEALTH, "act", "slurm", "--verdicts", str(bad)], capture_output=True, text=True
    )
    assert done.returncode == 2 and "node 'n1' has no valid verdict" in done.stdout


def test_a_broken_inventory_is_a_usage_error_and_unknown_to_npd(fake_nvml_lib, tmp_path):
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("all: [unclosed\n")
    done = node_check(fake_nvml_lib, "healthy-h100x8", tmp_path, "--inventory", str(inventory))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"inventory {inventory}: ansible-inventory failed" in done.stderr
    npd = node_check(
        fake_nvml_lib, "healthy-h100x8", tmp_path, "--inventory", str(inventory), "--npd"
    )
    assert npd.returncode == 2 and npd.stdout.count("\n") == 1, npd.stdout


def test_slurm_messages_leave_json_and_npd_output_alone(fake_nvml_lib, tmp_path):
    """No Slurm cluster here: --slurm says so on stderr when stdout is a document or NPD's
    line, and the exit status says Slurm was not told."""
    done = node_check(fake_nvml_lib, "healthy-h100x8", tmp_path, *H100, "--json", "--slurm")
    assert json.loads(done.stdout)["verdict"] == "PASS"
    assert done.stderr.startswith("slurm: "), done.stderr
    assert done.returncode == 1
    npd = node_check(fake_nvml_lib, "healthy-h100x8", tmp_path, *H100, "--npd", "--slurm")
    assert npd.stdout.count("\n") == 1 and npd.stderr.startswith("slurm: ")
