"""The vocabulary of the facts document (docs/facts-schema.md), shared by every layer.

The bottom layer: it imports nothing of gpuhealth, and it is shipped to the nodes with the
probe, so it keeps to the Python 3.6 language level and the standard library.
"""

from typing import TYPE_CHECKING, Any, Dict, Optional

# 1: GPUs only; 2: + system, storage, fabric, kernel_log, fabric_manager, memory_reclaim,
# dcgm_health, gpud, gpud_events; 3: one "skipped" convention for sections that do not apply,
# storage timeouts flagged, not spelled (gpuhealth reads 2 and 3, see upgrade.py).
SCHEMA_VERSION = 3
PROBE_VERSION = "0.2.0"

UNAVAILABLE_KINDS = ("not_supported", "error", "timeout", "absent")

# The node states a node is judged in: idle (commissioning, nightly, prolog, epilog after the
# memory is freed: every rule) or in-use (a job owns the GPUs: fault rules only). `auto` asks
# the probe to decide (gpuhealth.probe.state).
IDLE, IN_USE, AUTO = "idle", "in-use", "auto"
NODE_STATES = (IDLE, IN_USE)

if TYPE_CHECKING:  # the records as the type checker sees them; plain dicts on the node
    from typing import TypedDict

    class Unavailable(TypedDict):
        """Why a value is null: one of UNAVAILABLE_KINDS and a human detail."""

        kind: str
        detail: str

    class ProbeError(TypedDict, total=False):
        """One entry of the document's `errors`: which sub-probe, which call, what failed."""

        probe: str
        call: str
        error: str

else:
    Unavailable = dict
    ProbeError = dict

Record = Dict[str, Any]


def why(kind: str, detail: str) -> "Unavailable":
    """An `unavailable` entry; the detail is cut to 500 characters (it ends up in reports)."""
    if kind not in UNAVAILABLE_KINDS:
        raise ValueError(f"unknown unavailable kind {kind!r}")
    return {"kind": kind, "detail": str(detail)[:500]}


def mark_unavailable(record: Record, key: str, kind: str, detail: str) -> None:
    """Set record[key] to null and say why, so checks can tell unsupported from broken."""
    entry = why(kind, detail)
    record[key] = None
    record.setdefault("unavailable", {})[key] = entry


def reason(record: Optional[Record], key: str) -> "Unavailable":
    """Why record[key] is null; a null nobody explained (or explained in a map that is not
    one: saved facts can hold anything) is treated as an error."""
    reasons = record.get("unavailable") if isinstance(record, dict) else None
    found = reasons.get(key) if isinstance(reasons, dict) else None
    if isinstance(found, dict) and found.get("kind") in UNAVAILABLE_KINDS:
        return {"kind": found["kind"], "detail": str(found.get("detail") or "no detail")}
    return {"kind": "error", "detail": "no value"}


def skipped(text: str) -> Record:
    """A section that does not apply to this node (the one "no data" spelling of sections)."""
    return {"skipped": text}
