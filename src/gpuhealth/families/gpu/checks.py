"""GPU checks: driver gate, GPU count and uniformity, and the per-GPU health of each GPU."""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from gpuhealth.checks import (
    CheckSet,
    NodeView,
    StopCheck,
    detail,
    missing,
    missing_any,
    need,
)
from gpuhealth.facts import reason
from gpuhealth.families.gpu.limits import GpuLimits
from gpuhealth.families.gpu.schema import recovery_action_name
from gpuhealth.families.gpu.scope import GPU, expected_gpus, none_expected
from gpuhealth.results import Action, Result, failed, passed, skipped, warned

CHECKS = CheckSet(
    "gpu",
    section="gpus",
    # The driver gate and the GPU inventory first: a wrong driver or a lost GPU explains most
    # of what else fails on the node; then the GPUs' hardware health; stray processes last.
    ranks={
        "driver": 0,
        "inventory": 0,
        "errors": 1,
        "memory": 1,
        "thermal": 1,
        "power": 1,
        "pcie": 1,
        "nvlink": 1,
        "processes": 4,
    },
)


def require_nvidia(node: NodeView, evidence_too: bool = True) -> None:
    """Skip a GPU-node check on a host with nothing NVIDIA that expects no GPU.

    With `evidence_too` false, a saved log is still judged on what it holds (a kernel log
    pasted without any nvidia-smi output has no GPU records, yet its XIDs count).
    """
    if none_expected(node) and (evidence_too or not node.from_evidence):
        raise StopCheck(skipped(f"no NVIDIA GPU/driver on {node.host}"))


def _limits(node: NodeView) -> GpuLimits:
    return node.limits.get(GpuLimits)


def _need_driver(node: NodeView) -> dict[str, Any]:
    require_nvidia(node)
    driver = node.facts.get("driver")
    return driver if isinstance(driver, dict) else {}


def _records(node: NodeView) -> list[dict[str, Any]]:
    """The node's GPU records, or stop: skip without NVIDIA, skip with nothing to compare."""
    gpus = [g for g in node.facts.get("gpus") or [] if isinstance(g, dict)]
    if not gpus:
        require_nvidia(node)
        raise StopCheck(skipped("no GPU records to compare (see gpu_count)"))
    return gpus


# ---------------------------------------------------------------- node checks


@CHECKS.node("driver_version", "driver", in_use=True)
def driver_version(node: NodeView) -> Result:
    """The NVIDIA driver is loaded and at least the minimum branch (default r570)."""
    driver = _need_driver(node)
    minimum = str(_limits(node).min_driver_version)
    version = driver.get("version")
    if not driver.get("loaded"):
        pci = (node.facts.get("pci") or {}).get("nvidia_gpus") or []
        seen = f"{len(pci)} NVIDIA GPUs on the PCI bus but " if pci else ""
        return failed(
            f"{seen}no NVIDIA driver loaded (expected >= {minimum})",
            Action.FIX_CONFIG,
            "install the driver (site.yml, role nvidia_driver) and check `dmesg | grep NVRM`",
        )
    if not version:
        return need(driver, "version", "driver version")
    try:
        ok = Version(str(version)) >= Version(minimum)
    except ValueError:  # InvalidVersion, or digits beyond int()'s limit
        return failed(
            f"driver version {str(version)[:40]!r} cannot be compared with {minimum}",
            Action.INSPECT,
            "read `nvidia-smi` and /proc/driver/nvidia/version on the node",
        )
    if ok:
        return passed(f"driver {version} >= {minimum}")
    return failed(
        f"driver {version} is older than the required {minimum}",
        Action.FIX_CONFIG,
        f"upgrade to branch {minimum.split('.')[0]} or newer (nvidia_driver_branch) and reboot",
    )


