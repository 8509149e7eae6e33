"""A real Slurm cluster on the bed: Debian's slurm-wlm and munge, as an admin would run them.

slurmctld and a munged run on the controller side, on the bed's bridge address; each live node
runs its own munged and slurmd (both are in the node image). One slurm.conf, written here: at
`/run/gpuhealth-slurm/slurm.conf` for the controller's commands (SLURM_CONF) and at the default
/etc/slurm/slurm.conf in every node, where a HealthCheckProgram's `scontrol` finds it. The
Slurm names need not be the inventory's: dgx-gpu3 is Slurm node n3 (NodeHostname=dgx-gpu3).
Non-default ports (16817/16818), so a machine's own Slurm is never touched.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import bedlib

SLURM_DIR = "/run/gpuhealth-slurm"  # on each side: munge/ (munge's), ctld/ (slurmctld's)
MUNGE_DIR = f"{SLURM_DIR}/munge"
CTLD_DIR = f"{SLURM_DIR}/ctld"
MUNGE_SOCKET = f"{MUNGE_DIR}/munge.socket"
NODE_CONF = "/etc/slurm/slurm.conf"


@dataclass
class Slurm:
    """The running cluster: its config, the controller's environment, each node's name."""

    directory: Path
    names: dict[str, str]  # inventory name -> Slurm node name
    base: str
    live: list[str]  # the inventory names that run slurmd

    @property
    def conf(self) -> Path:
        return self.directory / "slurm.conf"

    def env(self) -> dict[str, str]:
        """The environment for Slurm commands on the controller side (gpuhealth act slurm)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        done = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise bedlib.BedError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done.stdout

    def nodes(self) -> dict[str, tuple[str, str]]:
        """Slurm node name -> (long state, reason) as sinfo says."""
        found = {}
        for line in self.run("sinfo", "-h", "-N", "-o", "%N|%T|%E").splitlines():
            name, state, reason = line.split("|", 2)
            found[name] = (state, "" if reason == "none" else reason)
        return found

    def wait_for(self, node: str, test, timeout_s: float = 60) -> tuple[str, str]:
        """Poll sinfo until test((state, reason)) holds for `node`; its last answer."""
        deadline = time.monotonic() + timeout_s
        while True:
            seen = self.nodes().get(node, ("absent", ""))
            if test(seen) or time.monotonic() > deadline:
                return seen
            time.sleep(0.5)

    def configure(self, bed: bedlib.Bed, extra: str = "") -> None:
        """(Re)write slurm.conf on both sides with `extra` lines and make Slurm re-read it."""
        text = self.base + extra
        self.conf.write_text(text)
        for node in self.live:
            bed.ssh(node, f"cat > {NODE_CONF}", input=text)
        self.run("scontrol", "reconfigure")


def slurm_conf(names: dict[str, str], addresses: dict[str, str], controller: str) -> str:
    """A minimal slurm.conf: no cgroups (the nodes have no systemd), one partition."""
    short = socket.gethostname().split(".")[0]
    lines = [
        "ClusterName=gpuhealthbed",
        f"SlurmctldHost={short}({controller})",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={MUNGE_SOCKET}",
        "SlurmUser=slurm",
        "SlurmctldPort=16817",
        "SlurmdPort=16818",
        f"StateSaveLocation={CTLD_DIR}/state",
        "SlurmdSpoolDir=/var/spool/slurmd",
        f"SlurmctldPidFile={CTLD_DIR}/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        f"SlurmctldLogFile={CTLD_DIR}/slurmctld.log",
        "SlurmdLogFile=/var/log/slurmd.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "SchedulerType=sched/builtin",
        "SelectType=select/linear",
        "MpiDefault=none",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        "SlurmdTimeout=30",
    ]
    for host, name in names.items():
        alias = "" if name == host else f" NodeHostname={host}"
        lines.append(f"NodeName={name}{alias} NodeAddr={addresses[host]} CPUs=1 State=UNKNOWN")
    lines.append("PartitionName=gpu Nodes=ALL Default=YES State=UP")
    return "\n".join(lines) + "\n"


def _munged() -> str:
    """Shell that starts munged (as munge) with the key in MUNGE_DIR, read from stdin."""
    return (
        f"mkdir -p {MUNGE_DIR} && chown munge:munge {MUNGE_DIR} && chmod 755 {MUNGE_DIR}"
        f" && base64 -d > {MUNGE_DIR}/munge.key && chown munge:munge {MUNGE_DIR}/munge.key"
        f" && chmod 400 {MUNGE_DIR}/munge.key && runuser -u munge -- munged"
        f" --socket={MUNGE_SOCKET} --key-file={MUNGE_DIR}/munge.key"
        f" --pid-file={MUNGE_DIR}/munged.pid --log-file={MUNGE_DIR}/munged.log"
        f" --seed-file={MUNGE_DIR}/munged.seed"
    )


def cgroup_mounts() -> str:
    """Shell that gives a node the host's cgroup mounts (the nodes' sysfs has none; slurmd
    initialises its cgroup plugin even with proctrack/linuxproc), whatever the host's
    layout: v1 controllers, hybrid, or v2 only."""
    steps = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            source, point, kind, options = line.split()[:4]
            if point.startswith("/sys/fs/cgroup"):
                steps.append(f"mkdir -p {point} && mount -t {kind} -o {options} {source} {point}")
    return "mountpoint -q /sys/fs/cgroup || { " + " && ".join(steps or ["true"]) + "; }"


def _stop(pid_file: Path, within_s: float = 15) -> None:
    """SIGTERM a daemon and wait until it has exited, so the bed's teardown reaps it (it is
    our adopted child: we are the subreaper) instead of leaving a zombie behind."""
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state in "ZX":
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            return
        time.sleep(0.1)


@contextmanager
def cluster(bed: bedlib.Bed, names: dict[str, str], live: list[str]) -> Iterator[Slurm]:
    """Slurm over the bed's nodes (`names`: inventory name -> Slurm name; slurmd runs on the
    `live` ones), torn down after."""
    addresses = {n.name: n.address for n in bed.nodes}
    slurm = Slurm(Path(SLURM_DIR), names, slurm_conf(names, addresses, f"{bedlib.NET}.1"), live)
    slurm.directory.mkdir(parents=True, exist_ok=True)
    key = base64.b64encode(os.urandom(1024)).decode()
    subprocess.run(_munged(), shell=True, check=True, input=key, text=True)
    state = Path(CTLD_DIR) / "state"
    state.mkdir(parents=True, exist_ok=True)
    for path in (state.parent, state):
        shutil.chown(path, "slurm", "slurm")
    slurm.conf.write_text(slurm.base)
    try:
        subprocess.run(["slurmctld", "-f", str(slurm.conf)], check=True)
        for node in live:
            bed.ssh(node, _munged(), input=key)
            bed.ssh(
                node,
                f"{cgroup_mounts()} && mkdir -p /etc/slurm /var/spool/slurmd"
                f" && cat > {NODE_CONF} && slurmd",
                input=slurm.base,
            )
        for node in live:
            slurm.wait_for(names[node], lambda seen: seen[0] == "idle", 30)
        yield slurm
    finally:
        _stop(Path(CTLD_DIR) / "slurmctld.pid")
        _stop(Path(MUNGE_DIR) / "munged.pid")
        shutil.rmtree(SLURM_DIR, ignore_errors=True)
