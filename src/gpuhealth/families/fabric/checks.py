"""Fabric checks: EFA devices and libfabric on AWS, InfiniBand ports elsewhere.

The host's `fabric` (profile or inventory: none, efa, infiniband) decides which of them apply;
the others skip and say so. They read the facts document's `fabric` section (sysfs devices and
`fi_info`), so a live run and a triage of a copied /sys/class/infiniband judge alike.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.checks import CheckSet, NodeView, StopCheck, detail, need, section
from gpuhealth.facts import reason
from gpuhealth.families.fabric.limits import FabricLimits
from gpuhealth.families.fabric.sysfs import pci_name
from gpuhealth.families.fabric.topology import Distance, Rails, Table, rails, rank, table
from gpuhealth.families.gpu.scope import GPU
from gpuhealth.limits import SharedLimits
from gpuhealth.results import Action, Result, Status, failed, passed, skipped

CHECKS = CheckSet("fabric", ranks={"fabric": 2})

_LABELS = {"efa": "EFA", "infiniband": "InfiniBand"}

# The five PortCounters that show a bad cable, transceiver or switch port, and the value at
# which each (8, 16 or 4 bits wide in the IB spec) saturates and stops counting.
ERROR_COUNTERS = {
    "link_downed": 255,
    "symbol_error": 65535,
    "port_rcv_errors": 65535,
    "local_link_integrity_errors": 15,
    "excessive_buffer_overrun_errors": 15,
}

_EFA_ACTION = (
    "check that EFA is enabled on every network card of the instance (launch template), that "
    "the efa kernel module is loaded (`lsmod | grep efa`, dmesg) and the EFA installer ran; "
    "stop/start the instance to move it to other hardware if devices stay missing"
)
_EFA_INSTALL = (
    "install the EFA software (aws-efa-installer: `./efa_installer.sh -y`), which provides "
    "libfabric and /opt/amazon/efa/bin/fi_info, then re-run"
)
_CABLE = (
    "reseat or replace the cable or transceiver of the named port and check the switch port "
    "(its state and error counters, ibdiagnet/UFM)"
)


def _section(node: NodeView, fabric: str) -> dict[str, Any]:
    """The `fabric` section, or stop with SKIP when the host is not on this fabric."""
    actual = node.limits.get(SharedLimits).fabric
    if actual != fabric:
        raise StopCheck(
            skipped(
                f"not an {_LABELS[fabric]} host (fabric: {actual}, from profile "
                f"{node.limits.name} and inventory vars; set fabric: {fabric} to check it)",
            )
        )
    return section(node, "fabric")


def _devices(node: NodeView, fabric: str) -> list[dict[str, Any]]:
    return need(_section(node, fabric), "devices", "RDMA device list (/sys/class/infiniband)")


def _names(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _enum(port: dict[str, Any], key: str) -> str:
    value = port.get(key)
    if value is None:
        return f"not reported ({detail(port, key)})"
    return f"{value} ({port.get(f'{key}_code')})"


# ---------------------------------------------------------------- EFA


def _efa(node: NodeView) -> tuple[list[dict[str, Any]], list[str]]:
    """The EFA devices (bound to the efa driver) and the names of devices with no driver link.

    A saved copy of sysfs usually lost the driver links; it cannot tell EFA devices apart.
    """
    devices = _devices(node, "efa")
    efa = [d for d in devices if d.get("driver") == "efa"]
    unbound = [d["name"] for d in devices if d.get("driver") is None]
    if node.from_evidence and unbound and not efa:
        raise StopCheck(
            skipped(
                "not evaluated: the sysfs copy has no device/driver links to tell EFA devices "
                f"from others ({_names(unbound)})",
            )
        )
    return efa, unbound


@CHECKS.node("efa_device_count", "fabric", section="fabric", in_use=True)
def efa_device_count(node: NodeView) -> Result:
    """The node shows as many EFA devices (efa driver, sysfs) as its instance type has."""
    efa, unbound = _efa(node)
    expected = node.limits.get(FabricLimits).efa_devices_expected
    names = _names([d["name"] for d in efa])
    if expected is None and efa:
        return passed(f"found {len(efa)} EFA devices ({names}); set efa_devices_expected to assert")
    if len(efa) == expected:
        return passed(f"found {len(efa)} EFA devices as expected ({names})")
    more = (
        f"; {len(unbound)} RDMA devices with no driver link ({_names(unbound)})" if unbound else ""
    )
    want = expected if expected is not None else "at least 1"
    return failed(
        f"expected {want} EFA devices, found {len(efa)}{f' ({names})' if efa else ''}{more}",
        Action.INSPECT,
        _EFA_ACTION,
    )


@CHECKS.node("efa_fi_info", "fabric", section="fabric", in_use=True)
def efa_fi_info(node: NodeView) -> Result:
    """libfabric's fi_info lists the efa provider with one RDM domain per EFA device."""
    fabric = _section(node, "efa")
    if fabric.get("fi_info") is None and not node.from_evidence:
        return failed(
            f"the probe did not run fi_info ({detail(fabric, 'fi_info')})",
            Action.FIX_CONFIG,
            "probe the node with the inventory that sets fabric: efa (pytest --inventory, or "
            "gpu_profile of an EFA instance type)",
        )
    info = need(fabric, "fi_info", "fi_info output")
    expected = node.limits.get(FabricLimits).efa_devices_expected
    status, error = info.get("status"), info.get("error")
    if status == "not_installed":
        return failed(f"fi_info is not installed ({error})", Action.FIX_CONFIG, _EFA_INSTALL)
    if status == "timeout":
        return failed(
            f"fi_info did not answer: {error}",
            Action.REBOOT_NODE,
            "look for a hung efa driver (dmesg | grep -i efa); reboot the node if it persists",
        )
    if status not in ("ok", "no_devices"):
        return failed(f"fi_info failed: {error}", Action.FIX_CONFIG, _EFA_INSTALL)
    domains = info.get("domains") or []
    version = info.get("libfabric_version")
    provider = info.get("provider_version")
    lib = (
        f"libfabric {version} (efa provider {provider})" if version else f"efa provider {provider}"
    )
    if status == "no_devices":
        lib = f"found no EFA device (fi_getinfo {info.get('getinfo_error')})"
    elif not domains and info.get("entries"):
        found = sorted({e.get("provider") for e in info["entries"]})
        lib = f"providers listed: {', '.join(map(str, found))}"
    names = _names(domains)
    if expected is None and domains:
        return passed(f"fi_info lists {len(domains)} EFA RDM domains ({names}); {lib}")
    if len(domains) == expected:
        return passed(f"fi_info lists {len(domains)} EFA RDM domains as expected; {lib}")
    want = expected if expected is not None else "at least 1"
    return failed(
        f"fi_info -p efa -t FI_EP_RDM: expected {want}, found {len(domains)} RDM domains"
        f"{f' ({names})' if domains else ''}; {lib}",
        Action.INSPECT,
        _EFA_ACTION,
    )


