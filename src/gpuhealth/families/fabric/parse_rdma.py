"""Values of the RDMA port files under /sys/class/infiniband/<dev>/ports/<n>/.

The kernel (drivers/infiniband/core/sysfs.c) prints them as `4: ACTIVE` (state),
`5: LinkUp` (phys_state), `400 Gb/sec (4X NDR)` (rate) and plain integers (counters/*,
hw_counters/*). Both EFA and mlx5 devices use this layout.
"""

import re
from typing import Tuple

from gpuhealth.parsing import ParseError

_ENUM = re.compile(r"(\d{1,18}):\s*(\S.*?)")
_RATE = re.compile(r"(\d{1,18}(?:\.\d{1,18})?) Gb/sec(?: \((.*)\))?")


def parse_enum(text: str) -> Tuple[int, str]:
    """`4: ACTIVE` -> (4, "ACTIVE"); `5: LinkUp` -> (5, "LinkUp")."""
    match = _ENUM.fullmatch(text.strip())
    if match is None:
        raise ParseError(f"line 1: not a `code: NAME` port state: {text.strip()[:80]!r}")
    return int(match.group(1)), match.group(2)


def parse_rate(text: str) -> float:
    """`400 Gb/sec (4X NDR)` -> 400.0; `2.5 Gb/sec (1X SDR)` -> 2.5."""
    match = _RATE.fullmatch(text.strip())
    if match is None:
        raise ParseError(f"line 1: not a port rate: {text.strip()[:80]!r}")
    return float(match.group(1))


def parse_counter(text: str) -> int:
    """A counter file's value: one non-negative integer."""
    value = text.strip()
    if not re.fullmatch(r"[0-9]{1,20}", value):
        raise ParseError(f"line 1: not a counter value: {value[:80]!r}")
    return int(value)
