"""`nvidia-smi nvlink --status` into per-GPU NVLink link states.

`nvidia-smi -q -x` does not report NVLink, so a probe without nvidia-ml-py reads this instead.
A link that is up shows its speed ("Link 3: 25 GB/s"); a down one shows "<inactive>".
"""

import re
from typing import Any, Dict, List, Optional

from gpuhealth.parsing import ParseError

_GPU = re.compile(r"^GPU (\d{1,18}): .*")
# The state is stripped after the match (a lazy `(.*?)\s*$` is quadratic in runs of spaces).
_LINK = re.compile(r"^\s+Link (\d{1,18}): (.*)$")
_SPEED = re.compile(r"^(\d{1,18}(?:\.\d{1,18})?) GB/s$")


def parse_status(text: str) -> Dict[int, List[Dict[str, Any]]]:
    """GPU index -> [{"link", "up", "speed_gbps"}]; a GPU without links maps to []."""
    result: Dict[int, List[Dict[str, Any]]] = {}
    current: Optional[List[Dict[str, Any]]] = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        gpu = _GPU.match(line)
        if gpu:
            current = result.setdefault(int(gpu.group(1)), [])
            continue
        link = _LINK.match(line)
        if link is None or current is None:
            raise ParseError(
                f"line {number}: not nvidia-smi nvlink --status output: {line[:120]!r}"
            )
        speed = _SPEED.match(link.group(2).strip())
        current.append(
            {
                "link": int(link.group(1)),
                "up": speed is not None,
                "speed_gbps": float(speed.group(1)) if speed else None,
            }
        )
    return result