@CHECKS.node("efa_ports_active", "fabric", section="fabric", in_use=True)
def efa_ports_active(node: NodeView) -> Result:
    """Every port of every EFA device is ACTIVE."""
    efa, _ = _efa(node)
    if not efa:
        return failed("no EFA device to judge (see efa_device_count)", Action.INSPECT, _EFA_ACTION)
    bad, count = [], 0
    for device in efa:
        ports = device.get("ports")
        if not ports:
            bad.append(f"{device['name']} has no readable port")
            continue
        for port in ports:
            count += 1
            if port.get("state") != "ACTIVE":
                bad.append(f"{device['name']} port {port['port']} {_enum(port, 'state')}")
    if bad:
        return failed(
            f"EFA ports not ACTIVE: {'; '.join(bad)}",
            Action.REBOOT_NODE,
            "check dmesg for efa errors; stop/start the instance to move it to other hardware; "
            "report the instance to AWS if it recurs",
        )
    return passed(f"all {count} ports of {len(efa)} EFA devices ACTIVE")


# ---------------------------------------------------------------- InfiniBand


def _ib_ports(
    node: NodeView, devices: list[dict[str, Any]]
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], list[str], list[str]]:
    """The (device, port) pairs the IB checks judge, the ports left out, and problems.

    By default every port with link layer InfiniBand, bonds excluded (RoCE/Ethernet ports are
    storage or front-end networks); `ib_devices` names the devices to judge instead.
    """
    listed = node.limits.get(FabricLimits).ib_devices
    wanted = {str(name) for name in listed} if listed is not None else None
    judged, ignored, problems = [], [], []
    for device in devices:
        name = device["name"]
        if wanted is not None and name not in wanted:
            continue
        if device.get("ports") is None:
            problems.append(f"{name}: ports not readable")
            continue
        for port in device["ports"]:
            layer = port.get("link_layer") or "link layer unknown"
            if wanted is None and ("bond" in name or layer != "InfiniBand"):
                ignored.append(f"{name} port {port['port']} ({layer})")
            else:
                judged.append((device, port))
    seen = {d["name"] for d in devices}
    problems += [
        f"{name}: listed in ib_devices, not found"
        for name in sorted(wanted or ())
        if name not in seen
    ]
    return judged, ignored, problems


