"""System checks: the host around the GPUs (NUMA, numactl, resources, memlock, modules, services).

GPU-node requirements skip on a machine with nothing NVIDIA that expects no GPU, so a plain
`pytest` on a laptop judges only what applies to any host: CPUs, memory and disk space.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.checks import CheckSet, NodeView, detail, need, section
from gpuhealth.facts import reason
from gpuhealth.families.gpu.checks import require_nvidia
from gpuhealth.families.gpu.limits import GpuLimits
from gpuhealth.families.system.limits import SystemLimits
from gpuhealth.limits import SharedLimits
from gpuhealth.results import Action, Result, failed, passed, skipped

CHECKS = CheckSet("system", ranks={"system": 3})

GIB = 1024**3
RDMA_FABRICS = ("infiniband", "efa")


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' * (number != 1)}"


def _gpu_node(node: NodeView) -> dict[str, Any]:
    """The system section, or stop with SKIP where none of the GPU-node rules apply."""
    require_nvidia(node)
    return section(node, "system")


def _gpu_labels(node: NodeView) -> list[tuple[str, str]]:
    """(label, bus id) of every GPU: the driver's records, else the PCI bus scan."""
    gpus = node.facts.get("gpus") or []
    if gpus:
        return [(f"gpu{g['index']}", g.get("pci_bus_id") or "") for g in gpus]
    pci = (node.facts.get("pci") or {}).get("nvidia_gpus") or []
    return [(bus, bus) for bus in pci]


# ---------------------------------------------------------------- NUMA


@CHECKS.node("numa_topology", "system", severity="normal", section="system", in_use=True)
def numa_topology(node: NodeView) -> Result:
    """NUMA node count as expected; every GPU's NUMA node known and GPUs spread as expected."""
    system = _gpu_node(node)
    lim = node.limits.get(SystemLimits)
    expected = lim.numa_nodes_expected
    nodes = system.get("numa_nodes")
    if nodes is None:
        if reason(system, "numa_nodes")["kind"] != "not_supported":
            need(system, "numa_nodes", "NUMA nodes (/sys/devices/system/node)")
        nodes = [{"node": 0, "cpu_count": system.get("cpus_online") or 1}]
    bios = "check the BIOS NUMA settings (node interleaving off, SNC/NPS as planned)"
    if expected is not None and len(nodes) != expected:
        return failed(
            f"{_count(len(nodes), 'NUMA node')}, expected {expected}",
            Action.FIX_CONFIG,
            f"{bios}; if the inventory is wrong, set numa_nodes_expected",
        )
    affinity = need(system, "gpu_numa_nodes", "GPU NUMA nodes (/sys/bus/pci/devices)")
    gpus = _gpu_labels(node)
    if not gpus:
        return skipped(f"{_count(len(nodes), 'NUMA node')}; no GPU to place (see gpu_count)")
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
        return failed(
            f"NUMA affinity unknown on a {len(nodes)}-node host for {', '.join(unknown)}",
            Action.FIX_CONFIG,
            f"{bios}; update the BIOS if its ACPI tables give the GPUs no proximity domain",
        )
    layout = "; ".join(f"node{n}: {', '.join(placed[n])}" for n in sorted(placed))
    if lim.gpus_even_over_numa_nodes:
        cpu_nodes = [n["node"] for n in nodes if n.get("cpu_count")]
        share, rest = divmod(len(gpus), len(cpu_nodes) or 1)
        uneven = rest or any(len(placed.get(n, [])) != share for n in cpu_nodes)
        uneven = uneven or any(n not in cpu_nodes for n in placed)
        if uneven:
            counts = ", ".join(f"node{n}: {len(placed.get(n, []))}" for n in cpu_nodes)
            want = f"expected {share} each" if not rest else f"{len(gpus)} GPUs do not divide"
            return failed(
                f"GPUs not split evenly over the {len(cpu_nodes)} NUMA nodes with CPUs "
                f"({counts}; {want}): {layout}",
                Action.INSPECT,
                f"{bios}; check that every GPU's riser/PCIe switch is on the planned socket",
            )
    count = _count(len(nodes), "NUMA node") + (" as expected" if expected is not None else "")
    return passed(f"{count}; GPUs by node: {layout}")


