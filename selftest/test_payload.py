"""The probe's payload travels on standard input, so the command line stays small whatever the
probe weighs: Linux caps one argument at 128 KiB (MAX_ARG_STRLEN), and both the controller's
`/bin/sh -c` (testinfra runs ssh through a shell) and the node's sshd (`sh -c COMMAND`) pass the
whole command as one argument. Here a payload several times that limit runs end to end through
each path that ships the probe."""

from __future__ import annotations

import base64
import json
import os
import random
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import testinfra
from testinfra.backend.base import BaseBackend

from gpuhealth.facts import SCHEMA_VERSION
from gpuhealth.local import run_local_probe
from gpuhealth.transport import ProbeError, node_profile_keys, probe_call, run_probe
from selftest.facts import probe_config
from selftest.suite import fake_tool

MAX_ARG_STRLEN = 128 * 1024
COMMAND_BOUND = 4096


def heavy_config() -> dict[str, Any]:
    """The probe's config with 600 KB of incompressible ballast (a key the probe ignores), so
    the payload is over four times the argument limit."""
    ballast = base64.b64encode(random.Random(24).randbytes(450_000)).decode()
    return {**probe_config(), "ballast": ballast}


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `ssh` on PATH that does what sshd does with the command, its last argument: hands it
    to `sh -c` on the "node", stdin passed through; it logs each argument's length."""
    log = tmp_path / "ssh-args"
    fake_tool(
        tmp_path / "bin",
        "ssh",
        f'for arg; do printf "%s\\n" "${{#arg}}" >> {log}; last=$arg; done\n'
        'exec /bin/sh -c "$last"\n',
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    return log


def test_the_command_line_stays_small_whatever_the_payload():
    light = probe_call(probe_config())
    heavy = probe_call(heavy_config())
    assert len(heavy.stdin) > 4 * MAX_ARG_STRLEN
    assert heavy.command == light.command  # the payload is not in it at all
    assert len(heavy.command.encode()) < COMMAND_BOUND
    # and as testinfra hands it to the controller's shell, ssh and its options around it
    ssh = testinfra.get_host("ssh://node1", ssh_extra_args="-o BatchMode=yes").backend
    cmd, args = ssh._build_ssh_command(ssh.get_command(heavy.command))
    assert len(ssh.quote(" ".join(cmd), *args).encode()) < COMMAND_BOUND


@pytest.fixture
def ansible_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """testinfra's ansible:// runs `ansible-inventory`, which the venv holds: on PATH when it
    is activated, not under `make test`."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")


def test_a_heavy_payload_runs_through_testinfra_locally(bare_python):
    doc = run_probe(
        testinfra.get_host("local://"), heavy_config(), python=bare_python, timeout_s=60
    )
    assert doc["schema_version"] == SCHEMA_VERSION and doc["host"]["hostname"]


def test_a_heavy_payload_runs_through_testinfras_ssh(bare_python, fake_ssh):
    host = testinfra.get_host("ssh://node1", ssh_extra_args="-o BatchMode=yes")
    doc = run_probe(host, heavy_config(), python=bare_python, timeout_s=60)
    assert doc["schema_version"] == SCHEMA_VERSION
    lengths = [int(n) for n in fake_ssh.read_text().split()]
    assert max(lengths) < COMMAND_BOUND


def test_a_heavy_payload_runs_through_an_ansible_host(
    bare_python, fake_ssh, ansible_tools, tmp_path
):
    """ansible:// resolves to the ssh connection its inventory describes, sudo included."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n    node1:\n      ansible_host: 10.0.0.1\n      ansible_user: ops\n"
    )
    (host,) = testinfra.get_hosts([f"ansible://node1?ansible_inventory={inventory}"])
    doc = run_probe(host, heavy_config(), python=bare_python, timeout_s=60)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert max(int(n) for n in fake_ssh.read_text().split()) < COMMAND_BOUND


def test_a_heavy_payload_runs_through_node_check(bare_python):
    doc = run_local_probe(heavy_config(), bare_python, 60)
    assert doc["schema_version"] == SCHEMA_VERSION


