"""GPU checks: driver gate, GPU count and uniformity, and the per-GPU health of each GPU."""

from __future__ import annotations

from typing import Any

from packaging.version import InvalidVersion, Version

from gpuhealth.checks import FAIL, PASS, SKIP, WARN, NodeView, Result, StopCheck, check, need
from gpuhealth.probe.schema import recovery_action_name


def _need_driver(node: NodeView) -> dict[str, Any]:
    if node.no_nvidia and not node.expected_gpus:
        raise StopCheck(Result(SKIP, f"no NVIDIA GPU/driver on {node.host}"))
    return node.facts.get("driver") or {}


# ---------------------------------------------------------------- node checks


@check("driver_version", "node", "driver")
def driver_version(node: NodeView) -> Result:
    """The NVIDIA driver is loaded and at least the minimum branch (default r570)."""
    driver = _need_driver(node)
    minimum = node.limits["min_driver_version"]
    version = driver.get("version")
    if not driver.get("loaded"):
        pci = (node.facts.get("pci") or {}).get("nvidia_gpus") or []
        seen = f"{len(pci)} NVIDIA GPUs on the PCI bus but " if pci else ""
        return Result(
            FAIL,
            f"{seen}no NVIDIA driver loaded (expected >= {minimum})",
            "install the driver (site.yml, role nvidia_driver) and check `dmesg | grep NVRM`",
        )
    if not version:
        return need(driver, "version", "driver version")
    try:
        ok = Version(version) >= Version(minimum)
    except InvalidVersion:
        return Result(FAIL, f"driver version {version!r} cannot be compared with {minimum}")
    if ok:
        return Result(PASS, f"driver {version} >= {minimum}")
    return Result(
        FAIL,
        f"driver {version} is older than the required {minimum}",
        f"upgrade to branch {minimum.split('.')[0]} or newer (nvidia_driver_branch) and reboot",
    )


@check("gpu_count", "node", "inventory")
def gpu_count(node: NodeView) -> Result:
    """The node has exactly the number of GPUs the inventory/profile expects."""
    expected = node.expected_gpus
    found = len(node.facts.get("gpus") or [])
    if node.no_nvidia and not expected:
        return Result(SKIP, f"no NVIDIA GPU/driver on {node.host}")
    if expected is None:
        return Result(
            SKIP, f"found {found} GPUs; no expected count (set gpu_count or --expected-gpus)"
        )
    if found == expected:
        return Result(PASS, f"found {found} GPUs as expected")
    pci = (node.facts.get("pci") or {}).get("nvidia_gpus")
    bus = f"; {len(pci)} NVIDIA GPUs on the PCI bus" if pci is not None else ""
    return Result(
        FAIL,
        f"expected {expected} GPUs, found {found}{bus}",
        "check `nvidia-smi -L`, `lspci -d 10de:` and dmesg for Xid 79; reseat or RMA the missing "
        "GPU; if the bus shows them all, reload the driver or reboot",
    )


@check("gpu_uniformity", "node", "inventory", "normal")
def gpu_uniformity(node: NodeView) -> Result:
    """All GPUs of the node are the same model on the same VBIOS family (and profile prefix)."""
    gpus = node.facts.get("gpus") or []
    if not gpus:
        if node.no_nvidia and not node.expected_gpus:
            return Result(SKIP, f"no NVIDIA GPU/driver on {node.host}")
        return Result(SKIP, "no GPU records to compare (see gpu_count)")
    names = sorted({g.get("name") or "unknown" for g in gpus})
    if len(names) > 1:
        return Result(FAIL, f"mixed GPU models on one node: {', '.join(names)}", "fix the BOM")
    vbios = {g["index"]: g.get("vbios_version") for g in gpus}
    if any(v is None for v in vbios.values()):
        return Result(SKIP, "VBIOS version not reported")
    families = sorted({".".join(v.split(".")[:2]) for v in vbios.values()})
    prefix = node.limits["vbios_prefix"]
    if len(families) > 1:
        detail = ", ".join(f"gpu{i} {v}" for i, v in sorted(vbios.items()))
        return Result(
            FAIL, f"VBIOS families differ: {detail}", "flash all GPUs to the same VBIOS release"
        )
    if prefix:
        wrong = [f"gpu{i} {v}" for i, v in sorted(vbios.items()) if not v.startswith(prefix)]
        if wrong:
            return Result(
                FAIL,
                f"VBIOS not of family {prefix}: {', '.join(wrong)}",
                "flash the expected VBIOS",
            )
    return Result(PASS, f"{len(gpus)}x {names[0]}, VBIOS family {families[0]}")


