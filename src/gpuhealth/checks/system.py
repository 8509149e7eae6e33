"""System checks: the host around the GPUs (NUMA, numactl, resources, memlock, modules, services).

GPU-node requirements skip on a machine with nothing NVIDIA that expects no GPU, so a plain
`pytest` on a laptop judges only what applies to any host: CPUs, memory and disk space.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.checks import FAIL, PASS, SKIP, NodeView, Result, StopCheck, check, need

GIB = 1024**3
RDMA_FABRICS = ("infiniband", "efa")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' * (number != 1)}"


def _gpu_node(node: NodeView) -> dict[str, Any]:
    """The system section, or stop with SKIP where none of the GPU-node rules apply."""
    if node.no_nvidia and not node.expected_gpus:
        raise StopCheck(Result(SKIP, f"no NVIDIA GPU/driver on {node.host}"))
    return node.facts["system"]


def _gpu_labels(node: NodeView) -> list[tuple[str, str]]:
    """(label, bus id) of every GPU: the driver's records, else the PCI bus scan."""
    gpus = node.facts.get("gpus") or []
    if gpus:
        return [(f"gpu{g['index']}", g.get("pci_bus_id") or "") for g in gpus]
    pci = (node.facts.get("pci") or {}).get("nvidia_gpus") or []
    return [(bus, bus) for bus in pci]


# ---------------------------------------------------------------- NUMA


@check("numa_topology", "node", "system", "normal", section="system")
def numa_topology(node: NodeView) -> Result:
    """NUMA node count as expected; every GPU's NUMA node known and GPUs spread as expected."""
    system = _gpu_node(node)
    expected = node.limits["numa_nodes_expected"]
    nodes = system.get("numa_nodes")
    if nodes is None:
        why = (system.get("unavailable") or {}).get("numa_nodes") or {}
        if why.get("kind") != "not_supported":
            need(system, "numa_nodes", "NUMA nodes (/sys/devices/system/node)")
        nodes = [{"node": 0, "cpu_count": system.get("cpus_online") or 1}]
    bios = "check the BIOS NUMA settings (node interleaving off, SNC/NPS as planned)"
    if expected is not None and len(nodes) != expected:
        return Result(
            FAIL,
            f"{_count(len(nodes), 'NUMA node')}, expected {expected}",
            f"{bios}; if the inventory is wrong, set numa_nodes_expected",
        )
    affinity = need(system, "gpu_numa_nodes", "GPU NUMA nodes (/sys/bus/pci/devices)")
    gpus = _gpu_labels(node)
    if not gpus:
        return Result(SKIP, f"{_count(len(nodes), 'NUMA node')}; no GPU to place (see gpu_count)")
    placed: dict[int, list[str]] = {}
    unknown = []
    for label, bus in gpus:
        where = affinity.get(bus)
        if where is None or where < 0:
            if len(nodes) > 1:
                unknown.append(f"{label} (bus {bus}: numa_node {where})")
                continue
            where = nodes[0]["node"]
        placed.setdefault(where, []).append(label)
    if unknown:
        return Result(
            FAIL,
            f"NUMA affinity unknown on a {len(nodes)}-node host for {', '.join(unknown)}",
            f"{bios}; update the BIOS if its ACPI tables give the GPUs no proximity domain",
        )
    layout = "; ".join(f"node{n}: {', '.join(placed[n])}" for n in sorted(placed))
    if node.limits["gpus_even_over_numa_nodes"]:
        cpu_nodes = [n["node"] for n in nodes if n.get("cpu_count")]
        share, rest = divmod(len(gpus), len(cpu_nodes) or 1)
        uneven = rest or any(len(placed.get(n, [])) != share for n in cpu_nodes)
        uneven = uneven or any(n not in cpu_nodes for n in placed)
        if uneven:
            counts = ", ".join(f"node{n}: {len(placed.get(n, []))}" for n in cpu_nodes)
            want = f"expected {share} each" if not rest else f"{len(gpus)} GPUs do not divide"
            return Result(
                FAIL,
                f"GPUs not split evenly over the {len(cpu_nodes)} NUMA nodes with CPUs "
                f"({counts}; {want}): {layout}",
                f"{bios}; check that every GPU's riser/PCIe switch is on the planned socket",
            )
    count = _count(len(nodes), "NUMA node") + (" as expected" if expected is not None else "")
    return Result(PASS, f"{count}; GPUs by node: {layout}")


