"""The test bed's stand-in nvidia-smi against the fake NVML: it must tell the same story as NVML.

On the bed, a node without nvidia-ml-py is probed through `nvidia-smi -q -x`; these tests make
sure that path sees exactly the facts the NVML path sees, scenario by scenario, so the end-to-end
tests can expect the same verdicts from both.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.families.gpu import parse_smi_xml as nvidia_smi_xml
from selftest.fakenvml import (
    SCENARIOS,
    build_library,
    nvml_env,
    scenario_text,
    write_scenario,
)
from selftest.test_probe_nvml import run_probe

STANDIN = Path(__file__).with_name("nvidia_smi.py")
# nvidia-smi -q does not report NVLink; NVML gives a mask where nvidia-smi gives names only.
# Only NVML reads the NVLink error counters and the platform info (the fake nvidia-smi prints
# neither).
NOT_IN_XML = ("nvlink", "nvlink_errors", "platform", "lost", "unavailable")  # lost: NVML only
# Not compared: a hung call (nvidia-smi hangs with it), a lost GPU (nvidia-smi prints an error
# for it, not a record), and values that change with time since nvmlInit (`*_after_s`), which
# two processes started one after the other see differently.
SCENARIO_NAMES = sorted(
    p.stem
    for p in SCENARIOS.glob("*.yml")
    if p.stem != "nvml-hang"
    and not p.stem.startswith("gpu-lost")
    and "_after_s" not in scenario_text(p.stem)
)


def nvidia_smi(lib: Path, scenario_file: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(STANDIN), *args],
        env=nvml_env(lib.parent, scenario_file),
        capture_output=True,
        text=True,
        timeout=60,
    )


def kinds_only(value: Any) -> Any:
    """A nested record with its `unavailable` entries reduced to their kinds: NVML and
    nvidia-smi explain the same gap in their own words."""
    if not isinstance(value, dict):
        return value
    return {
        k: {n: why["kind"] for n, why in v.items()} if k == "unavailable" else kinds_only(v)
        for k, v in value.items()
    }


def comparable(gpu: dict[str, Any]) -> dict[str, Any]:
    same = {k: kinds_only(v) for k, v in gpu.items() if k not in NOT_IN_XML}
    if same.get("clock_event_reasons"):
        same["clock_event_reasons"] = same["clock_event_reasons"]["active"]
    same["unavailable"] = {
        k: why["kind"] for k, why in gpu["unavailable"].items() if k not in NOT_IN_XML
    }
    return same


@pytest.mark.parametrize("scenario", [s for s in SCENARIO_NAMES if s != "no-driver"])
def test_xml_tells_what_nvml_tells(scenario, fake_nvml_lib, tmp_path):
    scenario_file = write_scenario(scenario, tmp_path / "scenario.conf")
    proc = nvidia_smi(fake_nvml_lib, scenario_file, "-q", "-x")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith('<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM')
    from_xml = nvidia_smi_xml.parse(proc.stdout)
    from_nvml = run_probe(fake_nvml_lib, scenario_file)["r"]
    assert from_xml["errors"] == []
    assert from_xml["gpu_count"] == from_nvml["gpu_count"] == len(from_xml["gpus"])
    for key in ("version", "cuda_driver_version"):
        assert from_xml["driver"][key] == from_nvml["driver"][key]
    assert [comparable(g) for g in from_xml["gpus"]] == [comparable(g) for g in from_nvml["gpus"]]


def test_recovery_action_is_printed_from_r570_on(fake_nvml_lib, tmp_path):
    scenario = {"extends": "recovery-reset-gpu5", "driver_version": "560.35.03"}
    old = nvidia_smi(fake_nvml_lib, write_scenario(scenario, tmp_path / "560.conf"), "-q", "-x")
    assert old.returncode == 0 and "gpu_recovery_action" not in old.stdout
    new = write_scenario("recovery-reset-gpu5", tmp_path / "570.conf")
    xml = nvidia_smi(fake_nvml_lib, new, "-q", "-x").stdout
    assert xml.count("<gpu_recovery_action>None</gpu_recovery_action>") == 7
    assert xml.count("<gpu_recovery_action>Reset</gpu_recovery_action>") == 1


def test_list_gpus(fake_nvml_lib, tmp_path):
    proc = nvidia_smi(fake_nvml_lib, write_scenario("missing-gpu7", tmp_path / "s.conf"), "-L")
    lines = proc.stdout.splitlines()
    assert len(lines) == 7
    assert lines[0] == (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-fa4e0000-0000-4000-8000-000000000000)"
    )


def test_fails_like_nvidia_smi_without_a_driver(fake_nvml_lib, tmp_path):
    proc = nvidia_smi(fake_nvml_lib, write_scenario("no-driver", tmp_path / "s.conf"), "-q", "-x")
    assert proc.returncode == 9  # nvidia-smi(1): NVIDIA driver is not loaded
    assert "couldn't communicate with the NVIDIA driver" in proc.stderr
    assert proc.stdout == ""


def test_refuses_what_it_does_not_implement(fake_nvml_lib, tmp_path):
    proc = nvidia_smi(fake_nvml_lib, tmp_path / "none.conf", "-q")
    assert proc.returncode == 2
    assert "only `-q -x` and `-L` are implemented" in proc.stderr


def test_a_library_built_as_another_driver_release(tmp_path):
    """What the test bed's 560 driver package ships: 560 unless the scenario says otherwise."""
    lib = build_library(tmp_path, driver_version="560.35.03", cuda_version=12060)
    assert lib == tmp_path / "lib-560.35.03" / "libnvidia-ml.so.1"
    scenario_file = tmp_path / "scenario.conf"
    scenario_file.write_text("gpu.count=2\n")
    facts = run_probe(lib, scenario_file)["r"]
    assert facts["driver"]["version"] == "560.35.03"
    assert facts["driver"]["cuda_driver_version"] == "12.6"
    assert [g["recovery_action"] for g in facts["gpus"]] == [None, None]
    assert {g["unavailable"]["recovery_action"]["kind"] for g in facts["gpus"]} == {"not_supported"}
    xml = nvidia_smi(lib, scenario_file, "-q", "-x").stdout
    assert "<driver_version>560.35.03</driver_version>" in xml
    assert "<cuda_version>12.6</cuda_version>" in xml
