"""A GPU's NVLink fabric (NVML's GPU fabric info, nvidia-smi's `Fabric` block) -> the GPU
record's `fabric`.

HGX boards (H100, B200) register their GPUs with the board's NVSwitches; GB200/GB300 NVL racks
join the GPUs of every tray into one NVLink domain. NVML reports the registration (state and
status), the domain (clique id, cluster UUID) and, with Blackwell drivers, a health summary
and a bitmask of health conditions; nvidia-smi prints the same values as words. Both become
one record here, so a live probe and a pasted log are judged alike. A value the source does
not give is null with the reason, never a healthy default: "N/A" is not "False".

Stdlib only: shipped to GPU nodes inside the probe.
"""

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from gpuhealth.facts import mark_unavailable
from gpuhealth.families.gpu.parse_smi import (
    Unavailable,
    convert,
    missing_reason,
    norm,
    to_bool,
    to_count,
)

FABRIC_KEYS = ("state", "status", "clique_id", "cluster_uuid", "health")
HEALTH_KEYS = (
    "summary",
    "bandwidth",
    "route_recovery_in_progress",
    "route_unhealthy",
    "access_timeout_recovery",
    "incorrect_configuration",
)

# The values below are nvidia-ml-py 13.615.71's (pynvml.py), spelled out so the parsers need
# no pynvml and older bindings that lack the names decode alike.
# NVML_GPU_FABRIC_STATE_*: NOT_SUPPORTED 0 means the GPU has no fabric at all.
STATE_NOT_SUPPORTED = 0
STATES = {1: "Not Started", 2: "In Progress", 3: "Completed"}
# NVML_GPU_FABRIC_HEALTH_SUMMARY_* (0 NOT_SUPPORTED).
SUMMARIES = {1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}
# The 2-bit conditions of the health mask: key -> NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*; each
# field is 0 NOT_SUPPORTED, 1 TRUE (the condition holds), 2 FALSE (WIDTH_* 0x3).
CONDITION_SHIFTS = {
    "bandwidth": 0,  # DEGRADED_BW: TRUE is degraded bandwidth
    "route_recovery_in_progress": 2,  # ROUTE_RECOVERY
    "route_unhealthy": 4,  # ROUTE_UNHEALTHY
    "access_timeout_recovery": 6,  # ACCESS_TIMEOUT_RECOVERY
}
CONDITION_WIDTH = 0x3
MASK_NOT_SUPPORTED, MASK_TRUE, MASK_FALSE = 0, 1, 2
# NVML_GPU_FABRIC_HEALTH_MASK_{SHIFT,WIDTH}_INCORRECT_CONFIGURATION and its values (0
# NOT_SUPPORTED), named as nvidia-smi's words would be.
INCORRECT_CONFIGURATION_SHIFT, INCORRECT_CONFIGURATION_WIDTH = 8, 0xF
INCORRECT_CONFIGURATIONS = {
    1: "None",
    2: "Incorrect SysGUID",
    3: "Incorrect Chassis SN",
    4: "No Partition",
    5: "Insufficient NVLinks",
    6: "Incompatible GPU Firmware",
    7: "Invalid Location",
    8: "GPU State Invalid",
}
ZERO_UUID = "00000000-0000-0000-0000-000000000000"

_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
# nvidia-smi's words (normalised) -> the facts spelling; other words are kept as printed.
_WORDS = {
    "state": {"completed": "Completed", "inprogress": "In Progress", "notstarted": "Not Started"},
    "status": {"success": "Success"},
    "summary": {
        "healthy": "Healthy",
        "unhealthy": "Unhealthy",
        "limitedcapacity": "Limited Capacity",
    },
    "bandwidth": {"full": "Full", "degraded": "Degraded"},
    "incorrect_configuration": {"none": "None"},
}
# Labels of the printed block (normalised "section/label", XML tag or text label) -> key.
_PRINTED = {
    "state": "state",
    "status": "status",
    "cliqueid": "clique_id",
    "clusteruuid": "cluster_uuid",
    "health": "health",
    "health/summary": "summary",
    "health/bandwidth": "bandwidth",
    "health/routerecoveryinprogress": "route_recovery_in_progress",
    "health/routeunhealthy": "route_unhealthy",
    "health/accesstimeoutrecovery": "access_timeout_recovery",
    "health/incorrectconfiguration": "incorrect_configuration",
}
# The Health lines by their own label: no other line of the block has these labels, so one
# whose "Health" title a paste lost (it then sits under the line above) is still read.
_HEALTH_LABELS = {
    label.partition("/")[2]: key for label, key in _PRINTED.items() if label.startswith("health/")
}
_FLAGS = ("route_recovery_in_progress", "route_unhealthy", "access_timeout_recovery")