def _judged(node: NodeView) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The ports to judge; none at all stops the check with a failure (see ib_port_count)."""
    judged, _, problems = _ib_ports(node, _devices(node, "infiniband"))
    if not judged:
        why = f" ({'; '.join(problems)})" if problems else ""
        raise StopCheck(
            failed(
                f"no InfiniBand port to judge{why} (see ib_port_count)",
                Action.INSPECT,
                "check `ibstat`, the mlx5_core driver (dmesg | grep mlx5) and the HCAs",
            )
        )
    return judged


def _label(device: dict[str, Any], port: dict[str, Any]) -> str:
    return f"{device['name']} port {port['port']}"


def _absent(node: NodeView, record: dict[str, Any], key: str) -> bool:
    """A value the pasted evidence does not hold (ibstat has no counters, plain ibv_devinfo no
    physical state): not evaluated, where a live node's missing value is a failure."""
    return (
        node.from_evidence and record.get(key) is None and reason(record, key)["kind"] == "absent"
    )


def _not_in_evidence(labels: list[str], what: str) -> Result:
    return skipped(f"not evaluated: the evidence holds no {what} of {_names(labels)}")


@CHECKS.node("ib_port_count", "fabric", section="fabric", in_use=True)
def ib_port_count(node: NodeView) -> Result:
    """The node has the expected number of InfiniBand ports (Ethernet and bonds not counted)."""
    judged, ignored, problems = _ib_ports(node, _devices(node, "infiniband"))
    expected = node.limits.get(FabricLimits).ib_ports_expected
    found = len(judged)
    names = _names([_label(d, p) for d, p in judged])
    note = f"; not counted: {_names(ignored)}" if ignored else ""
    action = (
        "look for a missing HCA (`ibstat`, `lspci | grep -i mellanox`) and mlx5_core errors in "
        "dmesg; reseat or replace the HCA, or fix ib_ports_expected/ib_devices if it is wrong"
    )
    if problems:
        return failed(f"{'; '.join(problems)} (found {found} ports{note})", Action.INSPECT, action)
    if expected is None and found:
        return passed(f"found {found} InfiniBand ports ({names}); set ib_ports_expected{note}")
    if found == expected:
        return passed(f"found {found} InfiniBand ports as expected ({names}){note}")
    want = expected if expected is not None else "at least 1"
    listing = f" ({names})" if judged else ""
    return failed(
        f"expected {want} InfiniBand ports, found {found}{listing}{note}", Action.INSPECT, action
    )


@CHECKS.node("ib_port_state", "fabric", section="fabric", in_use=True)
def ib_port_state(node: NodeView) -> Result:
    """Every InfiniBand port is ACTIVE with its physical link LinkUp."""
    judged = _judged(node)
    unknown = [
        _label(d, p)
        for d, p in judged
        if p.get("state") == "ACTIVE" and _absent(node, p, "phys_state")
    ]
    bad = [
        f"{_label(d, p)} state {_enum(p, 'state')}, phys_state {_enum(p, 'phys_state')}"
        for d, p in judged
        if (p.get("state") != "ACTIVE" or p.get("phys_state") != "LinkUp")
        and _label(d, p) not in unknown
    ]
    if bad:
        return failed(
            f"InfiniBand ports not ACTIVE/LinkUp: {'; '.join(bad)}",
            Action.INSPECT,
            f"phys_state other than LinkUp: {_CABLE}; LinkUp but INIT/ARMED: the subnet "
            "manager has not brought the port up, check opensm/UFM",
        )
    if unknown:
        return _not_in_evidence(unknown, "physical state (plain ibv_devinfo; -v has it)")
    return passed(f"all {len(judged)} InfiniBand ports ACTIVE/LinkUp")