@CHECKS.node("gpu_count", "inventory", in_use=True)
def gpu_count(node: NodeView) -> Result:
    """The node has exactly the number of GPUs the inventory/profile expects."""
    expected = expected_gpus(node)
    found = len(node.facts.get("gpus") or [])
    require_nvidia(node)
    reported = node.facts.get("gpu_count")
    if node.from_evidence and reported is not None and reported != found:
        # The file says how many GPUs are attached: records missing from it were cut off, not
        # lost by the node, so neither an RMA nor "as expected" can be concluded.
        return failed(
            f"the evidence is incomplete: it says {reported} GPUs are attached but holds "
            f"records of {found}",
            Action.RERUN,
            "collect the whole output again (nvidia-smi -q > file) and triage that",
        )
    if node.from_evidence and reported is None:
        # A fragment (some -q sections, nvlink lines, Fabric lines) lists the GPUs it shows,
        # not the node's: the ones it leaves out are not missing from the node.
        return skipped(
            f"not evaluated: the evidence does not say how many GPUs are attached (it holds "
            f"records of {found})"
        )
    unlisted = _unlisted(node)
    if unlisted:
        counted = f"expected {expected} GPUs, found {found}" if expected is not None else ""
        return failed(
            f"{counted or f'found {found} GPUs'}; {unlisted}",
            Action.REBOOT_NODE,
            "drain and reboot the node; look for Xid 79 (fallen off the bus) and RmInitAdapter "
            "errors in dmesg; reseat or RMA the GPU if the driver still does not list it",
        )
    if expected is None:
        return skipped(f"found {found} GPUs; no expected count (set gpu_count or --expected-gpus)")
    if found == expected:
        return passed(f"found {found} GPUs as expected")
    pci = (node.facts.get("pci") or {}).get("nvidia_gpus")
    bus = f"; {len(pci)} NVIDIA GPUs on the PCI bus" if pci is not None else ""
    # All of them on the bus: the driver lost them (reboot); fewer: a GPU is gone (reseat/RMA).
    action = Action.REBOOT_NODE if pci is not None and len(pci) >= expected else Action.RMA
    return failed(
        f"expected {expected} GPUs, found {found}{bus}",
        action,
        "check `nvidia-smi -L`, `lspci -d 10de:` and dmesg for Xid 79; reseat or RMA the missing "
        "GPU; if the bus shows them all, reload the driver or reboot",
    )


def _unlisted(node: NodeView) -> str | None:
    """NVIDIA GPUs on the PCI bus that the loaded driver does not list (lost to it), in words;
    None when it lists as many as the bus shows, or either count is unknown."""
    pci = (node.facts.get("pci") or {}).get("nvidia_gpus")
    listed = node.facts.get("gpu_count")
    driver = node.facts.get("driver") or {}
    if not (driver.get("loaded") and isinstance(pci, list) and isinstance(listed, int)):
        return None
    gone = len(pci) - listed
    if gone <= 0:
        return None
    nodes = (node.facts.get("pci") or {}).get("device_nodes")
    if isinstance(nodes, int) and nodes == listed:
        # The probe saw as many /dev/nvidiaN as NVML lists: a container's or a job's share of
        # the node's GPUs (sysfs shows them all), not GPUs the driver lost.
        return None
    read = {str(g.get("pci_bus_id")).upper() for g in node.facts.get("gpus") or []}
    absent = [str(bus) for bus in pci if str(bus).upper() not in read]
    # A listed GPU whose bus id could not be read leaves more candidates than GPUs gone.
    which = ", ".join(absent) if len(absent) == gone else f"{gone} of {', '.join(absent)}"
    return (
        f"{len(pci)} NVIDIA GPUs on the PCI bus, the driver lists {listed}: {which} "
        "lost (on the bus, not listed by the driver)"
    )


# NVML_ERROR_GPU_IS_LOST (15): "The GPU has fallen off the bus or has otherwise become
# inaccessible" (NVML API reference, nvmlReturn_t). nvidia-smi answers such a GPU with "GPU is
# lost. Reboot the system to recover this GPU", and NVIDIA's XID catalog resolves XID 79
# (fallen off the bus) with RESTART_BM, as the kernel-log checks do (xids.yml): REBOOT_NODE.
_LOST_ADVICE = (
    "drain and reboot (power-cycle) the node to recover the GPU; look for Xid 79 in dmesg, "
    "reseat the GPU and check its power; RMA it if it is lost again"
)


