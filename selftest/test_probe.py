"""The probe and its transport, run for real: bundled into one payload, executed by a shell,
in an interpreter that has neither gpuhealth nor nvidia-ml-py installed."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
import testinfra

from gpuhealth.facts import SCHEMA_VERSION
from gpuhealth.transport import ProbeError, compact, parse_output, probe_call, run_probe
from selftest.facts import judge, probe_config
from selftest.fakenvml import load_scenario, nvml_env, write_scenario
from selftest.suite import fake_tool, shell_probe

DATA = Path(__file__).parent / "data" / "nvidia-smi"


def test_bundle_runs_without_gpuhealth_installed(bare_python):
    proc = shell_probe(probe_call(probe_config(), python=bare_python))
    assert proc.returncode == 0, proc.stderr
    doc = parse_output(proc.stdout)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert doc["host"]["hostname"]
    assert doc["source"] == "none"
    assert any(e["probe"] == "nvml" for e in doc["errors"])
    # families with no node side (nccl, dcgm's load test, history) are not shipped, not errors
    assert not [e for e in doc["errors"] if "cannot load the probe" in e["error"]], doc["errors"]


def test_compacting_keeps_the_code_and_its_strings():
    """Docstrings, comment lines and blank lines go; code, a body that was only a docstring,
    and the lines of a string that spans lines (blank or '#' ones too) stay."""
    source = (
        '"""Module doc."""\n\n# a comment\nimport os\n\n\ndef f():\n    """Only a doc."""\n\n\n'
        'def g(x):\n    """Doc\n\n    more."""\n    text = """a\n\n# not a comment\n"""\n'
        '    return x  # kept\n\n\nclass C: """one line"""\n'
    )
    small = compact(source)
    namespace: dict = {}
    exec(compile(small, "<compact>", "exec"), namespace)
    assert namespace["f"]() is None
    assert namespace["g"](3) == 3
    assert 'text = """a\n\n# not a comment\n"""' in small
    assert "Module doc" not in small and "\n# a comment" not in small
    assert "Only a doc" not in small
    assert "return x  # kept" in small and 'class C: """one line"""' in small


def test_falls_back_to_nvidia_smi_xml(tmp_path, bare_python):
    sample = DATA / "telegraf_rtx3060_570.124.04_v12.xml"
    body = (
        f'[ "$*" = "-q -x" ] && exec cat {sample}\n[ "$*" = "nvlink --status" ] && exit 0\nexit 9\n'
    )
    fake_tool(tmp_path / "bin", "nvidia-smi", body)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    proc = shell_probe(probe_call(probe_config(), python=bare_python), env)
    doc = parse_output(proc.stdout)
    assert doc["source"] == "nvidia-smi"
    assert doc["driver"]["version"] == "570.124.04"
    assert doc["gpus"][0]["recovery_action"] == 0
    # An RTX 3060 has no NVLink: nvidia-smi nvlink lists no links for it.
    assert doc["gpus"][0]["unavailable"]["nvlink"]["kind"] == "not_supported"


def test_hung_nvidia_smi_is_killed_and_recorded(tmp_path, bare_python):
    fake_tool(tmp_path / "bin", "nvidia-smi", "sleep 600\n")
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    started = time.monotonic()
    proc = shell_probe(probe_call(probe_config(nvidia_smi_timeout_s=1), python=bare_python), env)
    assert time.monotonic() - started < 10
    doc = parse_output(proc.stdout)
    assert doc["source"] == "none"
    assert any("timed out after 1 s" in e["error"] for e in doc["errors"])


def test_garbage_from_nvidia_smi_is_an_error_not_a_crash(tmp_path, bare_python):
    fake_tool(tmp_path / "bin", "nvidia-smi", "echo '<html>oops'\n")
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    doc = parse_output(shell_probe(probe_call(probe_config(), python=bare_python), env).stdout)
    assert doc["source"] == "none"
    assert any("unparsable -q -x output" in e["error"] for e in doc["errors"])