@CHECKS.node("numactl", "system", severity="normal", section="system", in_use=True)
def numactl(node: NodeView) -> Result:
    """numactl is installed and `numactl --hardware` runs and parses."""
    system = _gpu_node(node)
    record = system.get("numactl") or {}
    install = "apt-get install numactl (site.yml, role numactl)"
    if not record.get("available"):
        return failed(f"numactl not installed ({record.get('error')})", Action.FIX_CONFIG, install)
    if record.get("error") or not record.get("hardware"):
        return failed(
            f"numactl --hardware failed: {record.get('error') or 'no output'}",
            Action.FIX_CONFIG,
            "run `numactl --hardware` on the node; reinstall numactl (role numactl) and check "
            "that the kernel has NUMA support",
        )
    hardware = record["hardware"]
    nodes = ", ".join(f"node{n['node']} {n['cpu_count']} CPUs" for n in hardware["nodes"])
    count = _count(hardware["available_nodes"], "node")
    return passed(f"numactl --hardware: {count} ({nodes})")


# ---------------------------------------------------------------- resources


def _gib(value_bytes: float) -> str:
    return f"{value_bytes / GIB:.1f} GiB"


def _disk_problem(disks: dict[str, dict[str, Any]], path: str, minimum: float) -> str | None:
    record = disks.get(path)
    if record is None:
        return f"{path}: no free-space record (the probe was not asked for it)"
    free = record.get("free_bytes")
    if free is None:
        return f"{path}: free space unknown ({detail(record, 'free_bytes')})"
    if free < minimum * GIB:
        return f"{path}: {_gib(free)} free < {minimum:g} GiB"
    return None


@CHECKS.node("host_resources", "system", section="system", in_use=True)
def host_resources(node: NodeView) -> Result:
    """CPUs, memory (total and available) and free space on / and scratch above the limits."""
    system = section(node, "system")
    lim = node.limits.get(SystemLimits)
    problems: list[str] = []
    actions: list[str] = []
    code = Action.RERUN  # only unknown values: read again
    online, usable = system.get("cpus_online"), system.get("cpus_usable")
    if lim.min_cpus is not None:
        if online is None:
            problems.append("online CPU count unknown")
        elif online < lim.min_cpus:
            problems.append(f"{online} CPUs online < {lim.min_cpus}")
            actions.append("check the BIOS (cores/SMT disabled?) and `lscpu` for offline CPUs")
            code = Action.INSPECT
    total, available = system.get("memory_total_kb"), system.get("memory_available_kb")
    if lim.min_memory_gb is not None:
        if total is None:
            problems.append("MemTotal unknown")
        elif total * 1024 < lim.min_memory_gb * GIB:
            problems.append(f"memory {_gib(total * 1024)} < {lim.min_memory_gb:g} GiB")
            actions.append("check for failed DIMMs (`dmidecode -t memory`, BMC SEL, EDAC)")
            code = Action.INSPECT
    # What a job uses (host memory, scratch space) is judged on idle nodes only.
    pct = None if node.in_use else lim.min_memory_available_pct
    if pct is not None:
        if total is None or available is None:
            problems.append("MemAvailable unknown")
        elif available * 100 < pct * total:
            problems.append(f"memory available {available * 100 / total:.0f}% < {pct:g}%")
            actions.append("find what holds memory (`ps aux --sort=-rss`, hugepages, tmpfs)")
            code = min(code, Action.FIX_CONFIG, key=lambda a: a.rank)
    disks = {d["path"]: d for d in system.get("disks") or []}
    wanted = []
    if lim.min_root_free_gb is not None:
        wanted.append(("/", lim.min_root_free_gb))
    if lim.min_scratch_free_gb is not None and not node.in_use:
        wanted += [(p, lim.min_scratch_free_gb) for p in lim.scratch_paths]
    disk_problems = [p for p in (_disk_problem(disks, path, m) for path, m in wanted) if p]
    if disk_problems:
        problems += disk_problems
        actions.append("free space (old containers, logs, core dumps) or check the scratch mount")
        code = min(code, Action.FIX_CONFIG, key=lambda a: a.rank)
    if problems:
        return failed("; ".join(problems), code, "; ".join(actions) or "re-run the probe")
    cpus = f"{online} CPUs" + (f" ({usable} usable by the probe)" if usable != online else "")
    memory = f"memory {_gib((total or 0) * 1024)}"
    if total and available is not None:
        memory += f" ({available * 100 / total:.0f}% available)"
    free = ", ".join(
        f"{d['path']} {_gib(d['free_bytes'])} free"
        for d in disks.values()
        if d.get("free_bytes") is not None
    )
    return passed(f"{cpus}, {memory}, {free}")


# ---------------------------------------------------------------- memlock


