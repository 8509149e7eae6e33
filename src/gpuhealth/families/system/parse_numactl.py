"""`numactl --hardware` output: the NUMA nodes libnuma sees, their CPUs, memory and distances.

The format is numactl's `hardware()` (numactl.c):

    available: 2 nodes (0-1)
    node 0 cpus: 0 1 2 ... 55 112 ... 167
    node 0 size: 1031904 MB
    node 0 free: 1017356 MB
    ...
    node distances:
    node   0   1
      0:  10  21
      1:  21  10

Memory-only nodes (CXL, Grace Hopper GPU memory) print an empty cpu list; a node whose size
libnuma cannot read prints `<not available>`; firmware without a SLIT table gives
"No distance information available." instead of the matrix.
"""

import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

from gpuhealth.families.system.parse_proc import format_cpulist
from gpuhealth.parsing import ParseError

_AVAILABLE = re.compile(r"^available: (\d{1,18}) nodes \(([^)]*)\)$")
_NODE_LINE = re.compile(r"^node (\d{1,18}) (cpus|size|free):(.*)$")
_SIZE = re.compile(r"^(\d{1,18}) MB$")


def _fail(number: int, line: str, why: str) -> ParseError:
    return ParseError(f"numactl --hardware line {number}: {why}: {line!r}")


def parse_hardware(text: str) -> Dict[str, Any]:
    """{"available_nodes", "nodes": [{"node", "cpus", "cpu_count", "size_mb", "free_mb"}],
    "distances"}: cpus in the kernel's range form; distances a matrix (rows and columns in
    the order of `nodes`) or None."""
    lines = [(n, line.rstrip()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ParseError("numactl --hardware printed nothing")
    number, first = lines[0]
    match = _AVAILABLE.match(first)
    if not match:
        raise _fail(number, first, "expected 'available: N nodes (...)'")
    announced = int(match.group(1))
    nodes: Dict[int, Dict[str, Any]] = {}
    distances: Optional[List[List[int]]] = None
    rest = iter(lines[1:])
    for number, line in rest:
        node_match = _NODE_LINE.match(line)
        if node_match:
            node, what, value = int(node_match.group(1)), node_match.group(2), node_match.group(3)
            record = nodes.setdefault(
                node, {"node": node, "cpus": "", "cpu_count": 0, "size_mb": None, "free_mb": None}
            )
            if what == "cpus":
                try:
                    cpus = [int(c) for c in value.split()]
                except ValueError:
                    raise _fail(number, line, "cpu numbers expected") from None
                record["cpus"], record["cpu_count"] = format_cpulist(cpus), len(cpus)
            else:
                value = value.strip()
                size = _SIZE.match(value)
                if not size and value != "<not available>":
                    raise _fail(number, line, "expected 'N MB' or '<not available>'")
                record[f"{what}_mb"] = int(size.group(1)) if size else None
        elif line == "No distance information available.":
            distances = None
        elif line == "node distances:":
            distances = _distances(rest, sorted(nodes))
        else:
            raise _fail(number, line, "unexpected line")
    if len(nodes) != announced:
        raise ParseError(
            f"numactl --hardware announces {announced} nodes but describes {len(nodes)}"
        )
    return {
        "available_nodes": announced,
        "nodes": [nodes[n] for n in sorted(nodes)],
        "distances": distances,
    }


def _distances(rest: Iterator[Tuple[int, str]], node_ids: List[int]) -> List[List[int]]:
    """The matrix after "node distances:": a header of node ids, then one row per node."""
    try:
        number, header = next(rest)
    except StopIteration:
        raise ParseError("numactl --hardware: 'node distances:' without a matrix") from None
    columns = header.split()
    if (
        not columns
        or columns[0] != "node"
        or not all(re.fullmatch(r"[0-9]{1,9}", c) for c in columns[1:])
    ):
        raise _fail(number, header, "expected the distance header 'node 0 1 ...'")
    ids = [int(c) for c in columns[1:]]
    if ids != node_ids:
        raise _fail(number, header, f"distance columns {ids} do not match the nodes {node_ids}")
    matrix: List[List[int]] = []
    for expected in ids:
        try:
            number, row = next(rest)
        except StopIteration:
            raise ParseError("numactl --hardware: distance matrix cut short") from None
        match = re.fullmatch(r"\s*(\d{1,18}):((?:\s+\d{1,18})+)\s*", row)
        values = match.group(2).split() if match else []
        if not match or int(match.group(1)) != expected or len(values) != len(ids):
            raise _fail(number, row, f"expected row '{expected}:' with {len(ids)} distances")
        matrix.append([int(v) for v in values])
    return matrix