def test_reads_proc_and_sys_under_a_root_prefix(tmp_path, bare_python):
    root = tmp_path / "root"
    (root / "proc/driver/nvidia").mkdir(parents=True)
    (root / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build\n"
    )
    for bus, klass in (
        ("0000:19:00.0", "0x030200"),
        ("0000:3b:00.0", "0x030200"),
        ("0000:05:00.0", "0x068000"),
    ):
        dev = root / "sys/bus/pci/devices" / bus
        dev.mkdir(parents=True)
        (dev / "vendor").write_text("0x10de\n")
        (dev / "class").write_text(klass + "\n")
    doc = parse_output(shell_probe(probe_call(probe_config(root), python=bare_python)).stdout)
    assert doc["pci"]["nvidia_gpus"] == ["00000000:19:00.0", "00000000:3B:00.0"]
    assert doc["driver"]["loaded"] is True
    assert doc["driver"]["version"] == "570.86.15"


@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        ("", "printed no facts document"),
        ("Welcome to node17\n{broken", "no usable JSON"),
        ('{"schema_version": 99}', "schema_version 99"),
        ('{"schema_version": 3, "source": "nvml", "gpus": [{"index": "0"}]}', "gpus.0.index"),
    ],
)
def test_bad_probe_output_is_a_clear_error(stdout, message):
    with pytest.raises(ProbeError, match=message):
        parse_output(stdout)


def test_login_banner_before_the_document_is_ignored():
    doc = parse_output('motd line\n{"schema_version": 3, "source": "none", "gpus": []}\n')
    assert doc["gpus"] == []


def test_unreachable_ssh_host_is_reported_as_unreachable():
    if shutil.which("ssh") is None:
        pytest.skip("no ssh client")
    host = testinfra.get_host("ssh://127.0.0.1:1", ssh_extra_args="-o BatchMode=yes")
    with pytest.raises(ProbeError) as info:
        run_probe(host, probe_config(), timeout_s=20)
    assert info.value.unreachable
    assert "ssh failed" in str(info.value)


def test_missing_interpreter_on_the_node_is_not_unreachable():
    host = testinfra.get_host("local://")
    with pytest.raises(ProbeError) as info:
        run_probe(host, probe_config(), python="/nonexistent/python3", timeout_s=20)
    assert not info.value.unreachable
    assert "not found on the node" in str(info.value)


def test_probe_killed_by_its_timeout_on_the_node(tmp_path):
    slow = tmp_path / "slow-python"
    slow.write_text("#!/bin/sh\nsleep 600\n")
    slow.chmod(0o755)
    started = time.monotonic()
    with pytest.raises(ProbeError, match="killed after 2 s"):
        run_probe(testinfra.get_host("local://"), probe_config(), python=str(slow), timeout_s=2)
    assert time.monotonic() - started < 15


def test_local_probe_through_testinfra_returns_json():
    doc = run_probe(
        testinfra.get_host("local://"), probe_config(), python=sys.executable, timeout_s=60
    )
    assert json.loads(json.dumps(doc))["schema_version"] == SCHEMA_VERSION


def test_nvidia_smi_fallback_reads_nvlink_state(tmp_path, bare_python, fake_nvml_lib):
    """Without nvidia-ml-py the probe reads `-q -x` and `nvlink --status` from an nvidia-smi
    that queries the (fake) NVML, so a down link still fails the NVLink check."""
    scenario = load_scenario("healthy-h100x8")
    scenario.setdefault("gpu", {}).setdefault(2, {})["nvlink"] = {5: 0}
    conf = write_scenario(scenario, tmp_path / "scenario.conf")
    stand_in = Path(__file__).parent / "fakenvml" / "nvidia_smi.py"
    fake_tool(tmp_path / "bin", "nvidia-smi", f'exec {sys.executable} {stand_in} "$@"\n')
    env = {
        **nvml_env(fake_nvml_lib.parent, conf),
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
    }
    doc = parse_output(shell_probe(probe_call(probe_config(), python=bare_python), env).stdout)
    assert doc["source"] == "nvidia-smi"
    links = doc["gpus"][2]["nvlink"]
    assert len(links) == 18 and [link["link"] for link in links if not link["up"]] == [5]
    assert all(link["up"] for link in doc["gpus"][3]["nvlink"])
    result = judge("nvlink", doc, 2)
    assert result.status == "FAIL" and "17 of 18 NVLink links up (links down: 5)" in result.text
