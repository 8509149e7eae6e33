"""`nvidia-smi -q -x` (DTD v11, v12, v13) -> facts fragment.

The fallback probe uses this when NVML cannot be loaded, and triage uses it on saved files.
The element names differ between DTD versions (thresholds became T.Limit offsets in v13,
power draw split into average/instant, ECC SRAM split into parity/SEC-DED, clocks "throttle"
became "event" reasons), so every field lists its candidate paths in order.

Stdlib only: shipped to GPU nodes inside the probe. Untrusted files are parsed by passing
defusedxml's `fromstring`.
"""

import re
from typing import Any, Callable, Dict, List, Optional, Tuple, Union
from xml.etree import ElementTree

from gpuhealth.families.gpu import parse_fabric
from gpuhealth.families.gpu.parse_smi import (
    PROBE_XML,
    RawGpu,
    Section,
    Unavailable,
    add_leaf,
    assemble,
    pick,
)
from gpuhealth.parsing import ParseError

# Canonical field -> paths below <gpu>, first present wins.
_FIELDS: Dict[str, Tuple[str, ...]] = {
    "name": ("product_name",),
    "uuid": ("uuid",),
    "serial": ("serial",),
    "pci_bus_id": ("pci/pci_bus_id",),
    "pci_device_id": ("pci/pci_device_id",),
    "architecture": ("product_architecture",),
    "vbios_version": ("vbios_version",),
    "persistence_mode": ("persistence_mode",),
    "memory_total": ("fb_memory_usage/total",),
    "memory_used": ("fb_memory_usage/used",),
    "temperature": ("temperature/gpu_temp",),
    "tlimit_margin": ("temperature/gpu_temp_tlimit",),
    "shutdown_abs": ("temperature/gpu_temp_max_threshold",),
    "slowdown_abs": ("temperature/gpu_temp_slow_threshold",),
    "max_operating_abs": ("temperature/gpu_temp_max_gpu_threshold",),
    "shutdown_offset": ("temperature/gpu_temp_max_tlimit_threshold",),
    "slowdown_offset": ("temperature/gpu_temp_slow_tlimit_threshold",),
    "max_operating_offset": ("temperature/gpu_temp_max_gpu_tlimit_threshold",),
    "ecc_mode": ("ecc_mode/current_ecc",),
    "power_draw": ("gpu_power_readings/power_draw", "power_readings/power_draw"),
    "power_draw_average": (
        "gpu_power_readings/average_power_draw",
        "power_readings/average_power_draw",
    ),
    "power_draw_instant": (
        "gpu_power_readings/instant_power_draw",
        "power_readings/instant_power_draw",
    ),
    "power_limit": (
        "gpu_power_readings/current_power_limit",
        "power_readings/current_power_limit",
        "power_readings/enforced_power_limit",
        "power_readings/power_limit",
    ),
    "performance_state": ("performance_state",),
    "utilization_gpu": ("utilization/gpu_util",),
    "pcie_gen_current": ("pci/pci_gpu_link_info/pcie_gen/current_link_gen",),
    "pcie_gen_max": ("pci/pci_gpu_link_info/pcie_gen/max_link_gen",),
    "pcie_width_current": ("pci/pci_gpu_link_info/link_widths/current_link_width",),
    "pcie_width_max": ("pci/pci_gpu_link_info/link_widths/max_link_width",),
    "replay_count": ("pci/replay_counter",),
    "recovery_action": ("gpu_recovery_action",),
}


# nvidia-smi nests at most 5 levels below <gpu>; deeper is not its output (and the walk below
# must not recurse without bound).
_MAX_DEPTH = 32


def _leaves(
    elem: ElementTree.Element,
    prefix: str = "",
    depth: int = 0,
    out: Optional[Dict[str, str]] = None,
) -> Dict[str, str]:
    """{"a/b": text} for every leaf below elem; the first of repeated paths wins."""
    if depth > _MAX_DEPTH:
        raise ParseError(f"<{elem.tag}> is nested more than {_MAX_DEPTH} levels deep")
    out = {} if out is None else out
    for child in elem:
        path = f"{prefix}{child.tag}"
        if len(child):
            _leaves(child, f"{path}/", depth + 1, out)
        else:
            add_leaf(out, path, (child.text or "").strip())
    return out