# A per-GPU check registered among the node checks: its findings (group inventory) come first
# in a node's reasons, before what else a lost GPU makes unreadable.
@CHECKS.per(GPU, "gpu_lost", "inventory", in_use=True)
def gpu_lost(node: NodeView, gpu: dict[str, Any]) -> Result:
    """NVML reaches the GPU: it has not fallen off the bus (NVML_ERROR_GPU_IS_LOST)."""
    if "lost" not in gpu:
        return skipped(
            "not evaluated: these facts were collected before gpuhealth recorded lost GPUs; "
            "collect them again"
        )
    lost = gpu["lost"]
    if lost is None:
        return missing(gpu, "lost", "NVML's lost-GPU state")
    if lost:
        return failed(
            f"GPU lost: NVML answered {lost.get('call')} with {lost.get('error')} "
            "(NVML_ERROR_GPU_IS_LOST: it fell off the bus or is otherwise inaccessible); "
            "expected NVML to reach every GPU",
            Action.REBOOT_NODE,
            _LOST_ADVICE,
        )
    return passed("NVML reaches the GPU")


@CHECKS.node("gpu_uniformity", "inventory", severity="normal", in_use=True)
def gpu_uniformity(node: NodeView) -> Result:
    """All GPUs of the node are the same model on the same VBIOS family (and profile prefix)."""
    gpus = _records(node)
    # Only values read are compared: a GPU whose model could not be read is not another model
    # (its own checks say why: gpu_lost, or the call that failed or timed out).
    names = sorted({g["name"] for g in gpus if isinstance(g.get("name"), str)})
    # One name can hide two parts (early drivers call every Blackwell "NVIDIA Graphics Device").
    ids = sorted({g["pci_device_id"] for g in gpus if isinstance(g.get("pci_device_id"), str)})
    if len(names) > 1 or len(ids) > 1:
        shown = ", ".join(names) + (f" (PCI device ids {', '.join(ids)})" if len(ids) > 1 else "")
        return failed(
            f"mixed GPU models on one node: {shown}",
            Action.INSPECT,
            "fix the bill of materials: one GPU model per node",
        )
    vbios = {
        g.get("index"): g["vbios_version"] for g in gpus if isinstance(g.get("vbios_version"), str)
    }
    families = sorted({".".join(v.split(".")[:2]) for v in vbios.values()})
    prefix = _limits(node).vbios_prefix
    if len(families) > 1:
        detail = ", ".join(f"gpu{i} {v}" for i, v in sorted(vbios.items(), key=_by_index))
        return failed(
            f"VBIOS families differ: {detail}",
            Action.FIX_CONFIG,
            "flash all GPUs to the same VBIOS release",
        )
    if prefix:
        wrong = [
            f"gpu{i} {v}"
            for i, v in sorted(vbios.items(), key=_by_index)
            if not str(v).startswith(prefix)
        ]
        if wrong:
            return failed(
                f"VBIOS not of family {prefix}: {', '.join(wrong)}",
                Action.FIX_CONFIG,
                "flash the expected VBIOS",
            )
    model = names[0] if names else f"PCI device id {ids[0]}" if ids else "model unknown"
    unread = []
    for g in gpus:
        parts = [] if isinstance(g.get("name") or g.get("pci_device_id"), str) else ["model"]
        parts += [] if g.get("index") in vbios else ["VBIOS"]
        if parts:
            unread.append(f"gpu{g.get('index')} ({', '.join(parts)})")
    if unread:  # unknown is not uniform either; those GPUs' own checks say why
        family = f", VBIOS family {families[0]}" if families else ""
        return skipped(
            f"not compared: not read: {', '.join(unread)}; the GPUs read agree: {model}{family}"
        )
    return passed(f"{len(gpus)}x {model}, VBIOS family {families[0]}")


def _by_index(item: tuple[Any, Any]) -> int:
    return item[0] if isinstance(item[0], int) else -1


@CHECKS.node("persistence_mode", "driver", severity="normal", in_use=True)
def persistence_mode(node: NodeView) -> Result:
    """Persistence mode is on for every GPU (nvidia-persistenced running)."""
    gpus = _records(node)
    states = {g.get("index"): need(g, "persistence_mode", "persistence mode") for g in gpus}
    off = [f"gpu{i}" for i, on in sorted(states.items(), key=_by_index) if not on]
    if not off:
        return passed(f"persistence mode on for all {len(gpus)} GPUs")
    if not _limits(node).require_persistence_mode:
        return skipped(f"persistence mode off ({', '.join(off)}) and not required")
    return failed(
        f"persistence mode off on {', '.join(off)}",
        Action.FIX_CONFIG,
        "enable and start nvidia-persistenced (role nvidia_driver)",
    )