@CHECKS.node("ib_port_rate", "fabric", section="fabric", in_use=True)
def ib_port_rate(node: NodeView) -> Result:
    """Every InfiniBand port runs at the profile's minimum rate (NDR 400 Gb/s on H100)."""
    judged = _judged(node)
    absent = [_label(d, p) for d, p in judged if _absent(node, p, "rate_gbps")]
    if absent:
        return _not_in_evidence(absent, "port rate (plain ibv_devinfo; -v has it)")
    unknown = [
        f"{_label(d, p)} ({_enum(p, 'rate_gbps')})" for d, p in judged if p.get("rate_gbps") is None
    ]
    if unknown:
        return failed(f"port rate not reported: {'; '.join(unknown)}", Action.INSPECT, _CABLE)
    minimum = node.limits.get(FabricLimits).ib_min_rate_gbps
    floor = minimum if minimum is not None else max(p["rate_gbps"] for _, p in judged)
    whose = "" if minimum is not None else " (the fastest port's rate; set ib_min_rate_gbps)"
    slow = [
        f"{_label(d, p)} {p['rate_gbps']:g} Gb/s ({p.get('rate')})"
        for d, p in judged
        if p["rate_gbps"] < floor
    ]
    if slow:
        return failed(
            f"InfiniBand ports below {floor:g} Gb/s{whose}: {'; '.join(slow)}",
            Action.INSPECT,
            f"a port at reduced width or speed: {_CABLE}",
        )
    rates = sorted({str(p.get("rate")) for _, p in judged})
    return passed(f"all {len(judged)} ports >= {floor:g} Gb/s ({', '.join(rates)})")


@CHECKS.node("ib_error_counters", "fabric", severity="normal", section="fabric", in_use=True)
def ib_error_counters(node: NodeView) -> Result:
    """Link error counters of every InfiniBand port at or below the profile's limits."""
    judged = _judged(node)
    lim = node.limits.get(FabricLimits)
    configured = {
        "link_downed": lim.ib_max_link_downed,
        "symbol_error": lim.ib_max_symbol_error,
        "port_rcv_errors": lim.ib_max_port_rcv_errors,
        "local_link_integrity_errors": lim.ib_max_local_link_integrity_errors,
        "excessive_buffer_overrun_errors": lim.ib_max_excessive_buffer_overrun_errors,
    }
    limits = {name: limit for name, limit in configured.items() if limit is not None}
    if not limits:
        return skipped("no error-counter limit set (ib_max_* are all null)")
    absent = [_label(d, p) for d, p in judged if _absent(node, p, "counters")]
    if absent:
        return _not_in_evidence(absent, "error counters (ibstat and ibv_devinfo print none)")
    problems = []
    for device, port in judged:
        counters = port.get("counters")
        if counters is None:
            problems.append(f"{_label(device, port)}: counters {_enum(port, 'counters')}")
            continue
        over = []
        for name, limit in limits.items():
            value = counters.get(name)
            if value is None:
                over.append(f"{name} not reported")
            elif value > limit:
                full = " (saturated)" if value == ERROR_COUNTERS[name] else ""
                over.append(f"{name} {value}{full} > {limit}")
        if over:
            problems.append(f"{_label(device, port)}: {', '.join(over)}")
    if problems:
        return failed(
            "; ".join(problems),
            Action.INSPECT,
            f"{_CABLE}; the counters add up since the HCA was reset: clear them "
            "(`perfquery -R`) after the fix and watch that they stay put",
        )
    shown = ", ".join(f"{name} <= {limit}" for name, limit in limits.items())
    return passed(f"error counters within limits on {len(judged)} ports ({shown})")


@CHECKS.node("ib_firmware_uniform", "fabric", severity="normal", section="fabric", in_use=True)
def ib_firmware_uniform(node: NodeView) -> Result:
    """All InfiniBand HCAs of one model run the same firmware version."""
    hcas = {d["name"]: d for d, _ in _judged(node)}
    absent = [name for name, d in hcas.items() if _absent(node, d, "fw_ver")]
    if absent:
        return _not_in_evidence(absent, "firmware version")
    unknown = [name for name, d in hcas.items() if not d.get("fw_ver")]
    if unknown:
        return failed(f"firmware version not reported by {', '.join(unknown)}", Action.RERUN)
    models: dict[str, dict[str, list[str]]] = {}
    for name, device in hcas.items():
        model = device.get("hca_type") or "unknown model"
        models.setdefault(model, {}).setdefault(device["fw_ver"], []).append(name)
    mixed = {model: versions for model, versions in models.items() if len(versions) > 1}
    if mixed:
        listed = " | ".join(
            f"{model}: " + "; ".join(f"{fw} on {_names(names)}" for fw, names in versions.items())
            for model, versions in mixed.items()
        )
        return failed(
            f"HCA firmware differs: {listed}",
            Action.FIX_CONFIG,
            "flash every HCA to the same firmware (mlxfwmanager or mstflint), then mlxfwreset "
            "or reboot",
        )
    summary = "; ".join(
        f"{next(iter(versions))} on {sum(len(n) for n in versions.values())} {model} HCAs"
        for model, versions in models.items()
    )
    return passed(f"firmware uniform: {summary}")


