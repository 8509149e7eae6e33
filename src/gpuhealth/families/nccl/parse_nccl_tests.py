"""nccl-tests output (all_reduce_perf, all_gather_perf, alltoall_perf, ...) as a typed record.

What real logs look like, and what this parser therefore accepts:

- every line may carry a launcher prefix: srun's `0: ` (`--label`), mpirun's `[1,0]<stdout>:`
  (`--tag-output`), or none;
- MPI warnings, shell prompts, command lines and `NCCL version ...` are interleaved with the
  table and skipped; `...` marks rows or rank lines elided in a pasted excerpt;
- `#wrong` is `N/A` when the data was not checked (`-c 0`, in-place alltoall): that is "not
  validated" (None), which is not 0; bandwidths may be `-nan`/`inf` (None);
- the header (`# nThread ...`), the rank lines and the footer (`# Out of bounds values`,
  `# Avg bus bandwidth`) may each be missing.

A line that looks like a result row (two integers first) but does not fit the column header is a
ParseError naming the line, as is a text with no result row at all.
"""

import math
import re
from typing import Any, Dict, List, Optional

from gpuhealth.parsing import ParseError

# Launcher prefixes: srun --label ("0: ", "12: ") and Open MPI --tag-output ("[1,0]<stdout>:").
_PREFIX = re.compile(r"^(?:\s*\d+: ?|\[\d+,\d+\]<std(?:out|err)>: ?)")
_ROW_START = re.compile(r"^\s*\d+\s+\d+\s")
_RANK = re.compile(
    r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
    r"\s+\[([^\]]*)\]\s*(.*?)\s*$"
)
_HEADER_FIELDS = {
    "nthread": r"nThread\s+(\d+)",
    "ngpus": r"nGpus\s+(\d+)",
    "min_bytes": r"minBytes\s+(\d+)",
    "max_bytes": r"maxBytes\s+(\d+)",
    "warmup_iters": r"warmup iters:\s*(\d+)",
    "iters": r"(?<!warmup )(?<!agg )iters:\s*(\d+)",
    "validation": r"validation:\s*(\d+)",
}
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*(\d+)\s*(OK|FAILED)?", re.I)
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?", re.I)
_BINARY = re.compile(r"\b([a-z]+(?:_[a-z]+)*)_perf(?:_mpi)?\b")
_NCCL_VERSION = re.compile(r"\bNCCL version (\S+)")
# The column layout of every nccl-tests release since 2.10 (redop/root columns, #wrong).
_DEFAULT_COLUMNS = (
    "size count type redop root time algbw busbw #wrong time algbw busbw #wrong".split()
)
_LEADING = ("size", "count", "type", "redop", "root")
_PER_PLACE = ("time", "algbw", "busbw", "#wrong")
# Bytes per element of the types nccl-tests prints, to recognise an all_reduce table.
_TYPE_BYTES = {
    "int8": 1,
    "uint8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "f8e4m3": 1,
    "f8e5m2": 1,
    "half": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float": 4,
    "int64": 8,
    "uint64": 8,
    "double": 8,
}


def _strip_prefix(line: str) -> str:
    return _PREFIX.sub("", line, count=1)


def _float(token: str) -> Optional[float]:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _wrong(token: str, number: int, line: str) -> Optional[int]:
    if token.upper() == "N/A":
        return None
    try:
        return int(token)
    except ValueError:
        value = _float(token)
        if value is None or value != int(value):
            raise ParseError(f"line {number}: #wrong {token!r} is not a count: {line!r}") from None
        return int(value)


def _row(tokens: List[str], columns: List[str], number: int, line: str) -> Dict[str, Any]:
    if len(tokens) != len(columns):
        raise ParseError(
            f"line {number}: result row has {len(tokens)} columns, the header has "
            f"{len(columns)}: {line.strip()!r}"
        )
    row: Dict[str, Any] = {"size": None, "count": None, "type": None, "redop": None, "root": None}
    places: List[Dict[str, Any]] = []
    for name, token in zip(columns, tokens):
        if name in ("size", "count", "root"):
            try:
                row[name] = int(token)
            except ValueError:
                raise ParseError(f"line {number}: {name} {token!r} is not an integer") from None
        elif name in ("type", "redop"):
            row[name] = token
        elif name == "time":
            places.append({"time_us": _float(token)})
        elif name in ("algbw", "busbw"):
            places[-1][f"{name}_gbps"] = _float(token)
        elif name == "#wrong":
            places[-1]["wrong"] = _wrong(token, number, line)
        elif name == "error":  # releases before 2.10: the largest deviation, not a count
            places[-1]["max_error"] = _float(token)
    empty = {"time_us": None, "algbw_gbps": None, "busbw_gbps": None, "wrong": None}
    row["out_of_place"] = {**empty, **places[0]} if places else dict(empty)
    row["in_place"] = {**empty, **places[1]} if len(places) > 1 else None
    return row