# ---------------------------------------------------------------- GPU checks

# NVML recovery action (nvmlGpuRecoveryAction_t, every value nvidia-ml-py names) -> (action
# code, advice). Unknown values drain: the driver wants something. The kernel-log checks judge
# XID 154's transitions by the same table.
RECOVERY = {
    1: (Action.RESET_GPU, "drain the node's jobs, then reset the GPU (nvidia-smi -r -i INDEX)"),
    2: (Action.REBOOT_NODE, "drain and reboot the node"),
    3: (
        Action.DRAIN,
        "drain peer-to-peer traffic (stop multi-GPU jobs), then reset the GPU",
    ),
    4: (Action.RESET_GPU, "drain the node, then reset the GPU; RMA if it recurs"),
    5: (
        Action.DRAIN,
        "drain the NVLink domain's jobs and recover the IMEX domain (restart nvidia-imex on "
        "its nodes); reset the GPU if that does not clear it",
    ),
    6: (Action.RESET_GPU, "drain the node, then reset the GPU's PCIe bus (or reboot)"),
    7: (Action.REBOOT_NODE, "drain and reboot the whole system (every tray of the node)"),
}
UNKNOWN_RECOVERY = (Action.DRAIN, "drain the node and ask NVIDIA support what it means")


@CHECKS.per(GPU, "recovery_action", "errors", in_use=True)
def recovery_action(node: NodeView, gpu: dict[str, Any]) -> Result:
    """NVML's GPU recovery action is NONE; anything else asks for a reset, reboot or drain."""
    value = need(
        gpu, "recovery_action", "GPU recovery action", _limits(node).require_recovery_action
    )
    if value == 0:
        return passed("recovery action NONE")
    name = recovery_action_name(value)
    action, advice = RECOVERY.get(value, UNKNOWN_RECOVERY)
    return failed(f"GPU recovery action is {name} ({value}), expected NONE", action, advice)


@CHECKS.per(GPU, "ecc_errors", "memory", in_use=True)
def ecc_errors(node: NodeView, gpu: dict[str, Any]) -> Result:
    """Volatile/aggregate uncorrectable ECC within limits (default 0), corrected below limits."""
    lim = _limits(node)
    ecc = need(gpu, "ecc", "ECC counters", lim.require_ecc)
    limits = {
        ("volatile", "uncorrected"): lim.max_ecc_uncorrected_volatile,
        ("volatile", "corrected"): lim.max_ecc_corrected_volatile,
        ("aggregate", "uncorrected"): lim.max_ecc_uncorrected_aggregate,
        ("aggregate", "corrected"): lim.max_ecc_corrected_aggregate,
    }
    problems, unknown, kinds = [], [], set()
    uncorrected = False
    for (scope, kind), limit in limits.items():
        if limit is None:
            continue
        group = ecc.get(scope)
        value = None if group is None else group.get(kind)
        # A total with an unknown part is unknown, but the parts known are its lower bound.
        floor = sum((group or {}).get(f"{part}_{kind}") or 0 for part in ("sram", "dram"))
        if value is None and floor > limit:
            problems.append(f"{scope} {kind} ECC errors at least {floor} > {limit}")
            uncorrected = uncorrected or kind == "uncorrected"
        elif value is None:  # a whole group can be null, its reason then on the ECC record
            where, key = (ecc, scope) if group is None else (group, kind)
            unknown.append(f"{scope} {kind} count unknown ({detail(where, key)})")
            kinds.add(reason(where, key)["kind"])
        elif value > limit:
            problems.append(f"{scope} {kind} ECC errors {value} > {limit}")
            uncorrected = uncorrected or kind == "uncorrected"
    if uncorrected:
        return failed(
            "; ".join(problems + unknown),
            Action.RESET_GPU,
            "drain the node and reset the GPU; if uncorrectable errors recur or rows cannot be "
            "remapped, RMA the GPU",
        )
    if problems:
        return failed(
            "; ".join(problems + unknown), Action.INSPECT, "watch the trend; RMA if it grows"
        )
    if unknown and (kinds == {"absent"} or (kinds == {"not_supported"} and not lim.require_ecc)):
        return skipped(f"not evaluated: {'; '.join(unknown)}")
    if unknown and kinds == {"not_supported"}:
        return failed(
            f"{'; '.join(unknown)}, but the profile requires ECC",
            Action.FIX_CONFIG,
            "update the driver, or set require_ecc to false",
        )
    if unknown:  # a count nobody could read is not a count of zero
        return failed(
            "; ".join(unknown),
            Action.RERUN,
            "re-run; if the counts stay unreadable, check the driver (nvidia-smi -q -d ECC)",
        )
    vol = ecc.get("volatile") or {}
    return passed(
        f"ECC ok (volatile uncorrected {vol.get('uncorrected')}, corrected {vol.get('corrected')})"
    )


