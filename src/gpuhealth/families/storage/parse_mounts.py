"""`/proc/mounts` (also `/proc/self/mounts`, `/etc/mtab`) -> list of mount records.

Each line is `device mountpoint fstype options dump pass`. The kernel escapes space, tab,
newline and backslash in the first two fields as three-digit octal (`\\040`, `\\011`, `\\012`,
`\\134`), so a mount point with a space still splits into six fields. Some mtab writers leave
out the two trailing numbers, so four fields are enough.

Stdlib only: shipped to GPU nodes inside the probe.
"""

import re
from typing import Any, Dict, List

from gpuhealth.parsing import ParseError

_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape(field: str) -> str:
    """Undo the kernel's octal escapes (`/mnt/my\\040data` -> `/mnt/my data`)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse(text: str) -> List[Dict[str, Any]]:
    """Mount records in table order: device, mountpoint, fstype and options (a list).

    A later record for the same mount point hides the earlier ones (over-mounting), which is
    why the order is kept.
    """
    mounts = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) not in (4, 6) or not fields[1].startswith("/"):
            raise ParseError(f"mount table line {number}: not a mount entry: {line!r}")
        mounts.append(
            {
                "device": unescape(fields[0]),
                "mountpoint": unescape(fields[1]),
                "fstype": unescape(fields[2]),
                "options": unescape(fields[3]).split(","),
            }
        )
    return mounts
