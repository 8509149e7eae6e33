"""The shipped probe on every node Python we support, 3.6 (RHEL 8's platform-python) to 3.13.

Each CPython found under pyenv compiles the bundle transport ships and runs it through the real
transport command, with nvidia-ml-py over the fake libnvidia-ml.so.1 and without it (the
probe then reads the stand-in nvidia-smi, a client of the same fake NVML). Its facts document
must be the one the controller's Python gets, but for what changes from one run to the next.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest

from gpuhealth.transport import node_modules, parse_output, probe_call
from selftest.facts import TREE, probe_config
from selftest.fakenvml import load_scenario, nvml_env, write_scenario
from selftest.suite import fake_tool, shell_probe

SUPPORTED = [f"3.{minor}" for minor in range(6, 14)]
NVIDIA_SMI = Path(__file__).parent / "fakenvml" / "nvidia_smi.py"
# What differs between two runs on one Python: clocks, durations, free bytes, the Python.
VOLATILE = {
    ("collected_at",),
    ("duration_s",),
    ("host", "python"),
    ("kernel_log", "since"),
    ("kernel_log", "until"),
    ("fabric_manager", "since"),
    ("fabric_manager", "until"),
    ("gpus", "nvlink_errors", "window_s"),  # each GPU's own, first counter read to second
}


def interpreter(version: str) -> str:
    """The CPython of a minor version (pyenv's, else `pythonX.Y` on PATH), or skip saying
    how to get it."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(root.glob(f"{version}.*/bin/python{version}"))
    if found:
        return str(found[-1])
    on_path = shutil.which(f"python{version}")
    if on_path is None:
        pytest.skip(f"CPython {version} is not installed here (pyenv install {version})")
    return on_path


@pytest.fixture(params=SUPPORTED, ids=[f"py{v}" for v in SUPPORTED])
def node_python(request) -> str:
    return interpreter(request.param)


def stable(doc: Any, path: tuple[str, ...] = ()) -> Any:
    """The document without the values that change between runs."""
    if isinstance(doc, dict):
        return {k: stable(v, (*path, k)) for k, v in doc.items() if (*path, k) not in VOLATILE}
    if isinstance(doc, list):
        # free space and free memory (numactl --hardware, where numactl is installed) move
        if path == ("system", "disks"):
            return [{k: v for k, v in d.items() if k != "free_bytes"} for d in doc]
        if path == ("system", "numactl", "hardware", "nodes"):
            return [{k: v for k, v in d.items() if k != "free_mb"} for d in doc]
        return [stable(v, path) for v in doc]
    return doc


@pytest.fixture(scope="module")
def bed(tmp_path_factory, fake_nvml_lib) -> dict[str, Any]:
    """A scenario with faults and unsupported fields, the fake nvidia-smi, nvidia-ml-py alone."""
    tmp = tmp_path_factory.mktemp("pythons")
    scenario = load_scenario("ecc-uncorrectable-gpu3")
    scenario.setdefault("gpu", {}).update(
        {0: {"serial": "NOT_SUPPORTED"}, 4: {"processes": ["4242:1024"]}}
    )
    env = nvml_env(fake_nvml_lib.parent, write_scenario(scenario, tmp / "scenario.txt"))
    env.pop("PYTHONPATH", None)
    bindings = tmp / "nvidia-ml-py"
    bindings.mkdir()
    shutil.copy(pynvml.__file__, bindings)
    fake_tool(tmp / "bin", "nvidia-smi", f'exec {sys.executable} {NVIDIA_SMI} "$@"\n')
    env["PATH"] = f"{tmp / 'bin'}:{env['PATH']}"
    return {"tmp": tmp, "env": env, "bindings": bindings}


def probe_with(python: str, bed: dict[str, Any], bindings: bool) -> dict[str, Any]:
    """The facts document of the shipped probe run by `python` (site-packages off), with or
    without nvidia-ml-py importable."""
    wrapper = bed["tmp"] / f"python-{abs(hash((python, bindings)))}"
    path = f"PYTHONPATH={bed['bindings']} " if bindings else ""
    flags = "-S" if bindings else "-E -S"
    wrapper.write_text(f'#!/bin/sh\n{path}exec {python} {flags} "$@"\n')
    wrapper.chmod(0o755)
    proc = shell_probe(probe_call(probe_config(TREE), python=str(wrapper)), bed["env"])
    assert proc.returncode == 0, proc.stderr
    return parse_output(proc.stdout)


@pytest.fixture(scope="module")
def reference(bed) -> dict[bool, dict[str, Any]]:
    """What the controller's own Python gets, with and without nvidia-ml-py."""
    return {bindings: probe_with(sys.executable, bed, bindings) for bindings in (True, False)}


def test_the_shipped_bundle_compiles(node_python):
    modules, _ = node_modules()
    script = (
        "import json, sys\n"
        "for name, text in json.load(sys.stdin).items():\n"
        "    compile(text, '<gpuhealth>/' + name, 'exec')\n"
    )
    proc = subprocess.run(
        [node_python, "-E", "-S", "-c", script],
        input=json.dumps(modules),
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("bindings", [True, False], ids=["nvml", "nvidia-smi"])
def test_the_probe_gives_the_controllers_document(node_python, bed, reference, bindings):
    doc = probe_with(node_python, bed, bindings)
    version = subprocess.run(
        [node_python, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert doc["host"]["python"] == version
    assert doc["source"] == ("nvml" if bindings else "nvidia-smi")
    assert doc["gpus"][3]["ecc"]["volatile"]["uncorrected"] > 0
    assert stable(doc) == stable(reference[bindings])