# ---------------------------------------------------------------- GPU-to-NIC affinity


def _rdma_nics(node: NodeView, fabric: dict[str, Any]) -> list[dict[str, Any]]:
    """The RDMA devices the node's fabric uses: EFA devices, or the judged InfiniBand HCAs."""
    devices = need(fabric, "devices", "RDMA device list (/sys/class/infiniband)")
    if node.limits.get(SharedLimits).fabric == "efa":
        return [d for d in devices if d.get("driver") == "efa"]
    judged, _, _ = _ib_ports(node, devices)
    return list({d["name"]: d for d, _ in judged}.values())


def _gpu_label(gpu: dict[str, Any]) -> str:
    return f"gpu{gpu.get('index')}"


def _gpu_positions(node: NodeView, gpu_pci: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """label -> PCI position of every GPU of the node whose position the probe recorded."""
    found = {}
    for gpu in node.facts.get("gpus") or []:
        if not isinstance(gpu, dict):
            continue
        bus_id = gpu.get("pci_bus_id")
        try:
            position = gpu_pci.get(pci_name(bus_id)) if isinstance(bus_id, str) else None
        except ValueError:  # not a bus id: nothing the probe could look up
            continue
        if isinstance(position, dict):
            found[_gpu_label(gpu)] = position
    return found


# What a pasted topo -m cannot say about a Grace-attached GPU (GB200, GH200): nvidia-smi gives
# such a GPU its own NUMA node (GPU NUMA ID) and reports SYS to every NIC, even one on the
# GPU's own socket.
_C2C = (
    "nvidia-smi topo -m reports SYS for every NIC of a GPU with its own NUMA node (GPU NUMA "
    "ID {}, a Grace C2C platform), whatever the PCIe path; judge the probe's facts instead"
)


def _from_topo(matrix: dict[str, Any]) -> Table:
    """The distance table of a pasted topo -m (families/fabric/parse_topo.py)."""
    distances: Table = {}
    for row in matrix.get("gpus") or []:
        numa = row.get("gpu_numa_id")
        distances[f"gpu{row['index']}"] = {
            name: Distance(None, _C2C.format(numa)) if numa is not None else Distance(level)
            for name, level in row["nics"].items()
        }
    return distances


def _distances(node: NodeView, fabric: dict[str, Any], gpu: dict[str, Any]) -> Table:
    """Every GPU's distance to every RDMA NIC of the node, from the probe's PCI positions
    or a pasted topo -m; stop when there is nothing to judge."""
    if isinstance(fabric.get("topo_matrix"), dict):
        return _from_topo(fabric["topo_matrix"])
    if "gpu_pci" not in fabric:
        if node.from_evidence:
            raise StopCheck(skipped("not evaluated: the evidence holds no GPU PCI positions"))
        raise StopCheck(
            skipped(
                "not evaluated: these facts predate the GPUs' PCI positions (probe again "
                "with this gpuhealth)"
            )
        )
    gpu_pci = need(fabric, "gpu_pci", "PCI positions of the GPUs")
    nics = {d["name"]: d.get("pci") or {} for d in _rdma_nics(node, fabric)}
    if not nics:
        fabric_name = node.limits.get(SharedLimits).fabric
        raise StopCheck(
            skipped(
                f"no {_LABELS[fabric_name]} device to match the GPU with (judged by "
                f"{'efa_device_count' if fabric_name == 'efa' else 'ib_port_count'})"
            )
        )
    gpus = _gpu_positions(node, gpu_pci)
    if _gpu_label(gpu) not in gpus:
        raise StopCheck(
            failed(
                f"the probe recorded no PCI position for {_gpu_label(gpu)} "
                f"(bus {gpu.get('pci_bus_id')})",
                Action.RERUN,
                "re-run the probe with this gpuhealth; if it persists, check `lspci -s` and "
                "the GPU's bus id",
            )
        )
    return table(gpus, nics)


def _rail_map(rails: Rails) -> str:
    return ", ".join(
        f"{label} {_names(list(near.nics), 4)} ({near.level})" if near.level else f"{label} unknown"
        for label, near in rails.nearest.items()
    )


_FAR_NIC = (
    "the GPU's nearest RDMA NIC is farther than the platform puts it: check that every NIC "
    "is seated in the slot or riser of its GPU's PCIe switch (the system's cabling guide), "
    "that no NIC is missing (`lspci -tv`, `nvidia-smi topo -m`), and the BIOS PCIe "
    "bifurcation settings; if the platform has no per-GPU NIC, set gpu_nic_max_distance"
)
_MISWIRED = (
    "GPUs share NICs while other NICs serve no GPU: a NIC sits in the wrong slot or a GPU's "
    "own NIC is missing; compare `nvidia-smi topo -m` and `lspci -tv` with the platform's "
    "slot map and re-seat the NIC (NCCL would route two GPUs' traffic through one NIC)"
)


@CHECKS.per(GPU, "gpu_nic_affinity", "fabric", in_use=True)
def gpu_nic_affinity(node: NodeView, gpu: dict[str, Any]) -> Result:
    """The GPU's nearest RDMA NIC within gpu_nic_max_distance, and no GPU sharing a NIC
    while another NIC serves none (rail alignment)."""
    lim = node.limits.get(FabricLimits)
    if node.limits.get(SharedLimits).fabric == "none":
        raise StopCheck(
            skipped(
                f"not an RDMA host (fabric: none, from profile {node.limits.name} and inventory "
                "vars; set fabric: efa or infiniband to check it)"
            )
        )
    if node.facts.get("fabric") is None:  # the fabric checks judge a missing section
        where = "the evidence holds" if node.from_evidence else "these facts have"
        return skipped(f"not evaluated: {where} no fabric section")
    limit = lim.gpu_nic_max_distance
    unjudged = f"not judged (gpu_nic_max_distance: null in profile {node.limits.name})"
    label = _gpu_label(gpu)
    try:
        found = rails(_distances(node, section(node, "fabric"), gpu))
    except StopCheck as stop:
        if limit is None and stop.result.status == Status.FAIL:
            return skipped(f"{unjudged}: {stop.result.message}")
        raise
    if label not in found.nearest:
        return failed(
            f"{label} has no row in the GPU-to-NIC table",
            Action.RERUN,
            "re-collect the evidence: every GPU's row of `nvidia-smi topo -m`",
        )
    near = found.nearest[label]
    shown = f"nearest RDMA NIC {_names(list(near.nics), 4)} at {near.level}"
    if near.level is None:
        parts = (part for text in near.unknown.values() for part in text.split("; "))
        reasons = list(dict.fromkeys(parts))
        more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
        unknown = "; ".join(reasons[:3]) + more
        if limit is None or node.from_evidence:
            return skipped(
                f"not evaluated: the distance from {label} to its NICs is unknown: {unknown}"
            )
        return failed(
            f"distance from {label} to every RDMA NIC unknown: {unknown}",
            Action.INSPECT,
            "a NUMA node of -1 means the firmware gives the device none (check the BIOS NUMA "
            "settings and the ACPI SRAT); a missing PCI path: check `lspci -tv` and dmesg",
        )
    if limit is None:
        return skipped(f"{unjudged}: {shown}; rails: {_rail_map(found)}")
    if rank(near.level) > rank(limit):
        return failed(
            f"{shown}, expected {limit} or closer (gpu_nic_max_distance); "
            f"rails: {_rail_map(found)}",
            Action.INSPECT,
            _FAR_NIC,
        )
    mine = [name for name in near.nics if name in found.shared]
    if found.misaligned and mine:
        crowd = "; ".join(f"{name} nearest to {', '.join(found.shared[name])}" for name in mine)
        return failed(
            f"{label} shares its nearest NIC: {crowd}, while {_names(found.unused)} "
            f"{'is' if len(found.unused) == 1 else 'are'} nearest to no GPU; "
            f"rails: {_rail_map(found)}",
            Action.INSPECT,
            _MISWIRED,
        )
    if mine and found.undecided:
        # Shared, and a NIC whose position is unknown may be the one this GPU should use.
        text = (
            f"{label} shares its nearest NIC ({', '.join(mine)}) and where "
            f"{_names(found.undecided)} sits is unknown: rail alignment cannot be judged; "
            f"rails: {_rail_map(found)}"
        )
        if node.from_evidence:
            return skipped(f"not evaluated: {text}")
        return failed(
            text,
            Action.INSPECT,
            "read the NIC's PCI position (`lspci -tv`, /sys/class/infiniband/<dev>/device, "
            "dmesg): a NIC the kernel cannot place is itself a fault",
        )
    return passed(f"{shown} (limit {limit}); rails: {_rail_map(found)}")