Reason = Tuple[str, str]  # (unavailable kind, detail)


def uuid_text(raw: Sequence[int]) -> str:
    """NVML's 16 UUID bytes as nvidia-smi prints them (8-4-4-4-12 hex, lower case)."""
    data = bytes(raw)
    if len(data) != 16:
        raise ValueError(f"cluster UUID of {len(data)} bytes")
    hexed = data.hex()
    return "-".join((hexed[:8], hexed[8:12], hexed[12:16], hexed[16:20], hexed[20:]))


def _word(key: str, text: str) -> str:
    """A printed word in the facts spelling; an unknown word is kept as printed (and, not
    being the healthy word, judged as a fault)."""
    if not text:
        raise ValueError(text)
    return _WORDS[key].get(norm(text), text)


def _uuid(text: str) -> str:
    if not _UUID.match(text):
        raise ValueError(text)
    return text.lower()


_CONVERTERS = {
    "state": lambda text: _word("state", text),
    "status": lambda text: _word("status", text),
    "clique_id": to_count,
    "cluster_uuid": _uuid,
    "summary": lambda text: _word("summary", text),
    "bandwidth": lambda text: _word("bandwidth", text),
    "route_recovery_in_progress": to_bool,
    "route_unhealthy": to_bool,
    "access_timeout_recovery": to_bool,
    "incorrect_configuration": lambda text: _word("incorrect_configuration", text),
}


def _empty(keys: Tuple[str, ...]) -> Dict[str, Any]:
    """A record with its keys in order, each to be set or explained, and `unavailable` last."""
    record: Dict[str, Any] = dict.fromkeys(keys)
    record["unavailable"] = {}
    return record


def _settle_health(fabric: Dict[str, Any], health: Dict[str, Any]) -> None:
    """fabric["health"] = health, or null with the one reason when no part has a value and all
    parts are unknown for the same kind of reason (Hopper: every field N/A)."""
    missing = health.get("unavailable", {})
    kinds = {entry["kind"] for entry in missing.values()}
    if len(missing) == len(HEALTH_KEYS) and len(kinds) == 1:
        details: List[str] = []
        for entry in missing.values():
            if entry["detail"] not in details:
                details.append(entry["detail"])
        mark_unavailable(fabric, "health", kinds.pop(), "; ".join(details))
    else:
        fabric["health"] = health


def from_printed(
    block: Optional[Union[Dict[str, str], str]], missing: Reason
) -> Tuple[Optional[Dict[str, Any]], Optional[Reason]]:
    """(record, None) from nvidia-smi's `Fabric` block, or (None, reason) when the GPU has no
    fabric (`State : N/A`) or the block is absent (`missing`).

    `block` maps the block's "label" or "Health/label" (XML tags or text labels, as printed)
    to their raw values; a block printed as one word ("N/A") is that string.
    """
    if block is None:
        return None, missing
    if isinstance(block, str):
        value, reason = convert(block, str)
        return None, reason or ("error", f"nvidia-smi printed {value!r} for the Fabric block")
    raw: Dict[str, str] = {}
    for path, value in block.items():
        parts = [norm(part) for part in path.split("/")]
        key = _PRINTED.get("/".join(parts)) or _HEALTH_LABELS.get(parts[-1])
        if key is not None:
            raw.setdefault(key, value)
    state_raw = raw.get("state")
    if state_raw is not None:
        _, state_why = convert(state_raw, _CONVERTERS["state"])
        if state_why is not None and state_why.kind == "not_supported":
            return None, (state_why.kind, f"{state_why.detail} (no NVLink fabric on this GPU)")
    fabric, health = _empty(FABRIC_KEYS), _empty(HEALTH_KEYS)
    for key in FABRIC_KEYS[:-1] + HEALTH_KEYS:
        target = health if key in HEALTH_KEYS else fabric
        value, why = _read(raw, key, missing)
        if why is not None:
            mark_unavailable(target, key, why[0], why[1])
        else:
            target[key] = value
    whole = raw.get("health")
    if whole is not None and not any(key in raw for key in HEALTH_KEYS):
        _, whole_why = convert(whole, str)  # `Health : N/A`, the block printed as one word
        if whole_why is not None:
            mark_unavailable(fabric, "health", whole_why.kind, whole_why.detail)
            return fabric, None
    _settle_health(fabric, health)
    return fabric, None


