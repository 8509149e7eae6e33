"""The NVLink fabric family's node side: each GPU's registration with its NVLink fabric (state,
status, clique, cluster UUID, health), into the GPU record's `fabric`.

It builds on the GPU family (NEEDS): its read of a GPU (GPU_READS) runs in that family's NVML
pass, over its session and the GPU's handle, right after the GPU's other NVLink reads, so a
hung driver costs the GPUs read before it nothing and the node one nvmlInit. Where the GPU
family read nvidia-smi instead, the `Fabric` block of its `-q -x` output is already in each
record (families/gpu/parse_fabric reads both). Every call has the NVML call timeout; a failing
call nulls only the GPU's fabric, with the reason.

Node side: Python 3.6 and the standard library (plus nvidia-ml-py when importable).
"""

import ctypes
import re
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from gpuhealth.families.gpu import parse_fabric
from gpuhealth.families.gpu.nvml import (
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    GpuRead,
    call_label,
    newest,
)
from gpuhealth.families.nvfabric import schema
from gpuhealth.probe.nvml import (
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_SUCCESS,
    Session,
    Unavailable,
)
from gpuhealth.schema import written

if TYPE_CHECKING:
    from gpuhealth.probe.main import Context

SECTIONS = written(schema.SECTIONS)
# nvmlDeviceGetGpuFabricInfoV structs, newest first: v3 adds the health summary to v2's mask.
_FABRIC_STRUCTS = (("v3", "c_nvmlGpuFabricInfo_v3_t"), ("v2", "c_nvmlGpuFabricInfo_v2_t"))


class _FabricReader:
    """Reads one GPU's fabric record into the GPU family's record of it."""

    def __init__(self, session: Session, gpu: Dict[str, Any], handle: Any) -> None:
        self.s, self.gpu, self.index, self.handle = session, gpu, gpu["index"], handle

    def at(self, name: str, *extra: str) -> str:
        return call_label(self.index, name, *extra)

    def read(self) -> None:
        """The GPU's NVLink fabric: nvmlDeviceGetGpuFabricInfoV with the newest struct both
        the bindings and the driver know, else the deprecated nvmlDeviceGetGpuFabricInfo
        (no health) where the driver or the bindings lack the V call."""
        nv = self.s.nv
        structs = [(name, getattr(nv, cls)) for name, cls in _FABRIC_STRUCTS if hasattr(nv, cls)]
        lacking = Unavailable(
            "not_supported",
            self.at("nvmlDeviceGetGpuFabricInfoV"),
            "no nvmlGpuFabricInfo v2/v3 struct in the installed nvidia-ml-py",
        )
        try:
            name, info, refused = newest(
                self.s, self.at, "nvmlDeviceGetGpuFabricInfoV", self.handle, structs, lacking
            )
        except Unavailable as why:
            older_call = (NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_FUNCTION_NOT_FOUND)
            if why.code in older_call or (why.code is None and why.kind == "not_supported"):
                self._deprecated(why)  # no struct or V call the driver and bindings share
            else:
                self.s.note(self.gpu, "fabric", why)
            return
        label = self.at("nvmlDeviceGetGpuFabricInfoV", name)
        summary = info.healthSummary if name == "v3" else None
        older = f"the driver refused {refused[0]}" if refused else "no newer one in nvidia-ml-py"
        why_not = f"{label}: the {name} struct has no health summary ({older})"
        self._store(info, label, info.healthMask, summary, why_not)

    def _deprecated(self, lacking: Unavailable) -> None:
        """nvmlDeviceGetGpuFabricInfo: state, status, clique and cluster, no health."""
        label = self.at("nvmlDeviceGetGpuFabricInfo")
        struct = getattr(self.s.nv, "c_nvmlGpuFabricInfo_t", None)
        if struct is None:
            self.s.note(self.gpu, "fabric", lacking)
            return
        info = struct()
        try:
            self.s.call(label, "nvmlDeviceGetGpuFabricInfo", self.handle, ctypes.byref(info))
        except Unavailable as why:
            if why.kind == "not_supported" and why.code != NVML_ERROR_NOT_SUPPORTED:
                why = Unavailable(why.kind, why.call, f"{why.error}; {lacking.detail}", why.code)
            self.s.note(self.gpu, "fabric", why)  # neither call there: say why for both
            return
        no_health = f"{label} reports no health ({lacking.detail})"
        self._store(info, label, None, None, no_health)

    def _store(
        self, info: Any, label: str, mask: Optional[int], summary: Optional[int], why_not: str
    ) -> None:
        if info.state == parse_fabric.STATE_NOT_SUPPORTED:
            why = Unavailable(
                "not_supported", label, "fabric state NOT_SUPPORTED (no NVLink fabric)"
            )
            self.s.note(self.gpu, "fabric", why)
            return
        health = parse_fabric.decode_health(mask, summary, label, why_not)
        self.gpu["fabric"] = parse_fabric.from_nvml(
            info.state, self._status(info.status), info.cliqueId, list(info.clusterUuid), health
        )

    def _status(self, code: int) -> str:
        """The fabric status (an nvmlReturn_t) in nvidia-smi's words: "Success",
        "Insufficient Resources" (from pynvml's NVMLError_InsufficientResources)."""
        if code == NVML_SUCCESS:
            return "Success"
        name = type(self.s.nv.NVMLError(code)).__name__.partition("_")[2]
        return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name) or f"NVML error {code}"


def read_fabric(session: Session, gpu: Dict[str, Any], handle: Any) -> None:
    """One GPU's `fabric`, in the GPU family's NVML pass."""
    _FabricReader(session, gpu, handle).read()


GPU_READS: Tuple[GpuRead, ...] = (read_fabric,)


def collect(ctx: "Context") -> Dict[str, Any]:
    """No section of its own: its NVML reads are made in the GPU family's pass (GPU_READS)."""
    return {}