@check("numactl", "node", "system", "normal", section="system")
def numactl(node: NodeView) -> Result:
    """numactl is installed and `numactl --hardware` runs and parses."""
    system = _gpu_node(node)
    record = system.get("numactl") or {}
    install = "apt-get install numactl (site.yml, role numactl)"
    if not record.get("available"):
        return Result(FAIL, f"numactl not installed ({record.get('error')})", install)
    if record.get("error") or not record.get("hardware"):
        return Result(
            FAIL,
            f"numactl --hardware failed: {record.get('error') or 'no output'}",
            "run `numactl --hardware` on the node; reinstall numactl (role numactl) and check "
            "that the kernel has NUMA support",
        )
    hardware = record["hardware"]
    nodes = ", ".join(f"node{n['node']} {n['cpu_count']} CPUs" for n in hardware["nodes"])
    count = _count(hardware["available_nodes"], "node")
    return Result(PASS, f"numactl --hardware: {count} ({nodes})")


# ---------------------------------------------------------------- resources


def _gib(value_bytes: float) -> str:
    return f"{value_bytes / GIB:.1f} GiB"


def _disk_problem(disks: dict[str, dict[str, Any]], path: str, minimum: float) -> str | None:
    record = disks.get(path)
    if record is None:
        return f"{path}: no free-space record (the probe was not asked for it)"
    free = record.get("free_bytes")
    if free is None:
        why = (record.get("unavailable") or {}).get("free_bytes") or {}
        return f"{path}: free space unknown ({why.get('detail', 'no value')})"
    if free < minimum * GIB:
        return f"{path}: {_gib(free)} free < {minimum:g} GiB"
    return None


@check("host_resources", "node", "system", section="system")
def host_resources(node: NodeView) -> Result:
    """CPUs, memory (total and available) and free space on / and scratch above the limits."""
    system = node.facts["system"]
    limits = node.limits
    problems: list[str] = []
    actions: list[str] = []
    online, usable = system.get("cpus_online"), system.get("cpus_usable")
    if limits["min_cpus"] is not None:
        if online is None:
            problems.append("online CPU count unknown")
        elif online < limits["min_cpus"]:
            problems.append(f"{online} CPUs online < {limits['min_cpus']}")
            actions.append("check the BIOS (cores/SMT disabled?) and `lscpu` for offline CPUs")
    total, available = system.get("memory_total_kb"), system.get("memory_available_kb")
    if limits["min_memory_gb"] is not None:
        if total is None:
            problems.append("MemTotal unknown")
        elif total * 1024 < limits["min_memory_gb"] * GIB:
            problems.append(f"memory {_gib(total * 1024)} < {limits['min_memory_gb']:g} GiB")
            actions.append("check for failed DIMMs (`dmidecode -t memory`, BMC SEL, EDAC)")
    pct = limits["min_memory_available_pct"]
    if pct is not None:
        if total is None or available is None:
            problems.append("MemAvailable unknown")
        elif available * 100 < pct * total:
            problems.append(f"memory available {available * 100 / total:.0f}% < {pct:g}%")
            actions.append("find what holds memory (`ps aux --sort=-rss`, hugepages, tmpfs)")
    disks = {d["path"]: d for d in system.get("disks") or []}
    wanted = []
    if limits["min_root_free_gb"] is not None:
        wanted.append(("/", limits["min_root_free_gb"]))
    if limits["min_scratch_free_gb"] is not None:
        wanted += [(p, limits["min_scratch_free_gb"]) for p in limits["scratch_paths"] or []]
    disk_problems = [p for p in (_disk_problem(disks, path, m) for path, m in wanted) if p]
    if disk_problems:
        problems += disk_problems
        actions.append("free space (old containers, logs, core dumps) or check the scratch mount")
    if problems:
        return Result(FAIL, "; ".join(problems), "; ".join(actions) or "re-run the probe")
    cpus = f"{online} CPUs" + (f" ({usable} usable by the probe)" if usable != online else "")
    memory = f"memory {_gib((total or 0) * 1024)}"
    if total and available is not None:
        memory += f" ({available * 100 / total:.0f}% available)"
    free = ", ".join(
        f"{d['path']} {_gib(d['free_bytes'])} free"
        for d in disks.values()
        if d.get("free_bytes") is not None
    )
    return Result(PASS, f"{cpus}, {memory}, {free}")


# ---------------------------------------------------------------- memlock