def _read(raw: Dict[str, str], key: str, missing: Reason) -> Tuple[Any, Optional[Reason]]:
    text = raw.get(key)
    if text is None:
        return None, missing
    value, why = convert(text, _CONVERTERS[key])
    return value, None if why is None else (why.kind, why.detail)


def _condition(mask: int, key: str, call: str) -> Tuple[Any, Optional[Reason]]:
    """One 2-bit condition of the health mask: True when it holds, False when it does not."""
    value = (mask >> CONDITION_SHIFTS[key]) & CONDITION_WIDTH
    if value == MASK_NOT_SUPPORTED:
        return None, ("not_supported", f"{call}: health mask 0x{mask:x} does not report it")
    if value not in (MASK_TRUE, MASK_FALSE):
        return None, ("error", f"{call}: health mask 0x{mask:x} has the undefined value {value}")
    holds = value == MASK_TRUE
    if key == "bandwidth":
        return ("Degraded" if holds else "Full"), None
    return holds, None


def decode_health(mask: Optional[int], summary: Optional[int], call: str, why_not: str) -> Any:
    """The health part from NVML's healthMask and healthSummary; either is None when the
    struct the driver filled has no such member (`why_not` says which call and why)."""
    health = _empty(HEALTH_KEYS)
    if summary is None:
        mark_unavailable(health, "summary", "not_supported", why_not)
    elif summary in SUMMARIES:
        health["summary"] = SUMMARIES[summary]
    elif summary == 0:
        mark_unavailable(health, "summary", "not_supported", f"{call}: summary not supported")
    else:  # an undefined summary is not "Healthy": kept, and judged as a fault
        health["summary"] = f"Unknown ({summary})"
    for key in CONDITION_SHIFTS:
        if mask is None:
            mark_unavailable(health, key, "not_supported", why_not)
            continue
        value, why = _condition(mask, key, call)
        if why is not None:
            mark_unavailable(health, key, why[0], why[1])
        else:
            health[key] = value
    config = None
    if mask is not None:
        config = (mask >> INCORRECT_CONFIGURATION_SHIFT) & INCORRECT_CONFIGURATION_WIDTH
    if config is None:
        mark_unavailable(health, "incorrect_configuration", "not_supported", why_not)
    elif config == 0:
        detail = f"{call}: health mask 0x{mask:x} does not report it"
        mark_unavailable(health, "incorrect_configuration", "not_supported", detail)
    else:
        health["incorrect_configuration"] = INCORRECT_CONFIGURATIONS.get(
            config, f"Unknown ({config})"
        )
    return health


def from_nvml(
    state: int,
    status: str,
    clique_id: int,
    cluster_uuid: Sequence[int],
    health: Dict[str, Any],
) -> Dict[str, Any]:
    """The record from NVML's fabric info of a GPU that has a fabric (state not
    NOT_SUPPORTED); `status` is already in words, `health` from decode_health."""
    fabric: Dict[str, Any] = {
        "state": STATES.get(state, f"Unknown ({state})"),
        "status": status,
        "clique_id": clique_id,
        "cluster_uuid": uuid_text(cluster_uuid),
        "health": None,
        "unavailable": {},
    }
    _settle_health(fabric, health)
    return fabric


def faults(health: Optional[Dict[str, Any]]) -> List[Tuple[str, str]]:
    """(key, words) of each health condition that holds, e.g. ("route_unhealthy", "route
    unhealthy"); a condition not reported is not among them (the checks say what is unknown)."""
    if not health:
        return []
    found = []
    bandwidth = health.get("bandwidth")
    if bandwidth is not None and bandwidth != "Full":
        found.append(("bandwidth", f"bandwidth {bandwidth}"))
    for key in _FLAGS:
        if health.get(key) is True:
            found.append((key, key.replace("_", " ")))
    config = health.get("incorrect_configuration")
    if config is not None and config != "None":
        found.append(("incorrect_configuration", f"incorrect configuration: {config}"))
    return found


def attach(
    gpus: List[Dict[str, Any]],
    blocks: List[Optional[Union[Dict[str, str], str]]],
    attached: Optional[int],
    missing: Unavailable,
) -> None:
    """Set each GPU's `fabric` from its printed block (same order). As for every other field,
    the last GPU of output cut short (fewer GPUs than `attached`) lacks it for an error."""
    for position, (gpu, block) in enumerate(zip(gpus, blocks)):
        gone = missing_reason(position, len(blocks), attached, missing)
        fabric, why = from_printed(block, gone)
        if why is not None:
            mark_unavailable(gpu, "fabric", why[0], why[1])
        else:
            gpu["fabric"] = fabric
