"""The fleet of fleet.py, set up by the project's roles (site.yml) instead of the bed helper.

The nodes get their "hardware" from fleet.py (fake-NVML scenario, what the replaying tools
print, storage fixtures, n4 stopped) and nothing installed, except dgx-gpu3: its 560 driver is the
one a node got before the roles existed, installed by the bed helper. site.yml refuses
branches before 570 (its argument specs), so dgx-gpu3 keeps that driver with
`nvidia_driver_install: false` (the role only reports it) and gets everything else from the
roles; the health suite's driver check then fails dgx-gpu3, as in test_e2e.py.

What a real cluster has and the bed lacks, and the inventory vars that say so (bed_vars()):

- an OS archive: every node's apt source becomes a local `file:` repository holding only the
  Debian packages of the mirror (numactl, libnuma1), so NVIDIA's packages can only come
  from the repository the roles define from `gpu_mirror_url` (the bed's HTTP mirror);
- a kernel of its own (no headers to install: `nvidia_driver_kernel_headers: false`);
- NVIDIA's Debian package names: the stand-ins carry the Ubuntu repository's names
  (`nvidia_driver_package_scheme: branch`);
- a CUDA toolkit: the nccl-tests stand-in compiles with gcc (`nccl_tests_cuda_packages: []`);
- systemd: the roles install the units and say they cannot start them, so the test starts
  GPUd itself, with the unit's own ExecStart (start_gpud);
- `dcgmi discovery -l`: the dcgmi stand-in replays `diag` and `health` only
  (`dcgm_verify: false`);
- the EFA installer: efa_installer_tarball() is a stand-in that records its version and
  installs nothing, so dgx-gpu3 (`fabric: efa`) still has no EFA;
- a package index: the mirror's `files/wheels/` is a wheelhouse (gpuhealth built from this
  checkout, its dependencies downloaded once and cached) that the gpuhealth_agent role
  installs n1 and n2 from, as an air-gapped cluster would.

n1 and n2 also get the mirror's python3-nvidia-ml-py (`nvidia_driver_extra_packages`), as the
bed helper gives them: their probe reads NVML directly, dgx-gpu3's reads nvidia-smi.
"""

from __future__ import annotations

import dataclasses
import io
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import bedlib, fleet, mirror, standins
from .bedlib import Bed

REPO = Path(__file__).resolve().parent.parent.parent
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
EFA_VERSION = "1.47.0"  # roles/efa's default
OS_ARCHIVE = "/var/local/os-archive"
PLAY_RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)\s+"
    r"rescued=(?P<rescued>\d+)\s+ignored=(?P<ignored>\d+)",
    re.MULTILINE,
)
# Writes in a node's overlay that are not the node's state: Ansible's temp files, and logs
# (sshd's login records, apt's log of the installs it simulated).
NOT_STATE = ("root/.ansible/", "var/log/")
EFA_INSTALLER_SH = """#!/bin/sh
# gpuhealth test bed stand-in for AWS's efa_installer.sh {version}: it takes the real script's
# options (-y ...) and records the installed version where the real one does, and installs
# nothing else: the bed has no EFA device, so its node stays without EFA software.
set -e
mkdir -p /opt/amazon
cat > /opt/amazon/efa_installed_packages <<EOF
# EFA installer version: {version}
# Debug packages installed: no
# Packages installed:
EOF
echo "EFA installer {version} (gpuhealth test bed stand-in): nothing to install on this node"
"""


def fleet_roles() -> dict[str, fleet.Role]:
    """fleet.ROLES with nothing installed, but dgx-gpu3's old driver; nccl-tests where the role
    builds it (the health suite's default nccl_tests_dir)."""
    roles = {}
    for name, role in fleet.ROLES.items():
        packages = role.packages if name == "dgx-gpu3" else ()
        host_vars = {k: v for k, v in role.host_vars.items() if k != "nccl_tests_dir"}
        roles[name] = dataclasses.replace(
            role,
            packages=tuple(p for p in packages if p.startswith("nvidia-driver-")),
            tarballs=(),
            host_vars=host_vars,
        )
    return roles