@check("memlock_limit", "node", "system", section="system")
def memlock_limit(node: NodeView) -> Result:
    """The memlock limit (`ulimit -l`) is unlimited, or at least the profile's, for RDMA."""
    system = _gpu_node(node)
    limit = need(system, "memlock_kb", "memlock limit")
    soft, hard = limit.get("soft"), limit.get("hard")
    fabric = node.limits["fabric"]
    minimum = node.limits["min_memlock_kb"]
    shown = soft if soft == "unlimited" else f"{soft} KB"
    if hard != soft:
        shown += f" (hard limit {hard if hard == 'unlimited' else f'{hard} KB'})"
    if minimum is None and fabric not in RDMA_FABRICS:
        return Result(SKIP, f"memlock {shown}; no minimum (fabric {fabric}, min_memlock_kb null)")
    action = (
        "set `* - memlock unlimited` in /etc/security/limits.d/ (ssh logins), "
        "DefaultLimitMEMLOCK=infinity for services such as slurmd (systemd system.conf or a "
        "drop-in), and PropagateResourceLimitsExcept=MEMLOCK in slurm.conf so jobs keep "
        "slurmd's limit; then log in again and re-run"
    )
    if minimum is None:
        if soft == "unlimited":
            return Result(PASS, f"memlock unlimited (fabric {fabric})")
        return Result(FAIL, f"memlock limit {shown}, RDMA over {fabric} needs unlimited", action)
    if soft == "unlimited" or soft >= minimum:
        return Result(PASS, f"memlock {shown} >= {minimum} KB")
    return Result(FAIL, f"memlock limit {shown} < {minimum} KB", action)


# ---------------------------------------------------------------- kernel modules


@check("kernel_modules", "node", "system", section="system")
def kernel_modules(node: NodeView) -> Result:
    """nvidia and nvidia_uvm loaded; nvidia_peermem for GPUDirect RDMA; efa on EFA hosts."""
    system = _gpu_node(node)
    # No /proc/modules: a kernel without loadable modules, or a sandbox (gVisor) that hides
    # the host's; the modules cannot be judged from here, which is a skip, not a pass.
    loaded = set(need(system, "kernel_modules", "loaded kernel modules"))
    fabric = node.limits["fabric"]
    peermem = node.limits["require_nvidia_peermem"]
    if peermem is None:
        peermem = fabric in RDMA_FABRICS
    wanted = {
        "nvidia": "the driver (role nvidia_driver)",
        "nvidia_uvm": "CUDA unified memory (`nvidia-modprobe -u -c=0`)",
    }
    if peermem:
        wanted["nvidia_peermem"] = f"GPUDirect RDMA over {fabric}"
    if fabric == "efa":
        wanted["efa"] = "the EFA driver (aws-efa-installer, role efa)"
    missing = [name for name in wanted if name not in loaded]
    if missing:
        detail = ", ".join(f"{name} ({wanted[name]})" for name in missing)
        return Result(
            FAIL,
            f"kernel modules not loaded: {detail}",
            f"modprobe {' '.join(missing)} and list them in /etc/modules-load.d/ so they load at "
            "boot; check `dmesg` if modprobe fails (module built for another kernel?)",
        )
    return Result(PASS, f"loaded: {', '.join(wanted)}")


# ---------------------------------------------------------------- services


@check("gpu_services", "node", "system", section="system")
def gpu_services(node: NodeView) -> Result:
    """nvidia-persistenced, fabric manager (NVSwitch), DCGM and GPUd active where expected."""
    system = _gpu_node(node)
    limits = node.limits
    wanted = {
        "nvidia-persistenced": limits["require_persistence_mode"],
        "nvidia-fabricmanager": limits["requires_fabric_manager"],
        "nvidia-dcgm": limits["dcgm_installed"],
        "gpud": limits["gpud_installed"],
    }
    units = [unit for unit, required in wanted.items() if required]
    if not units:
        return Result(SKIP, "no service required by the profile or inventory")
    states = system.get("services")
    if states is None:
        why = (system.get("unavailable") or {}).get("services") or {}
        if why.get("kind") in ("not_supported", "absent"):
            need(system, "services", "service states (systemctl)")
        return Result(
            FAIL,
            f"could not read service states: {why.get('detail', 'no value')}",
            "check that systemd answers (`systemctl is-system-running`, dbus); reboot if it hangs",
        )
    bad = [f"{u} is {states.get(u) or 'not recorded'}" for u in units if states.get(u) != "active"]
    if bad:
        names = " ".join(u for u in units if states.get(u) != "active")
        return Result(
            FAIL,
            f"{'; '.join(bad)} (expected active)",
            f"systemctl enable --now {names}; read `journalctl -u <unit>` (fabric manager must "
            "match the driver version exactly; roles nvidia_driver, dcgm, gpud)",
        )
    return Result(PASS, f"active: {', '.join(units)}")
