"""Saved kernel-log evidence for triage: dmesg/journalctl/kmsg logs and the fabric manager log.

A saved log has no "now": its sections keep every event and the checks anchor the profile's
window at the log's last entry (its last line, not its largest timestamp).
"""

from __future__ import annotations

from typing import Any

from gpuhealth.families.kernel import parse_kernel_log as parser
from gpuhealth.registry import Kind


def _evidence(parsed: dict[str, Any], source: str) -> dict[str, Any]:
    """A saved log as a facts section: every event kept, the window left to the checks."""
    everything = 2 * len(parsed["events"]) + 2
    notes = []
    if parsed.get("future_lines"):
        notes.append(
            f"{parsed['future_lines']} line(s) dated after now: kept, but not taken as the end "
            "of the log the window is anchored at"
        )
    return {
        "source": source,
        "window_h": None,
        "since": None,
        "until": parsed["newest"],
        "until_uptime_s": parsed.get("newest_uptime_s"),
        "anchored_at": "newest_entry",
        "notes": notes,
        **parser.summarise(parsed["events"], everything, everything),
        "unavailable": {},
    }


def kernel_log_evidence(text: str) -> dict[str, Any]:
    """A saved kernel log (any format the parser reads) as the `kernel_log` facts section."""
    parsed = parser.parse(text)
    return {"kernel_log": _evidence(parsed, parsed["format"] or "kernel log")}


def fabric_manager_evidence(text: str) -> dict[str, Any]:
    """A saved nvidia-fabricmanager log as the `fabric_manager` facts section."""
    section = _evidence(parser.parse_fabric_manager(text), "nvidia-fabricmanager log")
    return {"fabric_manager": {"log": None, "present": True, **section}}


def _detector(name: str) -> Any:
    """detect() narrowed to one format, for one evidence kind per format."""
    return lambda text: parser.detect(text) == name


# Kernel logs (dmesg, journalctl -k, /dev/kmsg...) are generic timestamped lines: tried last.
KINDS = (
    Kind(
        "nvidia-fabricmanager log",
        parser.detect_fabric_manager,
        fabric_manager_evidence,
        priority=80,
    ),
    *(Kind(name, _detector(name), kernel_log_evidence, priority=90) for name in parser.FORMATS),
)