@check("persistence_mode", "node", "driver", "normal")
def persistence_mode(node: NodeView) -> Result:
    """Persistence mode is on for every GPU (nvidia-persistenced running)."""
    gpus = node.facts.get("gpus") or []
    if not gpus:
        if node.no_nvidia and not node.expected_gpus:
            return Result(SKIP, f"no NVIDIA GPU/driver on {node.host}")
        return Result(SKIP, "no GPU records (see gpu_count)")
    required = node.limits["require_persistence_mode"]
    states = {g["index"]: need(g, "persistence_mode", "persistence mode") for g in gpus}
    off = [f"gpu{i}" for i, on in sorted(states.items()) if not on]
    if not off:
        return Result(PASS, f"persistence mode on for all {len(gpus)} GPUs")
    if not required:
        return Result(SKIP, f"persistence mode off ({', '.join(off)}) and not required")
    return Result(
        FAIL,
        f"persistence mode off on {', '.join(off)}",
        "enable and start nvidia-persistenced (role nvidia_driver)",
    )


# ---------------------------------------------------------------- GPU checks

_RECOVERY_ADVICE = {
    1: "drain the node's jobs, then reset the GPU (nvidia-smi -r -i INDEX)",
    2: "drain and reboot the node",
    3: "drain peer-to-peer traffic (stop multi-GPU jobs), then reset the GPU",
    4: "drain the node, then reset the GPU; RMA if it recurs",
}


@check("recovery_action", "gpu", "errors")
def recovery_action(node: NodeView, gpu: dict[str, Any]) -> Result:
    """NVML's GPU recovery action is NONE; anything else asks for a reset, reboot or drain."""
    value = need(
        gpu, "recovery_action", "GPU recovery action", node.limits["require_recovery_action"]
    )
    if value == 0:
        return Result(PASS, "recovery action NONE")
    name = recovery_action_name(value)
    advice = _RECOVERY_ADVICE.get(value, "drain the node and ask NVIDIA support what it means")
    return Result(FAIL, f"GPU recovery action is {name} ({value}), expected NONE", advice)


@check("ecc_errors", "gpu", "memory")
def ecc_errors(node: NodeView, gpu: dict[str, Any]) -> Result:
    """Volatile/aggregate uncorrectable ECC within limits (default 0), corrected below limits."""
    ecc = need(gpu, "ecc", "ECC counters", node.limits["require_ecc"])
    limits = node.limits
    problems = []
    action = None
    for scope in ("volatile", "aggregate"):
        counts = ecc.get(scope) or {}
        for kind, key in (
            ("uncorrected", "max_ecc_uncorrected"),
            ("corrected", "max_ecc_corrected"),
        ):
            limit = limits[f"{key}_{scope}"]
            value = counts.get(kind)
            if limit is None:
                continue
            if value is None:
                problems.append(f"{scope} {kind} count not reported")
                continue
            if value > limit:
                problems.append(f"{scope} {kind} ECC errors {value} > {limit}")
                if kind == "uncorrected":
                    action = (
                        "drain the node and reset the GPU; if uncorrectable errors recur or "
                        "rows cannot be remapped, RMA the GPU"
                    )
    if problems:
        return Result(FAIL, "; ".join(problems), action or "watch the trend; RMA if it grows")
    vol = ecc.get("volatile") or {}
    return Result(
        PASS,
        f"ECC ok (volatile uncorrected {vol.get('uncorrected')}, corrected {vol.get('corrected')})",
    )