def _section(gpu: ElementTree.Element, *tags: str) -> Optional[Section]:
    for tag in tags:
        elem = gpu.find(tag)
        if elem is not None:
            return _leaves(elem) if len(elem) else (elem.text or "").strip()
    return None


def _clock_reasons(gpu: ElementTree.Element) -> Optional[Union[List[Tuple[str, str]], str]]:
    for tag in ("clocks_event_reasons", "clocks_throttle_reasons"):
        elem = gpu.find(tag)
        if elem is not None:
            if not len(elem):
                return (elem.text or "").strip()
            return [(child.tag, (child.text or "").strip()) for child in elem if not len(child)]
    return None


def _processes(gpu: ElementTree.Element) -> Optional[Union[List[Dict[str, str]], str]]:
    elem = gpu.find("processes")
    if elem is None:
        return None
    infos = elem.findall("process_info")
    if not infos:
        return (elem.text or "").strip()
    procs = []
    for info in infos:
        leaves = _leaves(info)
        procs.append(
            {
                "pid": leaves.get("pid", ""),
                "type": leaves.get("type", ""),
                "name": leaves.get("process_name", "N/A"),
                "used_memory": leaves.get("used_memory", "N/A"),
            }
        )
    return procs


def _raw_gpu(gpu: ElementTree.Element) -> RawGpu:
    leaves = _leaves(gpu)
    fields = pick(leaves, _FIELDS)
    if "pci_bus_id" not in fields and gpu.get("id"):
        fields["pci_bus_id"] = gpu.get("id", "")
    ecc, retired, remapped = (
        _section(gpu, "ecc_errors"),
        _section(gpu, "retired_pages"),
        _section(gpu, "remapped_rows"),
    )
    return RawGpu(fields, ecc, retired, remapped, _clock_reasons(gpu), _processes(gpu))


def _line_of(text: str, needle: str) -> int:
    pos = text.find(needle)
    return text.count("\n", 0, pos) + 1 if pos >= 0 else 1


def parse(
    text: str, *, fromstring: Callable[[str], ElementTree.Element] = ElementTree.fromstring
) -> Dict[str, Any]:
    """Facts fragment (driver, gpu_count, gpus, errors) from `nvidia-smi -q -x` output.

    Raises ParseError, naming the position, when the text is not nvidia-smi XML at all.
    """
    if not text.strip():
        raise ParseError("line 1: empty input, expected nvidia-smi -q -x XML")
    try:
        root = fromstring(text)
    except ElementTree.ParseError as exc:
        line, column = exc.position
        raise ParseError(f"line {line}, column {column}: not well-formed XML: {exc}") from exc
    except ValueError as exc:  # defusedxml refusals (entities, external references)
        raise ParseError(f"line 1: XML refused: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        line = _line_of(text, f"<{root.tag}")
        raise ParseError(
            f"line {line}: root element <{root.tag}> is not <nvidia_smi_log>; "
            "not nvidia-smi -q -x output"
        )

    def top(tag: str) -> Optional[str]:
        elem = root.find(tag)
        return None if elem is None else (elem.text or "").strip()

    dtd = re.search(r"nvsmi_device_(v\d+)\.dtd", text[:500])
    missing = Unavailable(
        "absent", "not in nvidia-smi -q -x output" + (f" (DTD {dtd.group(1)})" if dtd else "")
    )
    elems = root.findall("gpu")
    raws = [_raw_gpu(elem) for elem in elems]
    versions = (top("driver_version"), top("cuda_version"), top("attached_gpus"))
    doc = assemble(PROBE_XML, raws, versions, missing)
    blocks = [_section(elem, "fabric") for elem in elems]
    parse_fabric.attach(doc["gpus"], blocks, doc["gpu_count"], missing)
    return doc
