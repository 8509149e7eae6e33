"""The bed as a small GPU fleet: which node plays which fault, and setting each node up for it.

Each node gets a fake-NVML scenario in /etc/fake-nvml/scenario.conf (its "hardware", read by
the fake libnvidia-ml.so.1 without any environment variable, as over SSH) and the stand-in
packages a real node of that kind would have installed, from the bed's mirror with Ansible's
apt module. Until the project's roles exist this is the install step; the inventory var
`testbed_packages` says what each node gets.

| node | scenario | installed | the suite must find |
|---|---|---|---|
| n1 | healthy-h100x8 | driver 570, nvidia-ml-py, numactl | nothing wrong |
| n2 | ecc-gpu3-recovery-gpu5 | driver 570, nvidia-ml-py, numactl | ECC gpu3, reset gpu5 |
| n3 | driver-560-missing-gpu7 | driver 560, numactl (no nvidia-ml-py) | r560, 7 GPUs |
| n4 | (none: sshd stopped) | - | unreachable |

n3 has no nvidia-ml-py, so its probe reads the stand-in `nvidia-smi -q -x` instead of NVML.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from selftest.fakenvml import DEFAULT_SCENARIO, scenario_text

from . import bedlib, standins
from .bedlib import Bed

ANSIBLE = str(Path(sys.executable).with_name("ansible"))
GPU_NODE_VARS = {"gpu_profile": "h100-sxm", "gpu_count": 8}
NVML_NODE = ("nvidia-driver-570-open", "python3-nvidia-ml-py", "numactl")

# Faults built by other work, set up here already but not asserted on yet (see test_e2e.py):
# - n2: a storage path that hangs (a FIFO nobody writes to; opening it blocks like a dead
#   NFS/Lustre server). The storage checks get it as `storage_paths` in n2's inventory vars.
STORAGE_HANG_FIFO = "/mnt/datasets/hang.fifo"
# - n3: the inventory expects EFA, and the node has none.
N3_FABRIC = {"fabric": "efa"}


@dataclass(frozen=True)
class Role:
    """What one node is: its scenario (None: the node is stopped), packages, inventory vars."""

    scenario: str | None
    packages: tuple[str, ...] = ()
    host_vars: dict[str, Any] = field(default_factory=dict)
    setup: str = ""  # shell run on the node after the packages are installed


ROLES = {
    "n1": Role("healthy-h100x8", NVML_NODE),
    "n2": Role(
        "ecc-gpu3-recovery-gpu5",
        NVML_NODE,
        setup=f"mkdir -p $(dirname {STORAGE_HANG_FIFO}) && mkfifo {STORAGE_HANG_FIFO}",
    ),
    "n3": Role(
        "driver-560-missing-gpu7",
        (standins.DRIVERS["560"].metapackage, "numactl"),
        host_vars=N3_FABRIC,
    ),
    "n4": Role(None),
}


def up(roles: dict[str, Role] = ROLES) -> Bed:
    """A bed with one node per role (n1..nN, in order)."""
    names = [f"n{i}" for i in range(1, len(roles) + 1)]
    if sorted(roles) != sorted(names):
        raise bedlib.BedError(f"roles must be named {', '.join(names)}")
    return bedlib.up(len(roles))


def provision(bed: Bed, roles: dict[str, Role] = ROLES) -> dict[str, float]:
    """Publish the stand-ins, give every node its role; seconds per step."""
    timings: dict[str, float] = {}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpuhealth-standins-") as tmp:
        bed.publish(standins.build_all(Path(tmp), bedlib.CACHE_DIR))
    timings["stand-in packages built and published"] = time.monotonic() - start

    start = time.monotonic()
    bed.set_host_vars(
        {
            name: {**GPU_NODE_VARS, **role.host_vars, "testbed_packages": list(role.packages)}
            for name, role in roles.items()
        }
    )
    live = [name for name, role in roles.items() if role.scenario is not None]
    for name in live:
        scenario = str(roles[name].scenario)
        header = f"# fake NVML scenario {scenario} (gpuhealth test bed)\n"
        bed.ssh(
            name,
            f"mkdir -p {Path(DEFAULT_SCENARIO).parent} && cat > {DEFAULT_SCENARIO}",
            input=header + scenario_text(scenario),
        )
    install_packages(bed, [n for n in live if roles[n].packages])
    for name in live:
        if roles[name].setup:
            bed.ssh(name, roles[name].setup)
    timings["packages installed (ansible apt)"] = time.monotonic() - start

    for name, role in roles.items():
        if role.scenario is None:
            bed.stop_node(name)
    return timings


def install_packages(bed: Bed, nodes: list[str]) -> dict[str, dict[str, Any]]:
    """`ansible NODES -m ansible.builtin.apt` of each node's testbed_packages; results by node."""
    with tempfile.TemporaryDirectory(prefix="gpuhealth-ansible-tree-") as tree:
        env = bed.ansible_env() | {
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
            "ANSIBLE_CALLBACKS_ENABLED": "ansible.builtin.tree",
            "ANSIBLE_CALLBACK_TREE_DIR": tree,
        }
        args = {"name": "{{ testbed_packages }}", "update_cache": True, "install_recommends": False}
        proc = subprocess.run(
            [ANSIBLE, ",".join(nodes), "-i", str(bed.inventory)]
            + ["-m", "ansible.builtin.apt", "-a", json.dumps(args)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        results = {p.name: json.loads(p.read_text()) for p in Path(tree).glob("*")}
    if proc.returncode != 0 or sorted(results) != sorted(nodes):
        raise bedlib.BedError(f"installing the stand-ins failed:\n{proc.stdout}{proc.stderr}")
    return results
