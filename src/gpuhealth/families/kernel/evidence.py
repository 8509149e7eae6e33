"""Saved kernel-log evidence for triage: dmesg/journalctl/kmsg logs and the fabric manager log.

A saved log has no "now": its sections keep every event and the checks anchor the profile's
window at the log's last entry (its last line, not its largest timestamp).
"""

from __future__ import annotations

import re
from typing import Any

from gpuhealth.families.kernel import parse_kernel_log as parser
from gpuhealth.registry import Kind

# A kernel log line of any format the parser reads (every line of a log begins it): kmsg;
# dmesg's [uptime], [ctime], -H and ISO stamps (after --decode's facility); journalctl's
# syslog, short-full and ISO stamps before "host kernel:", or what is left when they are cut
# off; talosctl dmesg; and dmesg -t's lines of the NVIDIA driver.
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_CLOCK = r"\d\d:\d\d:\d\d(?:[.,]\d{1,9})?"
_KERNEL = r"\S{1,255} kernel(?:\[\d{1,9}\])?: "
_LINE = re.compile(
    r"^(?:\d{1,20},\d{1,20},\d{1,20},[^;\n]{0,100};"
    r"|(?:[a-z]{1,10} *:[a-z]{1,10} *: ?)?(?:\[ *\+?\d{1,12}\.\d{1,9}\]"
    rf"|\[{_DAY} {_MONTH} +\d{{1,2}} {_CLOCK} \d{{4}}\]|\[{_MONTH} ?\d{{1,2}} \d\d:\d\d(?::\d\d)?\]"
    rf"|\d{{4}}-\d\d-\d\d[T ]{_CLOCK}(?:Z|[+-]\d\d:?\d\d)? (?:{_KERNEL})?)"
    rf"|{_MONTH} +\d{{1,2}} {_CLOCK} {_KERNEL}"
    rf"|{_DAY} \d{{4}}-\d\d-\d\d {_CLOCK} \S{{1,10}} {_KERNEL}"
    r"|(?:[^\s:\[]{1,255} )?kernel: |[^\s:]{1,255}: [a-z]{1,10}: {1,8}[a-z]{1,10}: \[\d{4}-"
    r"|(?:NVRM|nvidia[\w-]{0,30})(?: [\w:.\-]{1,40})?: )",
    re.M,
)
_FM_LINE = re.compile(r"^\[\w{3} \d{1,2} \d{4} \d\d:\d\d:\d\d\] \[[A-Z]+\]", re.M)


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
        starts=_FM_LINE,
        log=True,
    ),
    *(
        Kind(name, _detector(name), kernel_log_evidence, priority=90, starts=_LINE, log=True)
        for name in parser.FORMATS
    ),
)