def efa_installer_tarball(out_dir: Path) -> Path:
    """aws-efa-installer-<version>.tar.gz, laid out like AWS's (aws-efa-installer/...)."""
    path = out_dir / f"aws-efa-installer-{EFA_VERSION}.tar.gz"
    script = EFA_INSTALLER_SH.format(version=EFA_VERSION).encode()
    with tarfile.open(path, "w:gz") as tar:
        for name, data, mode in (
            ("aws-efa-installer", b"", 0o755),
            ("aws-efa-installer/efa_installer.sh", script, 0o755),
        ):
            info = tarfile.TarInfo(name)
            info.mtime, info.mode = 1_700_000_000, mode
            if not data:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def sha256(bed: Bed, name: str) -> str:
    """The checksum of a file of the mirror's files/, as its .sha256 says."""
    return (bed.mirror_dir / mirror.FILES_DIR / f"{name}.sha256").read_text().split()[0]


def bed_vars(bed: Bed) -> dict[str, dict[str, Any]]:
    """Inventory vars of the roles run, per node (BED_VARS of the module docstring)."""
    common = {
        "nvidia_driver_package_scheme": "branch",
        "nvidia_driver_kernel_headers": False,
        "nccl_tests_cuda_packages": [],
        "dcgm_verify": False,
        "nccl_tests_sha256": sha256(bed, f"nccl-tests-{standins.NCCL_TESTS_VERSION}.tar.gz"),
        "gpud_sha256": sha256(bed, fleet.GPUD_STEM + ".tgz"),
        "efa_installer_sha256": sha256(bed, f"aws-efa-installer-{EFA_VERSION}.tar.gz"),
    }
    # n1, n2, gb1 read NVML through nvidia-ml-py; dgx-gpu3 has none (nvidia-smi fallback).
    nvml = {"nvidia_driver_extra_packages": ["python3-nvidia-ml-py"]}
    # n1, n2 get gpuhealth itself (serve, Slurm's HealthCheckProgram), from the wheelhouse.
    # The jobs' memory-reclaim wait is 4 s, not 25: the epilog test waits for it.
    agent = {
        "gpuhealth_agent_installed": True,
        "gpuhealth_agent_slurm_healthcheck": True,
        "gpuhealth_agent_slurm_prolog": True,
        "gpuhealth_agent_slurm_epilog": True,
        "reclaim_wait_s": 4,
    }
    return {
        "n1": {**common, **nvml, **agent},
        "n2": {**common, **nvml, **agent},
        "dgx-gpu3": {**common, "nvidia_driver_install": False},
        "gb1": {**common, **nvml},  # its profile (gb200) brings IMEX with the driver
        "n4": common,
    }


def _os_archive(bed: Bed, nodes: list[str]) -> None:
    """Every node's apt source: a local repository of the Debian packages only, read."""
    with tempfile.TemporaryDirectory(prefix="gpuhealth-os-archive-") as tmp:
        repo = mirror.build_repo(Path(tmp) / "repo", mirror.default_debs(bedlib.CACHE_DIR))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(repo, arcname=".")
        command = (
            f"mkdir -p {OS_ARCHIVE} && tar -x -C {OS_ARCHIVE} && "
            f"echo 'deb [trusted=yes] file:{OS_ARCHIVE} ./' > /etc/apt/sources.list && "
            "apt-get update -qq"
        )
        for node in nodes:
            subprocess.run(
                ["ssh", "-F", str(bed.ssh_config), node, command],
                input=buffer.getvalue(),
                capture_output=True,
                check=True,
                timeout=120,
            )


def provision(bed: Bed) -> dict[str, float]:
    """The fleet's hardware, dgx-gpu3's old driver, an OS archive per node, the mirror's files and
    the roles' inventory vars; seconds per step."""
    roles = fleet_roles()
    timings = fleet.provision(bed, roles)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuhealth-efa-") as tmp:
        bed.publish_files([efa_installer_tarball(Path(tmp))])
    live = [name for name, role in roles.items() if role.scenario is not None]
    _os_archive(bed, live)
    bed.set_host_vars(bed_vars(bed))
    timings["OS archive per node, EFA stand-in, roles' vars"] = time.monotonic() - start
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuhealth-wheels-") as tmp:
        publish_wheels(bed, wheelhouse(Path(tmp)))
    timings["wheelhouse: gpuhealth built, dependencies (cached)"] = time.monotonic() - start
    return timings


