"""The probe's entry point: gather everything about one node into one facts document.

Order of sources: NVML (through nvidia-ml-py), then `nvidia-smi -q -x`, then what /proc and
/sys say without a driver. A failing source is recorded in `errors` and the next one is tried;
the probe itself never fails.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from gpuhealth.parsers import ParseError, nvidia_smi_nvlink, nvidia_smi_xml
from gpuhealth.probe import command, fabric, host, kernel_log, nvml, reclaim, storage, system
from gpuhealth.probe import dcgm as dcgm_probe
from gpuhealth.probe import gpud as gpud_probe
from gpuhealth.probe.schema import PROBE_VERSION, SCHEMA_VERSION, mark_unavailable

DEFAULT_CONFIG: dict[str, Any] = {
    "root": "/",
    "nvml_call_timeout_s": 5.0,
    "nvidia_smi_timeout_s": 60.0,
    # The host's expected state (profile + inventory), for sub-probes that need to know what
    # to look at, such as storage paths.
    "expect": {},
}

# Sub-probes run after the GPU part, each filling one top-level key of the document:
# (key, collect(config, errors) -> dict). A sub-probe records its own failures in `errors`;
# an exception escaping one is recorded here and the next one still runs.
SUBPROBES: list[tuple[str, Callable[[dict[str, Any], list[dict[str, Any]]], Any]]] = []
SUBPROBES.append(("system", host.collect))
SUBPROBES.append(("storage", storage.collect))
SUBPROBES.append(("fabric", fabric.collect))
SUBPROBES.append(("kernel_log", kernel_log.collect))
SUBPROBES.append(("fabric_manager", kernel_log.collect_fabric_manager))
SUBPROBES.append(("memory_reclaim", reclaim.collect))
SUBPROBES.append(("dcgm_health", dcgm_probe.collect))
SUBPROBES.append(("gpud", gpud_probe.collect_states))
SUBPROBES.append(("gpud_events", gpud_probe.collect_events))


def _from_nvidia_smi(timeout_s: float, errors: list[dict[str, Any]]) -> dict[str, Any] | None:
    result = command.run(["nvidia-smi", "-q", "-x"], timeout_s)
    if result.error or result.rc != 0:
        detail = (
            result.error or f"exit {result.rc}: {result.stderr.strip() or result.stdout.strip()}"
        )
        errors.append({"probe": "nvidia-smi", "error": detail[:500]})
        return None
    try:
        parsed = nvidia_smi_xml.parse(result.stdout)
    except ParseError as exc:
        errors.append({"probe": "nvidia-smi", "error": f"unparsable -q -x output: {exc}"})
        return None
    errors.extend(parsed.pop("errors", []))
    _add_nvlink(parsed["gpus"], timeout_s, errors)
    return parsed


def _add_nvlink(gpus: list[dict[str, Any]], timeout_s: float, errors: list[dict[str, Any]]) -> None:
    """NVLink states from `nvidia-smi nvlink --status`, which `-q -x` leaves out."""
    result = command.run(["nvidia-smi", "nvlink", "--status"], timeout_s)
    links: dict[int, list[dict[str, Any]]] | None = None
    failure = result.error or (f"exit {result.rc}" if result.rc != 0 else None)
    if failure is None:
        try:
            links = nvidia_smi_nvlink.parse_status(result.stdout)
        except ParseError as exc:
            failure = str(exc)
    if failure is not None:
        errors.append({"probe": "nvidia-smi", "call": "nvlink --status", "error": failure})
    for gpu in gpus:
        gpu["unavailable"].pop("nvlink", None)
        if links is None:
            mark_unavailable(gpu, "nvlink", "error", f"nvidia-smi nvlink --status: {failure}")
        elif links.get(gpu["index"]):
            gpu["nvlink"] = links[gpu["index"]]
        else:
            mark_unavailable(gpu, "nvlink", "not_supported", "nvidia-smi nvlink lists no links")


def collect(config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build the facts document for the node this runs on."""
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    root = cfg["root"]
    started = time.monotonic()
    errors: list[dict[str, Any]] = []
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "probe_version": PROBE_VERSION,
        "source": "none",
        "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_s": None,
        "host": system.host_info(root),
        "errors": errors,
        "driver": None,
        "pci": {"nvidia_gpus": system.nvidia_pci_gpus(root)},
        "gpu_count": None,
        "gpus": [],
    }
    gathered = nvml.collect(float(cfg["nvml_call_timeout_s"]), errors)
    if gathered is not None:
        doc["source"] = "nvml"
    else:
        gathered = _from_nvidia_smi(float(cfg["nvidia_smi_timeout_s"]), errors)
        if gathered is not None:
            doc["source"] = "nvidia-smi"
    if gathered is not None:
        doc.update(gathered)
    else:
        version = system.proc_driver_version(root)
        doc["driver"] = {
            "loaded": version is not None,
            "version": version or None,
            "cuda_driver_version": None,
            "nvml_version": None,
            "unavailable": {
                "version": {
                    "kind": "error" if version is not None else "absent",
                    "detail": "; ".join(e["error"] for e in errors) or "no NVIDIA driver",
                }
            },
        }
    for key, subprobe in SUBPROBES:
        try:
            doc[key] = subprobe(cfg, errors)
        except Exception as exc:  # a bug in one sub-probe must not cost the others
            errors.append({"probe": key, "error": f"{type(exc).__name__}: {exc}"})
            doc[key] = None
    doc["duration_s"] = round(time.monotonic() - started, 3)
    return doc


def main(config: dict[str, Any] | None = None) -> None:
    """Print the facts document as one JSON line."""
    sys.stdout.write(json.dumps(collect(config), sort_keys=True) + "\n")
    sys.stdout.flush()