def _columns(header: str, number: int) -> List[str]:
    names = header.lstrip("#").split()
    if names[:3] != ["size", "count", "type"] or "time" not in names:
        raise ParseError(f"line {number}: unknown nccl-tests column header: {header.strip()!r}")
    known = set(_LEADING) | set(_PER_PLACE) | {"error"}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ParseError(f"line {number}: unknown nccl-tests columns {unknown}: {header!r}")
    return names


def _header_facts(line: str) -> Dict[str, int]:
    facts = {}
    for key, pattern in _HEADER_FIELDS.items():
        match = re.search(pattern, line)
        if match:
            facts[key] = int(match.group(1))
    return facts


def _is_all_reduce(rows: List[Dict[str, Any]]) -> bool:
    """An all_reduce table: a reduction to every rank (root -1) over the full buffer."""
    if not rows:
        return False
    for row in rows:
        size = _TYPE_BYTES.get(str(row["type"]))
        if row["redop"] in (None, "none") or row["root"] != -1 or size is None:
            return False
        if row["count"] * size != row["size"]:
            return False
    return True


def parse(text: str) -> Dict[str, Any]:
    """The header facts, rank lines, result rows and footer of one nccl-tests run.

    `collective` is the test's name (`all_reduce`, `alltoall`, ...) from the command line or
    the "Collective test concluded" line, else `all_reduce` when the table can only be one
    (`collective_source` says which), else None.
    """
    columns = list(_DEFAULT_COLUMNS)
    header: Optional[Dict[str, int]] = None
    devices: List[Dict[str, Any]] = []
    rows: List[Dict[str, Any]] = []
    out_of_bounds = None
    avg = None
    avg_ok = None
    elided = False
    collective = None
    nccl_version = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = _strip_prefix(raw.rstrip())
        stripped = line.strip()
        if not stripped:
            continue
        if stripped in ("...", "…") or stripped.startswith("..."):
            elided = True
            continue
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            rank = _RANK.match(stripped)
            oob = _OOB.match(stripped)
            avg_match = _AVG.match(stripped)
            if rank:
                devices.append(
                    {
                        "rank": int(rank.group(1)),
                        "group": int(rank.group(2)) if rank.group(2) is not None else None,
                        "pid": int(rank.group(3)),
                        "host": rank.group(4),
                        "device": int(rank.group(5)),
                        "busid": rank.group(6),
                        "name": rank.group(7) or None,
                    }
                )
            elif body.startswith("nThread"):
                header = _header_facts(body)
            elif body.startswith("size"):
                columns = _columns(stripped, number)
            elif oob:
                out_of_bounds = {
                    "count": int(oob.group(1)),
                    "ok": None if oob.group(2) is None else oob.group(2).upper() == "OK",
                }
            elif avg_match:
                avg = _float(avg_match.group(1))
                if avg is None and avg_match.group(1).lower().lstrip("+-") not in ("nan", "inf"):
                    raise ParseError(f"line {number}: bad average bus bandwidth: {stripped!r}")
                avg_ok = None if avg_match.group(2) is None else avg_match.group(2).upper() == "OK"
            elif "Collective test concluded" in body:
                found = _BINARY.search(body)
                collective = found.group(1) if found else collective
            continue
        if _ROW_START.match(line):
            rows.append(_row(line.split(), columns, number, raw))
            continue
        version = _NCCL_VERSION.search(line)
        if version:
            nccl_version = version.group(1)
        found = _BINARY.search(line)
        if found and collective is None:
            collective = found.group(1)
    if not rows:
        raise ParseError("no nccl-tests result rows (lines of size, count, type, ...) found")
    source = "log" if collective else None
    if collective is None and _is_all_reduce(rows):
        collective, source = "all_reduce", "inferred"
    hosts: List[str] = []
    for device in devices:
        if device["host"] not in hosts:
            hosts.append(device["host"])
    ranks = max(d["rank"] for d in devices) + 1 if devices else None
    return {
        "collective": collective,
        "collective_source": source,
        "nccl_version": nccl_version,
        "header": header,
        "devices": devices,
        "hosts": hosts,
        # An excerpt may list only some ranks: then its hosts are not all the run's nodes.
        "hosts_complete": bool(devices) and len({d["rank"] for d in devices}) == ranks,
        "ranks": ranks,
        "rows": rows,
        "elided": elided,
        "out_of_bounds": out_of_bounds,
        "avg_busbw_gbps": avg,
        "avg_ok": avg_ok,
    }


_TABLE_HEADER = re.compile(r"#\s+size\s+count\s+type\b")


def looks_like(text: str) -> bool:
    """nccl-tests output: its column header (`#  size  count  type ...`) appears."""
    return _TABLE_HEADER.search(text) is not None