class _Channel:
    """What the paramiko path uses of a paramiko channel, over a local `/bin/sh -c`."""

    def __init__(self) -> None:
        self.pty = False
        self.proc: subprocess.Popen[bytes] | None = None

    def get_pty(self) -> None:
        self.pty = True

    def exec_command(self, command: bytes) -> None:
        self.proc = subprocess.Popen(
            ["/bin/sh", "-c", command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    def sendall(self, data: bytes) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(data)

    def shutdown_write(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()

    def makefile(self, mode: str) -> Any:
        assert self.proc is not None
        return self.proc.stdout

    def makefile_stderr(self, mode: str) -> Any:
        assert self.proc is not None
        return self.proc.stderr

    def recv_exit_status(self) -> int:
        assert self.proc is not None
        return self.proc.wait()


def test_a_heavy_payload_goes_down_a_paramiko_channel_without_a_terminal(bare_python):
    """paramiko is not installed here: a backend of testinfra's paramiko kind gets a client
    whose channel runs the command locally. The probe must come back whole, with no pty asked
    for (a terminal would echo the payload and cut it into lines of 4 KiB)."""
    channel = _Channel()

    class Transport:
        def open_session(self) -> _Channel:
            return channel

    class Client:
        def get_transport(self) -> Transport:
            return Transport()

    class ParamikoKind(BaseBackend):
        NAME = "paramiko"
        client = Client()

    host = testinfra.host.Host(ParamikoKind("node1"))
    doc = run_probe(host, heavy_config(), python=bare_python, timeout_s=60)
    assert doc["schema_version"] == SCHEMA_VERSION
    assert not channel.pty


def test_a_connection_that_cannot_carry_stdin_is_a_clear_error():
    """docker exec without -i gives the command no stdin: refused, never run without it."""
    host = testinfra.get_host("docker://some-container")
    with pytest.raises(ProbeError, match="'docker' connection") as info:
        run_probe(host, probe_config(), timeout_s=10)
    assert not info.value.unreachable


def test_force_ansible_is_named_as_what_keeps_the_payload_off_stdin(ansible_tools, tmp_path):
    """pytest --force-ansible runs commands through ansible's shell module: the error said to
    use ansible:// with an ssh connection, which the host already was."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    node1:\n      ansible_host: 10.0.0.1\n")
    (host,) = testinfra.get_hosts(
        ["ansible://node1"], ansible_inventory=str(inventory), force_ansible=True
    )
    with pytest.raises(ProbeError, match="'ansible' connection: drop --force-ansible$"):
        run_probe(host, probe_config(), timeout_s=10)


def test_only_the_profile_keys_the_node_declares_travel():
    """The checks' limits stay on the controller: the node gets the keys its families' schema.py
    declare (PROFILE_KEYS), which it enforces when a family reads one."""
    config = probe_config()
    shipped = json.loads(zlib.decompress(base64.b64decode(probe_call(config).stdin)))["config"]
    assert set(shipped["expect"]) == set(config["expect"]) & node_profile_keys()
    assert "reclaim_wait_s" in shipped["expect"]  # the reclaim family reads it
    assert "dcgm_diag_timeout_s" in config["expect"]  # a limit of the checks (and launches)
    assert "dcgm_diag_timeout_s" not in shipped["expect"]


@pytest.mark.parametrize("cut", [0, 1000], ids=["stdin-closed", "payload-cut-short"])
def test_a_node_that_gets_no_whole_payload_is_a_clear_error(bare_python, monkeypatch, cut):
    """A node whose stdin is closed (a wrapper that drops it) or that reads the payload cut
    short: that node's error says so, not a decompression traceback."""
    call = probe_call(probe_config(), bare_python, 30)
    cut_call = call._replace(stdin=call.stdin[:cut] + "\n" if cut else "")
    monkeypatch.setattr("gpuhealth.transport.probe_call", lambda *args: cut_call)
    with pytest.raises(ProbeError, match="payload on stdin is missing or cut short") as info:
        run_probe(testinfra.get_host("local://"), probe_config(), bare_python, 30)
    assert not info.value.unreachable and "Traceback" not in str(info.value)
