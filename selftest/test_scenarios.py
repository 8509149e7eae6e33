"""Fake-GPU scenarios end to end: the real suite, the real probe and the real nvidia-ml-py,
against the fake libnvidia-ml.so.1. Each scenario must fail exactly its own tests.

The probe reads /proc and /sys under the 2-socket HGX H100 fixture tree (`--probe-root`, as in a
container) and finds stand-in numactl, systemctl and journalctl first on PATH, so the runs do
not depend on the machine running them.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from gpuhealth import registry
from selftest.facts import expected_baseline_skip
from selftest.fakenvml import load_scenario, nvml_env, write_scenario
from selftest.suite import run_suite

HOST = socket.gethostname()
GPU_CHECKS = [name for name in registry.names("gpu") if registry.checks()[name].level == "quick"]
TREE = Path(__file__).parent / "data" / "system" / "hgx-h100-2socket"
NODE_TOOLS = Path(__file__).parent / "standins" / "node"


@pytest.fixture
def h100_inventory(tmp_path: Path) -> Path:
    path = tmp_path / "hosts.yml"
    path.write_text(
        f"all:\n  hosts:\n    {HOST}:\n      gpu_profile: h100-sxm\n      gpu_count: 8\n"
    )
    return path


def suite_on(scenario: str, tmp_path: Path, lib: Path, inventory: Path, *args: str):
    scenario_file = write_scenario(load_scenario(scenario), tmp_path / f"{scenario}.conf")
    env = nvml_env(lib.parent, scenario_file)
    env["PATH"] = f"{NODE_TOOLS}:{os.environ['PATH']}"
    return run_suite(
        tmp_path / "reports",
        "--inventory",
        str(inventory),
        "--probe-root",
        str(TREE),
        *args,
        env=env,
    )


def failed(run) -> set[str]:
    return {name for name, status in run.outcomes().items() if status in ("failed", "error")}


def gpu_tests(index: int, names: list[str] = GPU_CHECKS) -> set[str]:
    return {f"test_{name}[{HOST}-gpu{index}]" for name in names}


# Skip on a GPU nobody can read here: the node has no RDMA fabric, and no history yet.
NOT_READ_SKIPS = ["gpu_nic_affinity", "gpu_regression"]


def lost_gpu_tests(index: int) -> set[str]:
    """A lost GPU fails every check of its own that reads it, and persistence_mode (it cannot
    be read either); with its bus id unknown, numa_topology cannot place it on a NUMA node."""
    return gpu_tests(index) - gpu_tests(index, NOT_READ_SKIPS) | {
        f"test_persistence_mode[{HOST}]",
        f"test_numa_topology[{HOST}]",
    }


EXPECTED_FAILURES = {
    "healthy-h100x8": set(),
    "ecc-uncorrectable-gpu3": {f"test_ecc_errors[{HOST}-gpu3]"},
    "recovery-reset-gpu5": {f"test_recovery_action[{HOST}-gpu5]"},
    # A missing GPU also leaves the GPUs unevenly spread over the NUMA nodes.
    "missing-gpu7": {f"test_gpu_count[{HOST}]", f"test_numa_topology[{HOST}]"} | gpu_tests(7),
    "driver-560": {f"test_driver_version[{HOST}]"}
    | {f"test_recovery_action[{HOST}-gpu{i}]" for i in range(8)},
    # Past its 87 C slowdown point a real GPU also reports HW thermal slowdown.
    "hot-gpu2": {f"test_temperature[{HOST}-gpu2]", f"test_throttle[{HOST}-gpu2]"},
    "rowremap-pending-gpu1": {f"test_row_remapping[{HOST}-gpu1]"},
    "gpu-lost-gpu3": lost_gpu_tests(3),
    "gpu-lost-after-handle-gpu5": lost_gpu_tests(5),
    # As missing-gpu7: NVML numbers the 7 GPUs it lists 0-6, so slot 7 is the one missing.
    "gpu-unlisted-bus5d": {f"test_gpu_count[{HOST}]", f"test_numa_topology[{HOST}]"} | gpu_tests(7),
}

EXPECTED_MESSAGES = {
    "ecc-uncorrectable-gpu3": ("ecc_errors", 3, "volatile uncorrected ECC errors 2 > 0"),
    "recovery-reset-gpu5": (
        "recovery_action",
        5,
        "GPU recovery action is GPU_RESET (1), expected NONE",
    ),
    "missing-gpu7": ("gpu_count", None, "expected 8 GPUs, found 7"),
    "driver-560": ("driver_version", None, "driver 560.35.03 is older than the required 570"),
    "hot-gpu2": ("temperature", 2, "temperature 91 C >= limit 85 C"),
    "rowremap-pending-gpu1": ("row_remapping", 1, "row remapping pending"),
}

# Skips a scenario adds to the healthy node's, and why: a lost GPU's model is not compared.
SCENARIO_SKIPS = {
    "gpu-lost-gpu3": {"gpu_uniformity": "not compared: not read: gpu3 (model, VBIOS)"},
    "gpu-lost-after-handle-gpu5": {"gpu_uniformity": "not compared: not read: gpu5 (model, VBIOS)"},
}

# The node's first reason (its headline): a lost GPU, never a bill-of-materials finding.
HEADLINES = {
    "gpu-lost-gpu3": (
        f"{HOST} gpu3 (uuid unknown): GPU lost: NVML answered "
        "nvmlDeviceGetHandleByIndex(gpu=3) with GPU is lost (NVML_ERROR_GPU_IS_LOST",
        "gpu_lost",
    ),
    "gpu-lost-after-handle-gpu5": (
        f"{HOST} gpu5 (uuid unknown): GPU lost: NVML answered nvmlDeviceGetName(gpu=5) with "
        "GPU is lost",
        "gpu_lost",
    ),
    "gpu-unlisted-bus5d": (
        f"{HOST}: expected 8 GPUs, found 7; 8 NVIDIA GPUs on the PCI bus, the driver lists 7: "
        "00000000:5D:00.0 lost (on the bus, not listed by the driver)",
        "gpu_count",
    ),
}


@pytest.mark.suite
@pytest.mark.parametrize("scenario", sorted(EXPECTED_FAILURES))
def test_scenario_fails_exactly_its_tests(scenario, tmp_path, fake_nvml_lib, h100_inventory):
    run = suite_on(scenario, tmp_path, fake_nvml_lib, h100_inventory)
    assert failed(run) == EXPECTED_FAILURES[scenario], run.output[-3000:]
    outcomes = run.outcomes()
    all_gpu = registry.names("gpu")
    assert len(outcomes) == len(registry.names("node")) + 8 * len(all_gpu) + 1  # + nccl fleet test
    messages = run.messages()
    for test, status in outcomes.items():
        if status != "skipped":
            continue
        name = test.split("[")[0].removeprefix("test_")
        reason = expected_baseline_skip(name) if name in registry.checks() else None
        if name in registry.checks() and registry.checks()[name].family == "history":
            reason = "no baseline yet (0 runs)"  # the run's own store is new
        if name == "nccl_multinode" or (reason and registry.checks()[name].level != "quick"):
            reason = "not run at level quick"
        reason = SCENARIO_SKIPS.get(scenario, {}).get(name, reason)
        assert reason and reason in messages[test], (test, messages[test])
    verdict = run.verdicts["nodes"][HOST]
    if scenario == "healthy-h100x8":
        assert run.rc == 0 and verdict["verdict"] == "PASS"
        return
    assert run.rc == 1 and verdict["verdict"] == "FAIL"
    assert not any("mixed GPU models" in reason for reason in verdict["reasons"])
    if scenario in HEADLINES:
        headline, check = HEADLINES[scenario]
        assert verdict["reasons"][0].startswith(headline), verdict["reasons"][0]
        assert verdict["reasons"][0].endswith(f"[{check}]")
        assert next(f for f in verdict["failed"] if f["check"] == check)["action"] == "REBOOT_NODE"
        return
    check, gpu, text = EXPECTED_MESSAGES[scenario]
    entry = next(f for f in verdict["failed"] if f["check"] == check and f["gpu"] == gpu)
    assert text in entry["message"]
    assert entry["action"]
    if gpu is not None:
        assert f"{HOST} gpu{gpu} (GPU-" in entry["message"]


@pytest.mark.suite
def test_hung_nvml_call_costs_one_timeout_and_fails_what_it_could_not_read(
    tmp_path, fake_nvml_lib, h100_inventory
):
    started = time.monotonic()
    run = suite_on("nvml-hang", tmp_path, fake_nvml_lib, h100_inventory, "--nvml-call-timeout", "2")
    assert time.monotonic() - started < 60
    fails = failed(run)
    assert f"test_temperature[{HOST}-gpu4]" in fails
    assert not fails & (gpu_tests(0) | gpu_tests(1) | gpu_tests(2) | gpu_tests(3))
    # What could not be read fails; history has nothing to compare yet (its own test skips),
    # and the node has no RDMA fabric (gpu_nic_affinity skips).
    unread = {
        f"test_retired_pages[{HOST}-gpu5]",
        f"test_gpu_regression[{HOST}-gpu5]",
        f"test_gpu_nic_affinity[{HOST}-gpu5]",
    }
    assert gpu_tests(5) - unread <= fails
    message = run.messages()[f"test_temperature[{HOST}-gpu4]"]
    assert "could not read GPU temperature" in message and "timed out after 2 s" in message
    # The hang heads the node's reasons (RERUN), never the GPUs it left unread as "mixed models".
    reasons = run.verdicts["nodes"][HOST]["reasons"]
    assert reasons[0].startswith(f"{HOST} gpu4 (GPU-"), reasons[0]
    assert "NVML hung at nvmlDeviceGetTemperatureV(gpu=4) (no answer within 2 s)" in reasons[0]
    assert reasons[0].endswith("[gpu_lost]")
    assert not any("mixed GPU models" in reason for reason in reasons)
    lost = next(f for f in run.verdicts["nodes"][HOST]["failed"] if f["check"] == "gpu_lost")
    assert lost["action"] == "RERUN"
    facts = (tmp_path / "reports" / "facts" / f"{HOST}.json").read_text()
    assert "nvmlDeviceGetTemperatureV(gpu=4)" in facts


@pytest.mark.suite
def test_saved_facts_give_the_same_outcomes_offline(tmp_path, fake_nvml_lib, h100_inventory):
    live = suite_on("ecc-uncorrectable-gpu3", tmp_path, fake_nvml_lib, h100_inventory)
    offline = run_suite(
        tmp_path / "offline",
        "--facts",
        str(tmp_path / "reports" / "facts"),
        "--inventory",
        str(h100_inventory),
    )
    assert offline.outcomes() == live.outcomes()
    assert offline.verdicts["nodes"] == live.verdicts["nodes"]


@pytest.mark.suite
def test_no_driver_scenario_without_expectation_passes_with_reason(tmp_path, fake_nvml_lib):
    scenario_file = write_scenario(load_scenario("no-driver"), tmp_path / "no-driver.conf")
    run = run_suite(tmp_path / "reports", env=nvml_env(fake_nvml_lib.parent, scenario_file))
    assert run.rc == 0
    assert run.verdicts["nodes"][HOST]["verdict"] == "PASS"