def wheelhouse(out_dir: Path) -> list[Path]:
    """gpuhealth's wheel built from this checkout, and every dependency's wheel, as an
    air-gapped cluster's wheelhouse holds them (dependencies downloaded once, cached)."""
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    run = {"check": True, "capture_output": True, "text": True, "timeout": 600}
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(out_dir), str(REPO)], **run)
    (built,) = out_dir.glob("gpuhealth-*.whl")
    cache = bedlib.CACHE_DIR / "wheels" / "gpuhealth-deps"
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([*pip, "download", "--only-binary=:all:", "-d", str(cache), str(built)], **run)
    for stale in cache.glob("gpuhealth-*.whl"):  # pip copies the requirement itself too
        stale.unlink()
    return [built, *sorted(cache.glob("*.whl"))]


def publish_wheels(bed: Bed, wheels: list[Path]) -> None:
    """The wheelhouse at <mirror>/files/wheels/ (the gpuhealth_agent role's default with a
    mirror), listed by the mirror's HTTP server for pip's --find-links."""
    folder = bed.mirror_dir / mirror.FILES_DIR / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        shutil.copy2(wheel, folder / wheel.name)


@dataclass
class PlaybookRun:
    """One ansible-playbook run: exit status, output, and its PLAY RECAP per host."""

    rc: int
    output: str
    seconds: float

    @property
    def recap(self) -> dict[str, dict[str, int]]:
        return {
            m["host"]: {k: int(v) for k, v in m.groupdict().items() if k != "host"}
            for m in PLAY_RECAP.finditer(self.output)
        }

    def changed(self) -> dict[str, int]:
        return {host: counts["changed"] for host, counts in self.recap.items()}


def playbook(bed: Bed, path: str, *args: str, timeout: float = 900) -> PlaybookRun:
    """ansible-playbook from the repository root (its ansible.cfg) against the bed."""
    start = time.monotonic()
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(bed.inventory), path, *args],
        cwd=REPO,
        env={**bed.ansible_env(), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return PlaybookRun(proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)


def mirror_args(bed: Bed) -> list[str]:
    """The air-gapped form of the site.yml command: everything from the bed's mirror."""
    return ["-e", f"gpu_mirror_url={bed.mirror_url}", "-e", "gpu_mirror_trusted=true"]


def start_unit(bed: Bed, node: str, unit: str) -> str:
    """Start a service as systemd would: the ExecStart of the unit a role installed, detached
    (the bed has no service manager), logging to /var/log/<unit>.log. Its command line."""
    text = bed.ssh(node, f"cat /etc/systemd/system/{unit}.service").stdout
    command = next(
        line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ExecStart=")
    )
    # EnvironmentFile=: its variables, as systemd would set them for ExecStart's $VAR.
    sources = [
        line.split("=", 1)[1].lstrip("-")
        for line in text.splitlines()
        if line.startswith("EnvironmentFile=")
    ]
    env = "".join(f"set -a && . {path} && set +a && " for path in sources)
    bed.ssh(node, f"{env}setsid -f {command} > /var/log/{unit}.log 2>&1 < /dev/null")
    return command


def start_gpud(bed: Bed, node: str) -> str:
    """Start GPUd from its unit and wait until it answers /healthz. Its command line."""
    command = start_unit(bed, node, "gpud")
    address = re.search(r"--listen-address=(\S+)", command)
    url = f"https://{address[1] if address else '127.0.0.1:15132'}/healthz"
    probe = f"python3 -c {shlex.quote(_HEALTHZ.format(url=url))}"
    deadline = time.monotonic() + 20
    while bed.ssh(node, probe, check=False).returncode != 0:
        if time.monotonic() > deadline:
            log = bed.ssh(node, "cat /var/log/gpud.log", check=False).stdout
            raise bedlib.BedError(f"GPUd on {node} does not answer {url}:\n{log}")
        time.sleep(0.3)
    return command


_HEALTHZ = (
    "import ssl, urllib.request; c = ssl._create_unverified_context(); "
    "urllib.request.urlopen('{url}', context=c, timeout=2).read()"
)


def upper_state(bed: Bed, node: str) -> dict[str, tuple[int, int, int]]:
    """Every file the node has written since it started (its overlay upper dir): path ->
    (mode, size, mtime_ns); directories by their mode only (a temporary file that came and
    went changes its folder's mtime); NOT_STATE left out."""
    upper = Path(bed.node(node).upper)
    state = {}
    for path in upper.rglob("*"):
        rel = path.relative_to(upper).as_posix()
        if (rel + "/").startswith(NOT_STATE):
            continue
        st = path.lstat()
        state[rel] = (
            (st.st_mode, 0, 0) if path.is_dir() else (st.st_mode, st.st_size, st.st_mtime_ns)
        )
    return state