@check("retired_pages", "gpu", "memory")
def retired_pages(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No page retirement pending, and retired pages below the RMA limit (pre-Ampere GPUs)."""
    pages = need(gpu, "retired_pages", "page retirement (GPUs before Ampere)")
    pending = pages.get("pending")
    total = (pages.get("single_bit") or 0) + (pages.get("double_bit") or 0)
    if pending:
        return Result(
            FAIL,
            f"page retirement pending ({total} pages retired)",
            "drain and reset the GPU (or reboot) so the pages are retired",
        )
    if pending is None:
        return Result(FAIL, "retired-pages pending state not reported")
    limit = node.limits["max_retired_pages"]
    if total > limit:
        return Result(FAIL, f"{total} retired pages > {limit}", "RMA the GPU")
    return Result(PASS, f"{total} retired pages, none pending")


@check("row_remapping", "gpu", "memory")
def row_remapping(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No row remapping pending and no remapping failure (Ampere and later)."""
    rows = need(gpu, "remapped_rows", "row remapping (Ampere and later)")
    if rows.get("failure"):
        return Result(
            FAIL,
            f"row remapping failure occurred (uncorrectable rows {rows.get('uncorrectable')})",
            "drain the node and RMA the GPU",
        )
    if rows.get("pending"):
        return Result(
            FAIL,
            f"row remapping pending (uncorrectable rows {rows.get('uncorrectable')})",
            "drain the node and reset the GPU to apply the remap",
        )
    if rows.get("pending") is None or rows.get("failure") is None:
        return Result(FAIL, "row remapping state not reported")
    return Result(
        PASS,
        f"no remap pending ({rows.get('correctable')} correctable, "
        f"{rows.get('uncorrectable')} uncorrectable rows remapped)",
    )


@check("temperature", "gpu", "thermal")
def temperature(node: NodeView, gpu: dict[str, Any]) -> Result:
    """Temperature below the profile's limits and clear of the GPU's own slowdown point."""
    temp = need(gpu, "temperature_c", "GPU temperature")
    warn_c, fail_c = node.limits["temp_warn_c"], node.limits["temp_fail_c"]
    margin_needed = node.limits["min_slowdown_margin_c"]
    slowdown = gpu.get("temp_slowdown_c")
    cooling = "check fans, airflow and inlet temperature; reseat the heatsink if only this GPU"
    if temp >= fail_c:
        return Result(FAIL, f"temperature {temp} C >= limit {fail_c} C", cooling)
    if slowdown is not None and slowdown - temp < margin_needed:
        return Result(
            FAIL,
            f"temperature {temp} C is {slowdown - temp} C from the GPU's slowdown point "
            f"{slowdown} C (need >= {margin_needed} C)",
            cooling,
        )
    if temp >= warn_c:
        return Result(WARN, f"temperature {temp} C >= warning level {warn_c} C", cooling)
    where = f", slowdown at {slowdown} C" if slowdown is not None else ""
    return Result(PASS, f"temperature {temp} C (limit {fail_c} C{where})")


_HARD_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
_SOFT_REASONS = ("sw_power_cap", "sw_thermal_slowdown")


@check("throttle", "gpu", "thermal")
def throttle(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No hardware slowdown, thermal slowdown or power brake active (SW power cap warns)."""
    reasons = need(gpu, "clock_event_reasons", "clock event (throttle) reasons")
    active = reasons.get("active") or []
    hard = [r for r in _HARD_REASONS if r in active]
    if hard:
        return Result(
            FAIL,
            f"clock event reasons active: {', '.join(hard)}",
            "hardware slowdown: check PSU/power brake signals and cooling; if it persists after "
            "a reboot, have the baseboard inspected",
        )
    soft = [r for r in _SOFT_REASONS if r in active]
    if soft:
        return Result(WARN, f"clocks reduced by {', '.join(soft)}", "check power caps and cooling")
    return Result(PASS, f"no slowdown active ({', '.join(active) or 'none'})")


@check("power", "gpu", "power", "normal")
def power(node: NodeView, gpu: dict[str, Any]) -> Result:
    """Power draw within the enforced limit, and the limit not capped below the SKU's."""
    limit = need(gpu, "power_limit_w", "enforced power limit")
    draw = need(gpu, "power_draw_w", "power draw")
    over = node.limits["max_power_over_limit_pct"]
    if draw > limit * (1 + over / 100):
        return Result(
            FAIL,
            f"power draw {draw:.0f} W above the enforced limit {limit:.0f} W (+{over}%)",
            "check the power sensor and PSU; reset the GPU",
        )
    minimum = node.limits["min_power_limit_w"]
    if minimum is not None and limit < minimum:
        return Result(
            FAIL,
            f"enforced power limit {limit:.0f} W below the SKU's {minimum:.0f} W",
            "remove the power cap (nvidia-smi -pl) or check the baseboard power configuration",
        )
    return Result(PASS, f"power draw {draw:.0f} W of {limit:.0f} W")


@check("pcie_link", "gpu", "pcie")
def pcie_link(node: NodeView, gpu: dict[str, Any]) -> Result:
    """PCIe link at the expected generation and width (down-training is reported)."""
    link = need(gpu, "pcie", "PCIe link state")
    want_gen, want_width = node.limits["pcie_gen_expected"], node.limits["pcie_width_expected"]
    gen, gen_max = link.get("gen_current"), link.get("gen_max")
    width, width_max = link.get("width_current"), link.get("width_max")
    reseat = "reseat the GPU/riser and check the slot's BIOS settings"
    if want_width is not None:
        if width is None:
            return Result(FAIL, "PCIe link width not reported")
        if width < want_width:
            return Result(
                FAIL, f"PCIe link x{width}, expected x{want_width} (max x{width_max})", reseat
            )
    if want_gen is not None:
        if gen_max is None:
            return Result(FAIL, "PCIe link generation not reported")
        if gen_max < want_gen:
            return Result(
                FAIL, f"PCIe link capable of gen{gen_max}, expected gen{want_gen}", reseat
            )
    if gen is not None and gen_max is not None and gen < gen_max:
        idle = "gpu_idle" in ((gpu.get("clock_event_reasons") or {}).get("active") or [])
        if not idle:
            return Result(
                WARN, f"PCIe link down-trained to gen{gen} of gen{gen_max} while busy", reseat
            )
        return Result(PASS, f"PCIe gen{gen} (idle; gen{gen_max} capable) x{width}")
    if want_gen is None and want_width is None and width is not None and width_max is not None:
        if width < width_max:
            return Result(WARN, f"PCIe link x{width} of x{width_max}", reseat)
    return Result(PASS, f"PCIe gen{gen} x{width}")


@check("nvlink", "gpu", "nvlink")
def nvlink(node: NodeView, gpu: dict[str, Any]) -> Result:
    """The expected NVLink links are all up."""
    expected = node.limits["nvlink_links_expected"]
    if expected == 0:
        return Result(SKIP, f"profile {node.limits.name} expects no NVLink")
    links = need(gpu, "nvlink", "NVLink state", required=bool(expected))
    up = [link["link"] for link in links if link.get("up")]
    down = [link["link"] for link in links if not link.get("up")]
    want = expected if expected is not None else len(links)
    if down or len(up) < want:
        detail = f"links down: {', '.join(map(str, down))}" if down else "links missing"
        return Result(
            FAIL,
            f"{len(up)} of {want} NVLink links up ({detail})",
            "check `nvidia-smi nvlink -s` and fabric manager; reset the GPU, then reboot; "
            "RMA the baseboard if links stay down",
        )
    return Result(PASS, f"{len(up)} NVLink links up")


@check("idle_processes", "gpu", "processes", "normal")
def idle_processes(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No stray compute processes and little GPU memory in use on an idle node.

    Where the probe waited for memory to be reclaimed, the processes still there after the
    wait are judged, and the memory itself is memory_reclaim's verdict (one fault, one failure).
    """
    if not node.limits["expect_idle"]:
        return Result(SKIP, "node is not expected to be idle (expect_idle: false)")
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
        return Result(FAIL, f"stray compute processes: {listed}", kill)
    if waited:
        return Result(PASS, "idle: no compute process (memory: see memory_reclaim)")
    used = need(gpu, "memory_used_mib", "GPU memory in use")
    tolerance = node.limits["max_idle_memory_used_mib"]
    if used > tolerance:
        return Result(
            FAIL, f"{used} MiB GPU memory in use on an idle GPU (tolerance {tolerance} MiB)", kill
        )
    return Result(PASS, f"idle: no compute process, {used} MiB in use")