@CHECKS.per(GPU, "retired_pages", "memory", in_use=True)
def retired_pages(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No page retirement pending, and retired pages below the RMA limit (pre-Ampere GPUs)."""
    pages = need(gpu, "retired_pages", "page retirement (GPUs before Ampere)")
    values = {key: pages.get(key) for key in ("single_bit", "double_bit", "pending")}
    total = sum(values[key] or 0 for key in ("single_bit", "double_bit"))
    if values["pending"]:
        return failed(
            f"page retirement pending ({total} pages retired)",
            Action.RESET_GPU,
            "drain and reset the GPU (or reboot) so the pages are retired",
        )
    limit = _limits(node).max_retired_pages
    if total > limit:
        return failed(f"{total} retired pages > {limit}", Action.RMA, "RMA the GPU")
    unknown = [key for key, value in values.items() if value is None]
    if unknown:  # an unknown count is not zero retired pages
        return failed(f"retired pages not reported: {', '.join(unknown)}", Action.RERUN)
    return passed(f"{total} retired pages, none pending")


@CHECKS.per(GPU, "row_remapping", "memory", in_use=True)
def row_remapping(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No row remapping pending and no remapping failure (Ampere and later)."""
    rows = need(gpu, "remapped_rows", "row remapping (Ampere and later)")
    if rows.get("failure"):
        return failed(
            f"row remapping failure occurred (uncorrectable rows {rows.get('uncorrectable')})",
            Action.RMA,
            "drain the node and RMA the GPU",
        )
    if rows.get("pending"):
        return failed(
            f"row remapping pending (uncorrectable rows {rows.get('uncorrectable')})",
            Action.RESET_GPU,
            "drain the node and reset the GPU to apply the remap",
        )
    if rows.get("pending") is None or rows.get("failure") is None:
        return failed("row remapping state not reported", Action.RERUN)
    return passed(
        f"no remap pending ({rows.get('correctable')} correctable, "
        f"{rows.get('uncorrectable')} uncorrectable rows remapped)"
    )


_COOLING = "check fans, airflow and inlet temperature; reseat the heatsink if only this GPU"


@CHECKS.per(GPU, "temperature", "thermal", in_use=False)
def temperature(node: NodeView, gpu: dict[str, Any]) -> Result:
    """Temperature below the profile's limits and clear of the GPU's own slowdown point."""
    lim = _limits(node)
    temp = need(gpu, "temperature_c", "GPU temperature")
    warn_c, fail_c, margin_needed = lim.temp_warn_c, lim.temp_fail_c, lim.min_slowdown_margin_c
    slowdown = gpu.get("temp_slowdown_c")
    if temp >= fail_c:
        return failed(f"temperature {temp} C >= limit {fail_c} C", Action.INSPECT, _COOLING)
    if slowdown is not None and slowdown - temp < margin_needed:
        return failed(
            f"temperature {temp} C is {slowdown - temp} C from the GPU's slowdown point "
            f"{slowdown} C (need >= {margin_needed} C)",
            Action.INSPECT,
            _COOLING,
        )
    if temp >= warn_c:
        return warned(f"temperature {temp} C >= warning level {warn_c} C", Action.INSPECT, _COOLING)
    if slowdown is None:
        # The headroom cannot be claimed without the slowdown point, unless the GPU has none.
        if reason(gpu, "temp_slowdown_c")["kind"] != "not_supported":
            return missing(gpu, "temp_slowdown_c", "the GPU's slowdown temperature")
        return passed(f"temperature {temp} C (limit {fail_c} C; this GPU has no slowdown point)")
    return passed(f"temperature {temp} C (limit {fail_c} C, slowdown at {slowdown} C)")


_HARD_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
_SOFT_REASONS = ("sw_power_cap", "sw_thermal_slowdown")


@CHECKS.per(GPU, "throttle", "thermal", in_use=True)
def throttle(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No hardware slowdown, thermal slowdown or power brake active (SW power cap warns)."""
    reasons = need(gpu, "clock_event_reasons", "clock event (throttle) reasons")
    active = reasons.get("active") or []
    unread = reasons.get("unavailable") or {}
    hard = [r for r in _HARD_REASONS if r in active]
    if hard:
        return failed(
            f"clock event reasons active: {', '.join(hard)}",
            Action.INSPECT,
            "hardware slowdown: check PSU/power brake signals and cooling; if it persists after "
            "a reboot, have the baseboard inspected",
        )
    # A reason with no reading is unknown: "not active" would be a claim without evidence.
    unknown = [r for r in _HARD_REASONS if r in unread]
    if unknown:
        return missing_any(reasons, unknown, f"clock event reason {', '.join(unknown)}")
    soft = [r for r in _SOFT_REASONS if r in active]
    if node.in_use:  # a software power cap or thermal slowdown is how a GPU runs under load
        shown = f" ({', '.join(soft)}: normal under load)" if soft else ""
        return passed(f"no hardware slowdown active on a GPU in use{shown}")
    if soft:
        return warned(
            f"clocks reduced by {', '.join(soft)}", Action.INSPECT, "check power caps and cooling"
        )
    unknown = [r for r in _SOFT_REASONS if r in unread]
    if unknown:
        return missing_any(reasons, unknown, f"clock event reason {', '.join(unknown)}")
    return passed(f"no slowdown active ({', '.join(active) or 'none'})")


@CHECKS.per(GPU, "power", "power", severity="normal", in_use=False)
def power(node: NodeView, gpu: dict[str, Any]) -> Result:
    """Power draw within the enforced limit, and the limit not capped below the SKU's."""
    lim = _limits(node)
    limit = need(gpu, "power_limit_w", "enforced power limit")
    draw = need(gpu, "power_draw_w", "power draw")
    over = lim.max_power_over_limit_pct
    if draw > limit * (1 + over / 100):
        return failed(
            f"power draw {draw:.0f} W above the enforced limit {limit:.0f} W (+{over}%)",
            Action.INSPECT,
            "check the power sensor and PSU; reset the GPU",
        )
    minimum = lim.min_power_limit_w
    if minimum is not None and limit < minimum:
        return failed(
            f"enforced power limit {limit:.0f} W below the SKU's {minimum:.0f} W",
            Action.FIX_CONFIG,
            "remove the power cap (nvidia-smi -pl) or check the baseboard power configuration",
        )
    return passed(f"power draw {draw:.0f} W of {limit:.0f} W")


_RESEAT = "reseat the GPU/riser and check the slot's BIOS settings"


def _load(gpu: dict[str, Any]) -> str | None:
    """Why the GPU counts as busy ("P0", "37 % utilisation"), "" when idle, None if unknown.

    A GPU drops its PCIe link speed below P0 to save power, also while a process merely holds
    memory on it; at P0 or under load the link must run at full speed.
    """
    pstate, utilization = gpu.get("performance_state"), gpu.get("utilization_gpu_pct")
    if utilization:
        return f"{utilization} % utilisation"
    if pstate == "P0":
        return "P0"
    if pstate is not None:
        return ""
    reasons = gpu.get("clock_event_reasons") or {}
    if "gpu_idle" in (reasons.get("active") or []):
        return ""
    return None


@CHECKS.per(GPU, "pcie_link", "pcie", in_use=True)
def pcie_link(node: NodeView, gpu: dict[str, Any]) -> Result:
    """PCIe link at the expected generation and width (down-training is reported)."""
    lim = _limits(node)
    link = need(gpu, "pcie", "PCIe link state")
    want_gen, want_width = lim.pcie_gen_expected, lim.pcie_width_expected
    gen, gen_max = link.get("gen_current"), link.get("gen_max")
    width, width_max = link.get("width_current"), link.get("width_max")
    # The width must be trained to the expected lanes, the generation only capable of the
    # expected speed: an idle GPU drops its link speed to save power.
    shortfalls = (
        ("width", width, want_width, f"x{width}, expected x{want_width} (max x{width_max})"),
        ("generation", gen_max, want_gen, f"capable of gen{gen_max}, expected gen{want_gen}"),
    )
    for what, value, wanted, shortfall in shortfalls:
        if wanted is None:
            continue
        if value is None:
            return failed(f"PCIe link {what} not reported", Action.RERUN)
        if value < wanted:
            return failed(f"PCIe link {shortfall}", Action.INSPECT, _RESEAT)
    if want_gen is None and want_width is None:
        if width is None or width_max is None:  # the trained width cannot be vouched for
            return failed(
                f"PCIe link width not reported (current x{width}, max x{width_max})",
                Action.RERUN,
            )
        if width < width_max:
            return warned(f"PCIe link x{width} of x{width_max}", Action.INSPECT, _RESEAT)
    if gen is None or gen_max is None:  # the pcie record holds no reasons: a failed read
        return failed(f"PCIe link generation not reported (gen{gen} of gen{gen_max})", Action.RERUN)
    if gen < gen_max:
        load = _load(gpu)
        if load is None:
            return passed(
                f"PCIe gen{gen} of gen{gen_max} x{width}; the GPU's load is unknown, so the "
                "link speed is not judged (an idle GPU lowers it)"
            )
        if load:
            return warned(
                f"PCIe link down-trained to gen{gen} of gen{gen_max} while busy ({load})",
                Action.INSPECT,
                _RESEAT,
            )
        return passed(f"PCIe gen{gen} (idle; gen{gen_max} capable) x{width}")
    return passed(f"PCIe gen{gen} x{width}")


@CHECKS.per(GPU, "nvlink", "nvlink", in_use=True)
def nvlink(node: NodeView, gpu: dict[str, Any]) -> Result:
    """The expected NVLink links are all up."""
    expected = _limits(node).nvlink_links_expected
    if expected == 0:
        return skipped(f"profile {node.limits.name} expects no NVLink")
    links = need(gpu, "nvlink", "NVLink state", required=bool(expected))
    up = [link.get("link") for link in links if link.get("up")]
    down = [link.get("link") for link in links if not link.get("up")]
    want = expected if expected is not None else len(links)
    if down or len(up) < want:
        detail = f"links down: {', '.join(map(str, down))}" if down else "links missing"
        return failed(
            f"{len(up)} of {want} NVLink links up ({detail})",
            Action.RESET_GPU,
            "check `nvidia-smi nvlink -s` and fabric manager; reset the GPU, then reboot; "
            "RMA the baseboard if links stay down",
        )
    return passed(f"{len(up)} NVLink links up")


@CHECKS.per(GPU, "idle_processes", "processes", severity="normal", in_use=False)
def idle_processes(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No stray compute processes and little GPU memory in use on an idle node.

    Where the probe waited for memory to be reclaimed, the processes still there after the
    wait are judged, and the memory itself is memory_reclaim's verdict (one fault, one failure).
    """
    lim = _limits(node)
    if not lim.expect_idle:
        return skipped("node is not expected to be idle (expect_idle: false)")
    reclaim = node.facts.get("memory_reclaim") or {}
    polled = [] if reclaim.get("skipped") else reclaim.get("gpus") or []
    waited = next(
        (r for r in polled if r.get("index") == gpu["index"] and r.get("processes") is not None),
        None,
    )
    procs = waited["processes"] if waited else need(gpu, "processes", "compute process list")
    kill = "find the owner (ps -p PID) and stop it before handing the node to a job"
    if procs:
        listed = ", ".join(
            f"pid {p.get('pid')} ({p.get('name') or '?'}, {p.get('used_memory_mib')} MiB)"
            for p in procs
        )
        return failed(f"stray compute processes: {listed}", Action.CHECK_APP, kill)
    if waited:
        return passed("idle: no compute process (memory: see memory_reclaim)")
    used = need(gpu, "memory_used_mib", "GPU memory in use")
    tolerance = lim.max_idle_memory_used_mib
    if used > tolerance:
        return failed(
            f"{used} MiB GPU memory in use on an idle GPU (tolerance {tolerance} MiB)",
            Action.CHECK_APP,
            kill,
        )
    return passed(f"idle: no compute process, {used} MiB in use")