@CHECKS.node("memlock_limit", "system", section="system", in_use=True)
def memlock_limit(node: NodeView) -> Result:
    """The memlock limit (`ulimit -l`) is unlimited, or at least the profile's, for RDMA."""
    system = _gpu_node(node)
    limit = need(system, "memlock_kb", "memlock limit")
    soft, hard = limit.get("soft"), limit.get("hard")
    fabric = node.limits.get(SharedLimits).fabric
    minimum = node.limits.get(SystemLimits).min_memlock_kb
    shown = soft if soft == "unlimited" else f"{soft} KB"
    if hard != soft:
        shown += f" (hard limit {hard if hard == 'unlimited' else f'{hard} KB'})"
    if minimum is None and fabric not in RDMA_FABRICS:
        return skipped(f"memlock {shown}; no minimum (fabric {fabric}, min_memlock_kb null)")
    action = (
        "set `* - memlock unlimited` in /etc/security/limits.d/ (ssh logins), "
        "DefaultLimitMEMLOCK=infinity for services such as slurmd (systemd system.conf or a "
        "drop-in), and PropagateResourceLimitsExcept=MEMLOCK in slurm.conf so jobs keep "
        "slurmd's limit; then log in again and re-run"
    )
    if minimum is None:
        if soft == "unlimited":
            return passed(f"memlock unlimited (fabric {fabric})")
        return failed(
            f"memlock limit {shown}, RDMA over {fabric} needs unlimited", Action.FIX_CONFIG, action
        )
    if soft == "unlimited" or soft >= minimum:
        return passed(f"memlock {shown} >= {minimum} KB")
    return failed(f"memlock limit {shown} < {minimum} KB", Action.FIX_CONFIG, action)


# ---------------------------------------------------------------- kernel modules


@CHECKS.node("kernel_modules", "system", section="system", in_use=True)
def kernel_modules(node: NodeView) -> Result:
    """nvidia and nvidia_uvm loaded; nvidia_peermem for GPUDirect RDMA; efa on EFA hosts."""
    system = _gpu_node(node)
    # No /proc/modules: a kernel without loadable modules, or a sandbox (gVisor) that hides
    # the host's; the modules cannot be judged from here, which is a skip, not a pass.
    loaded = set(need(system, "kernel_modules", "loaded kernel modules"))
    fabric = node.limits.get(SharedLimits).fabric
    peermem = node.limits.get(SystemLimits).require_nvidia_peermem
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
        listed = ", ".join(f"{name} ({wanted[name]})" for name in missing)
        return failed(
            f"kernel modules not loaded: {listed}",
            Action.FIX_CONFIG,
            f"modprobe {' '.join(missing)} and list them in /etc/modules-load.d/ so they load at "
            "boot; check `dmesg` if modprobe fails (module built for another kernel?)",
        )
    return passed(f"loaded: {', '.join(wanted)}")


# ---------------------------------------------------------------- services


@CHECKS.node("gpu_services", "system", section="system", in_use=True)
def gpu_services(node: NodeView) -> Result:
    """nvidia-persistenced, fabric manager (NVSwitch), DCGM and GPUd active where expected."""
    system = _gpu_node(node)
    wanted = {
        "nvidia-persistenced": node.limits.get(GpuLimits).require_persistence_mode,
        "nvidia-fabricmanager": node.limits.get(SystemLimits).requires_fabric_manager,
        "nvidia-dcgm": node.limits.get(SharedLimits).dcgm_installed,
        "gpud": node.limits.get(SharedLimits).gpud_installed,
    }
    units = [unit for unit, required in wanted.items() if required]
    if not units:
        return skipped("no service required by the profile or inventory")
    states = system.get("services")
    if states is None:
        if reason(system, "services")["kind"] in ("not_supported", "absent"):
            need(system, "services", "service states (systemctl)")
        return failed(
            f"could not read service states: {detail(system, 'services')}",
            Action.INSPECT,
            "check that systemd answers (`systemctl is-system-running`, dbus); reboot if it hangs",
        )
    bad = [f"{u} is {states.get(u) or 'not recorded'}" for u in units if states.get(u) != "active"]
    if bad:
        names = " ".join(u for u in units if states.get(u) != "active")
        return failed(
            f"{'; '.join(bad)} (expected active)",
            Action.FIX_CONFIG,
            f"systemctl enable --now {names}; read `journalctl -u <unit>` (fabric manager must "
            "match the driver version exactly; roles nvidia_driver, dcgm, gpud)",
        )
    return passed(f"active: {', '.join(units)}")
