"""Parsers of the kernel's own text files: /proc/meminfo, /proc/modules and sysfs cpu lists.

The probe reads these under a root prefix; parsing them here keeps it free of string fiddling
and lets the formats be tested on their own.
"""

import re
from typing import Dict, List, Set

from gpuhealth.parsing import ParseError

_MEMINFO_LINE = re.compile(r"^([A-Za-z0-9_()]+):\s+(\d{1,18})(?: kB)?\s*$")


def meminfo(text: str) -> Dict[str, int]:
    """/proc/meminfo (or a node's meminfo) as key -> number; sizes stay in kB as printed.

    Per-node files prefix each line with "Node N "; the prefix is dropped so both read alike.
    """
    values: Dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        stripped = re.sub(r"^Node \d+ ", "", line)
        match = _MEMINFO_LINE.match(stripped)
        if not match:
            raise ParseError(f"meminfo line {number}: cannot read {line!r}")
        values[match.group(1)] = int(match.group(2))
    return values


def modules(text: str) -> List[Dict[str, str]]:
    """/proc/modules as [{"name", "state"}]; state is Live, Loading or Unloading.

    A line is `name size refcount deps state address [taints]` (kernel/module/procfs.c).
    """
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) < 6 or not fields[1].isdigit():
            raise ParseError(f"/proc/modules line {number}: cannot read {line!r}")
        state = fields[4]
        if state not in ("Live", "Loading", "Unloading"):
            raise ParseError(f"/proc/modules line {number}: unknown module state {state!r}")
        found.append({"name": fields[0], "state": state})
    return found


MAX_CPUS = 65536  # the kernel's NR_CPUS ceiling (8192 on x86_64); a list past it is garbled


def cpulist(text: str) -> List[int]:
    """A kernel cpu/node list such as "0-55,112-167" as sorted numbers; "" is no CPU."""
    result: Set[int] = set()
    text = text.strip()
    if not text:
        return []
    for part in text.split(","):
        match = re.fullmatch(r"(\d{1,18})(?:-(\d{1,18}))?", part.strip())
        if not match:
            raise ParseError(f"cpu list {text[:80]!r}: cannot read {part[:40]!r}")
        low = int(match.group(1))
        high = int(match.group(2) or low)
        if high < low:
            raise ParseError(f"cpu list {text[:80]!r}: range {part!r} runs backwards")
        if high >= MAX_CPUS:
            raise ParseError(f"cpu list {text[:80]!r}: CPU {high} is beyond any machine's")
        result.update(range(low, high + 1))
    return sorted(result)


def format_cpulist(cpus: List[int]) -> str:
    """The inverse of `cpulist`: numbers back into the kernel's compact range form."""
    ranges: List[str] = []
    ordered = sorted(set(cpus))
    start = prev = None
    for cpu in [*ordered, None]:
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(ranges)
