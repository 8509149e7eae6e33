"""Self-tests of the test bed: real SSH, isolation, Ansible, testinfra, and clean teardown.

Run as root: ``.venv/bin/pytest selftest/testbed -q -s``. With xdist use ``--dist loadfile``
(``--dist loadgroup`` did not group tests in xdist 3.8): one bed per machine.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import bedlib

pytestmark = [
    pytest.mark.bed,
    pytest.mark.xdist_group("bed"),  # one bed per machine: keep these tests on one worker
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the test bed needs root (network namespaces, mounts, bridge)"
    ),
]

NODES = ("n1", "n2", "n3")
TIMINGS: dict[str, float] = {}
ANSIBLE = str(Path(sys.executable).with_name("ansible"))


@pytest.fixture(scope="module")
def bed():
    bedlib.become_subreaper()  # reap detached bed processes even if PID 1 does not
    start = time.monotonic()
    bedlib.ensure_rootfs()
    TIMINGS["rootfs (cached or built now)"] = time.monotonic() - start
    with bedlib.exclusive():
        try:
            start = time.monotonic()
            the_bed = bedlib.up(len(NODES))
            TIMINGS["up, 3 nodes"] = time.monotonic() - start
            yield the_bed
        finally:
            start = time.monotonic()
            bedlib.down()
            TIMINGS["down (final, idempotent)"] = time.monotonic() - start
            cold = bedlib.rootfs_build_seconds()
            print("\n-- test bed timings --")
            print(f"  {'rootfs cold build (recorded when built)':42} {cold or float('nan'):7.2f}s")
            for what, secs in TIMINGS.items():
                print(f"  {what:42} {secs:7.2f}s")


def ansible(bed, tmp_path: Path, *args: str) -> dict[str, dict]:
    """Run an ad-hoc ansible command on all nodes; per-host results via the tree callback."""
    tree = tmp_path / f"tree-{time.monotonic_ns()}"
    env = bed.ansible_env() | {
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree",
        "ANSIBLE_CALLBACK_TREE_DIR": str(tree),
    }
    proc = subprocess.run(
        [ANSIBLE, "all", "-i", str(bed.inventory), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    results = {p.name: json.loads(p.read_text()) for p in tree.glob("*")} if tree.is_dir() else {}
    assert proc.returncode == 0 and set(results) == set(NODES), proc.stdout + proc.stderr
    return results


def test_each_node_answers_ssh_with_its_own_hostname(bed):
    for name in NODES:
        out = subprocess.run(
            ["ssh", "-F", str(bed.ssh_config), name, "hostname"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == name


def test_nodes_cannot_see_each_others_processes(bed):
    bed.ssh("n2", "nohup sleep 4242 >/dev/null 2>&1 &")
    assert "sleep 4242" in bed.ssh("n2", "ps -eo args").stdout
    n1_procs = bed.ssh("n1", "ps -eo args").stdout
    assert "sleep 4242" not in n1_procs
    assert len(n1_procs.splitlines()) < 10, n1_procs  # only its own sshd and our session
    assert bed.ssh("n1", "ps -o comm= -p 1").stdout.strip() == "sshd"


def test_writes_stay_in_the_nodes_own_root(bed):
    bed.ssh("n1", "echo n1-was-here > /root/marker && echo x > /etc/marker")
    assert bed.ssh("n2", "test -e /root/marker || test -e /etc/marker", check=False).returncode
    assert not (bed.rootfs / "root/marker").exists()
    assert not (bed.rootfs / "etc/marker").exists()
    n1 = next(n for n in bed.nodes if n.name == "n1")
    assert (Path(n1.upper) / "root/marker").read_text() == "n1-was-here\n"


def test_ansible_ping_all_nodes(bed, tmp_path):
    results = ansible(bed, tmp_path, "-m", "ansible.builtin.ping")
    assert all(r.get("ping") == "pong" for r in results.values()), results


def test_ansible_installs_numactl_from_mirror_idempotently(bed, tmp_path):
    apt = ("-m", "ansible.builtin.apt", "-a", "name=numactl update_cache=yes")
    first = ansible(bed, tmp_path, *apt)
    assert all(r["changed"] for r in first.values()), first
    assert "policy:" in bed.ssh("n3", "numactl --show").stdout
    second = ansible(bed, tmp_path, *apt)
    assert not any(r["changed"] for r in second.values()), second
    log = (bed.run_dir / "mirror.log").read_text()  # the .deb really came over HTTP
    assert re.search(r'"GET /(\./)?numactl_\S+\.deb HTTP/1\.1" 200', log), log


def test_testinfra_over_the_bed_ssh_config(bed):
    import testinfra

    host = testinfra.get_host("ssh://n1", ssh_config=str(bed.ssh_config))
    assert host.check_output("hostname") == "n1"
    assert host.file("/srv/gpuhealth-mirror/Packages").exists  # mirror also usable as file:


def test_up_recovers_after_a_crash(bed):
    n2 = next(n for n in bed.nodes if n.name == "n2")
    unshare = [p for p in n2.pids if Path(f"/proc/{p}/comm").read_text().strip() == "unshare"]
    os.kill(unshare[0], signal.SIGKILL)  # crash: node dies, nothing is cleaned up
    (bed.run_dir / "state.json").unlink()  # ... and the state is lost too
    assert bedlib._wait(lambda: not bedlib._port_open(n2.address, 22), timeout=5)
    start = time.monotonic()
    again = bedlib.up(len(NODES))
    TIMINGS["up after crash (incl. cleanup)"] = time.monotonic() - start
    for name in NODES:
        assert again.ssh(name, "hostname").stdout.strip() == name
    assert again.ssh("n1", "test ! -e /root/marker", check=False).returncode == 0  # fresh roots


def test_down_leaves_nothing_behind(bed):
    bed.ssh("n1", "true")  # make sure a control master is running
    start = time.monotonic()
    bedlib.down()
    TIMINGS["down, 3 nodes"] = time.monotonic() - start
    assert bedlib.leftovers() == []
    run_dir = str(bed.run_dir)
    assert not [m for m in Path("/proc/mounts").read_text().splitlines() if run_dir in m]
    assert (
        bedlib.NETNS_PREFIX
        not in subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, check=True
        ).stdout
    )
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert bedlib.BRIDGE not in links and bedlib.VETH_PREFIX not in links
    ps = subprocess.run(
        ["ps", "-eo", "pid=,ppid=,stat=,comm=,args="], capture_output=True, text=True, check=True
    ).stdout
    ours = [line for line in ps.splitlines() if run_dir in line or bedlib.NETNS_PREFIX in line]
    assert not ours, ours
    zombies = [
        ln for ln in ps.splitlines() if ln.split()[1] == str(os.getpid()) and "Z" in ln.split()[2]
    ]
    assert not zombies, zombies  # everything we adopted was reaped
    assert not bed.run_dir.exists() and shutil.which("ip")
