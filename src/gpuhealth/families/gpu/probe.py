"""The GPU family's node side: the driver and every GPU, from the best source there is.

Order of sources: NVML (through nvidia-ml-py), then `nvidia-smi -q -x` (plus `nvidia-smi nvlink
--status`), then what /proc says without a usable driver. A failing source is recorded in
`errors` and the next one is tried. The caller's `gpu_source: nvidia-smi` starts at nvidia-smi,
so one node can give the documents of both paths (`gpuhealth bundle` compares them). Node
side: Python 3.6 and the standard library.
"""

from typing import TYPE_CHECKING, Any, Dict, List, Optional

from gpuhealth.facts import mark_unavailable
from gpuhealth.families.gpu import nvml, parse_nvlink, parse_smi_xml, schema
from gpuhealth.families.gpu.schema import new_driver
from gpuhealth.parsing import ParseError
from gpuhealth.probe import command, node
from gpuhealth.schema import written

if TYPE_CHECKING:
    from gpuhealth.probe.main import Context

SECTIONS = written(schema.SECTIONS)
GPU_SOURCES = ("auto", "nvidia-smi")  # what a caller may ask for (the probe's `gpu_source`)


def _from_nvidia_smi(timeout_s: float, errors: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    result = command.run(["nvidia-smi", "-q", "-x"], timeout_s)
    failure = result.failure()
    if failure:
        errors.append({"probe": "nvidia-smi", "error": failure[:500]})
        return None
    try:
        parsed = parse_smi_xml.parse(result.stdout)
    except ParseError as exc:
        errors.append({"probe": "nvidia-smi", "error": f"unparsable -q -x output: {exc}"})
        return None
    errors.extend(parsed.pop("errors", []))
    _add_nvlink(parsed["gpus"], timeout_s, errors)
    return parsed


def _add_nvlink(gpus: List[Dict[str, Any]], timeout_s: float, errors: List[Dict[str, Any]]) -> None:
    """NVLink states from `nvidia-smi nvlink --status`, which `-q -x` leaves out."""
    result = command.run(["nvidia-smi", "nvlink", "--status"], timeout_s)
    links: Optional[Dict[int, List[Dict[str, Any]]]] = None
    failure = result.failure()
    if failure is None:
        try:
            links = parse_nvlink.parse_status(result.stdout)
        except ParseError as exc:
            failure = str(exc)
    if failure is not None:
        errors.append({"probe": "nvidia-smi", "call": "nvlink --status", "error": failure})
    for gpu in gpus:
        gpu["unavailable"].pop("nvlink", None)
        if links is None:
            detail = f"nvidia-smi nvlink --status: {failure}"
            mark_unavailable(gpu, "nvlink", "error", detail)
        elif links.get(gpu["index"]):
            gpu["nvlink"] = links[gpu["index"]]
        else:
            mark_unavailable(gpu, "nvlink", "not_supported", "nvidia-smi nvlink lists no links")


def _from_proc(root: str, errors: List[Dict[str, Any]]) -> Dict[str, Any]:
    """No NVML, no nvidia-smi: whether a driver is loaded at all, from /proc."""
    version = node.proc_driver_version(root)
    driver = new_driver(version is not None)
    detail = "; ".join(e["error"] for e in errors if e.get("error")) or "no NVIDIA driver"
    if version:
        driver["version"] = version
    else:
        mark_unavailable(driver, "version", "error" if version is not None else "absent", detail)
    for key in ("cuda_driver_version", "nvml_version"):
        mark_unavailable(driver, key, "absent", detail)
    return {"source": "none", "driver": driver, "gpu_count": None, "gpus": []}


def collect(ctx: "Context") -> Dict[str, Any]:
    """The `source`, `driver`, `gpu_count` and `gpus` parts of the facts document."""
    if ctx.gpu_source not in GPU_SOURCES:
        ctx.error("gpu", f"unknown gpu_source {ctx.gpu_source!r} (known: {GPU_SOURCES}); auto")
    if ctx.gpu_source != "nvidia-smi":
        gathered = nvml.collect(
            float(ctx.setting("nvml_call_timeout_s")),
            ctx.errors,
            float(ctx.setting("nvlink_error_window_s")),
            ctx.gpu_reads,  # the families that build on this one read each GPU in its pass
        )
        if gathered is not None:
            return dict(gathered, source="nvml")
    gathered = _from_nvidia_smi(float(ctx.setting("nvidia_smi_timeout_s")), ctx.errors)
    if gathered is not None:
        return dict(gathered, source="nvidia-smi")
    return _from_proc(ctx.root, ctx.errors)
