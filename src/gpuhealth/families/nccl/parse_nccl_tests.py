"""nccl-tests output (all_reduce_perf, all_gather_perf, alltoall_perf, ...) as a typed record.

What real logs look like, and what this parser therefore accepts:

- every line may carry a launcher prefix: srun's `0: ` (`--label`), mpirun's `[1,0]<stdout>:`
  (`--tag-output`), or none;
- MPI warnings, shell prompts, command lines and `NCCL version ...` are interleaved with the
  table and skipped; `...` marks rows or rank lines elided in a pasted excerpt;
- `#wrong` is `N/A` when the data was not checked (`-c 0`, in-place alltoall): that is "not
  validated" (None), which is not 0; bandwidths may be `-nan`/`inf` (None);
- the header (`# nThread ...`), the rank lines and the footer (`# Out of bounds values`,
  `# Avg bus bandwidth`) may each be missing;
- releases before 2.10 (2018-2020) print the header, the column names and the footer without
  `#`, an `error` column (the largest deviation) instead of `#wrong`, and logs of that time
  often end with a pasted `nvidia-smi topo -m` matrix.

A line that looks like a result row (two integers first, or as many fields as the column header
with a data type third) but does not fit the column header is a ParseError naming the line, as
is a footer line that cannot be read, a negative `#wrong` and a text with no result row at all.
`sweep_complete` says whether the rows reach the sweep's own end (maxBytes): a log cut off
before it holds no verdict on the sizes it lost.
"""

import math
import re
from typing import Any, Dict, List, Optional, Tuple

from gpuhealth.parsing import ParseError


class Aborted(ParseError):
    """A run that stopped on an error before its first result row: the error is its outcome."""


# Launcher prefixes: srun --label ("0: ", "12: ") and Open MPI --tag-output ("[1,0]<stdout>:").
_PREFIX = re.compile(r"^(?:\s*\d+: ?|\[\d+,\d+\]<std(?:out|err)>: ?)")
_ROW_START = re.compile(r"^\s*\d+\s+\d+\s")
# The device name is the rest of the line (stripped after the match: a lazy `(.*?)\s*$` is
# quadratic in runs of spaces).
_RANK = re.compile(
    r"^#\s*Rank\s+(\d{1,18})\s+(?:Group\s+(\d{1,18})\s+)?Pid\s+(\d{1,18})\s+on\s+(\S+)\s+device\s+(\d{1,18})"
    r"\s+\[([^\]]*)\](.*)$"
)
_HEADER_FIELDS = {
    "nthread": r"nThread\s+(\d{1,18})",
    "ngpus": r"nGpus\s+(\d{1,18})",
    "min_bytes": r"minBytes\s+(\d{1,18})",
    "max_bytes": r"maxBytes\s+(\d{1,18})",
    "warmup_iters": r"warmup iters:\s*(\d{1,18})",
    "iters": r"(?<!warmup )(?<!agg )iters:\s*(\d{1,18})",
    "validation": r"validation:\s*(\d{1,18})",
}
_STEP = re.compile(r"step:\s*(\d{1,18})\s*\((factor|bytes)\)")
_REDUCED = re.compile(r"Reducing maxBytes to (\d{1,18})")
# Matched against stripped lines: one `\s*` before the verdict (two would backtrack
# quadratically on a long run of spaces).
_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(\d{1,18})\s*(OK|FAILED)?$", re.I)
_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*(\S+)\s*(OK|FAILED)?$", re.I)
_FAILED = re.compile(r"\bFAILED\b")
_FOOTER = re.compile(r"^#?\s*(Out of bounds values|Avg bus bandwidth)\b", re.I)
_BINARY = re.compile(r"\b([a-z]+(?:_[a-z]+)*)_perf(?:_mpi)?\b")
_NCCL_VERSION = re.compile(r"\bNCCL version (\S+)")
# How nccl-tests stops on an error (`Test CUDA failure common.cu:941 'system not yet
# initialized'`, `Test NCCL failure`, `.. pid 1: Test failure common.cu:891`), and NCCL's own.
_ABORT = re.compile(r"\bTest (?:CUDA |NCCL )?failure\b|CUDA-capable device\(s\) is/are busy")
_WARN = re.compile(r"\bNCCL WARN\b")
# The column layout of every nccl-tests release since 2.10 (redop/root columns, #wrong).
_DEFAULT_COLUMNS = (
    "size count type redop root time algbw busbw #wrong time algbw busbw #wrong".split()
)
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
    value = _float(token) if len(token) <= 32 else None
    if value is None or value != int(value) or value < 0:
        raise ParseError(f"line {number}: #wrong {token[:40]!r} is not a count: {line[:200]!r}")
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
    """The column names of the table: size count type [redop] [root], then one or two places
    (out-of-place, in-place), each `time algbw busbw` and `#wrong` (or, before 2.10, `error`)."""
    names = header.lstrip("#").split()
    leading = 3 + sum(1 for n in names[3:5] if n in ("redop", "root"))
    places = " ".join(names[leading:]).replace("time", "|time").split("|")[1:]
    shapes = ("time algbw busbw #wrong", "time algbw busbw error", "time algbw busbw")
    if (
        names[:3] != ["size", "count", "type"]
        or names[3:leading] not in (["redop", "root"], ["redop"], ["root"], [])
        or not 1 <= len(places) <= 2
        or any(place.strip() not in shapes for place in places)
        or " ".join(names[leading:]).split("time")[0].strip()
    ):
        raise ParseError(
            f"line {number}: unknown nccl-tests column header: {header.strip()[:200]!r}"
        )
    return names


def _header_facts(line: str) -> Dict[str, Any]:
    facts: Dict[str, Any] = {}
    for key, pattern in _HEADER_FIELDS.items():
        match = re.search(pattern, line)
        if match:
            facts[key] = int(match.group(1))
    step = _STEP.search(line)
    if step:
        facts["step"], facts["step_kind"] = int(step.group(1)), step.group(2)
    return facts


def _row_like(tokens: List[str], columns: List[str]) -> bool:
    """A garbled result row: as many fields as the columns, a data type in the type column."""
    return len(tokens) == len(columns) and len(tokens) > 2 and tokens[2] in _TYPE_BYTES


def _sweep_end(header: Optional[Dict[str, Any]], reduced: Optional[int]) -> Optional[int]:
    """The sweep's last size as planned: maxBytes, or what nccl-tests reduced it to for lack of
    memory; None when the log does not say (no header)."""
    if reduced is not None:
        return reduced
    return (header or {}).get("max_bytes")


def _sweep_complete(
    header: Optional[Dict[str, Any]], end: Optional[int], rows: List[Dict[str, Any]]
) -> Optional[bool]:
    """Do the rows reach the sweep's end, i.e. would the next size pass it? None when the log
    does not say what the sweep was."""
    if end is None or not header or "step" not in header:
        return None
    largest = max(row["size"] for row in rows)
    if header["step_kind"] == "factor":
        return largest * max(header["step"], 2) > end
    return largest + max(header["step"], 1) > end


def _sweep_gap(
    header: Optional[Dict[str, Any]], rows: List[Dict[str, Any]]
) -> Optional[Tuple[int, int]]:
    """The first place rows are missing from the sweep, as (size before, size after; 0 before
    the first row), or None. Unknown without the header.

    nccl-tests steps an unrounded size (times the factor, or plus the step) from min_bytes in
    each (type, operation, root) table, and prints it rounded down to whole elements per rank
    (all_gather with 24 ranks prints 960 after 480, then 2016): so each row is held to the
    size meant for it, which a row after a missing one exceeds. A size meant past maxBytes
    starts the sweep again (`-N` repeats it), so the size meant never outgrows the sweep."""
    if not header or "step" not in header or "min_bytes" not in header:
        return None
    factor, step = header["step_kind"] == "factor", header["step"]
    end = header.get("max_bytes")
    meant, table, before = 0, None, 0
    for row in rows:
        # A new table: another type, operation or root (`-r -1` loops over roots), or a
        # sweep that starts again (repeated cycles, `-N`) with the same ones: after a row
        # below the last, or once the sweep has passed its end.
        key = (row["type"], row["redop"], row.get("root"))
        past_end = end is not None and meant > end
        if key != table or row["size"] < before or past_end:
            table, meant, before = key, header["min_bytes"], 0
        if row["size"] * 100 > max(meant, 1) * 101 + 6400:  # 1% + 64 B, in integers
            return before, row["size"]
        meant = min(meant * max(step, 2) if factor else meant + max(step, 1), 1 << 64)
        before = row["size"]
    return None


def _is_all_reduce(rows: List[Dict[str, Any]]) -> bool:
    """An all_reduce table: a reduction to every rank (root -1) over the full buffer.

    Rows under a column header without the root column (before 2.10) cannot say; where most
    rows have it, those few (a second, older table pasted or inserted) do not hide the rest."""
    modern = [row for row in rows if row["root"] is not None]
    if 2 * len(modern) > len(rows):
        rows = modern
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
    reduced = None
    cut_after = -1  # the number of rows before the last `...`; rows_elided: rows follow it
    rows_elided = False
    failed_lines: List[str] = []
    aborted: List[str] = []
    warned: List[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = _strip_prefix(raw.rstrip())
        stripped = line.strip()
        if not stripped:
            continue
        if _ABORT.search(stripped):  # also a result row the error cut short
            aborted.append(stripped[:300])
            continue
        if _WARN.search(stripped):
            warned.append(stripped[:300])
            continue
        if stripped in ("...", "…") or stripped.startswith("..."):
            elided = True
            cut_after = len(rows) if rows else cut_after
            continue
        body = stripped.lstrip("#").strip()
        if _FAILED.search(stripped) and not _OOB.match(stripped) and not _AVG.match(stripped):
            failed_lines.append(stripped[:200])  # a verdict in a line that cannot be read
        if _FOOTER.match(stripped):
            oob = _OOB.match(stripped)
            avg_match = _AVG.match(stripped)
            if oob:
                out_of_bounds = {
                    "count": int(oob.group(1)),
                    "ok": None if oob.group(2) is None else oob.group(2).upper() == "OK",
                }
            elif avg_match:
                avg = _float(avg_match.group(1))
                if avg is None and avg_match.group(1).lower().lstrip("+-") not in ("nan", "inf"):
                    raise ParseError(f"line {number}: bad average bus bandwidth: {stripped!r}")
                avg_ok = None if avg_match.group(2) is None else avg_match.group(2).upper() == "OK"
            else:  # a verdict line that cannot be read is not a missing one
                raise ParseError(f"line {number}: cannot read the footer line {stripped[:200]!r}")
            continue
        if body.startswith("nThread"):
            header = _header_facts(body)
            continue
        if body.split()[:3] == ["size", "count", "type"]:
            columns = _columns(stripped, number)
            continue
        if stripped.startswith("#"):
            rank = _RANK.match(stripped)
            if rank:
                devices.append(
                    {
                        "rank": int(rank.group(1)),
                        "group": int(rank.group(2)) if rank.group(2) is not None else None,
                        "pid": int(rank.group(3)),
                        "host": rank.group(4),
                        "device": int(rank.group(5)),
                        "busid": rank.group(6),
                        "name": rank.group(7).strip() or None,
                    }
                )
            elif "Collective test concluded" in body:
                found = _BINARY.search(body)
                collective = found.group(1) if found else collective
            continue
        if _ROW_START.match(line) or _row_like(line.split(), columns):
            rows_elided = rows_elided or cut_after == len(rows)
            rows.append(_row(line.split(), columns, number, raw))
            continue
        smaller = _REDUCED.search(line)
        if smaller:
            reduced = int(smaller.group(1))
        version = _NCCL_VERSION.search(line)
        if version:
            nccl_version = version.group(1)
        found = _BINARY.search(line)
        if found and collective is None:
            collective = found.group(1)
    if not rows:
        if aborted or warned:
            raise Aborted("; ".join((aborted or warned)[:3]))
        raise ParseError("no nccl-tests result rows (lines of size, count, type, ...) found")
    source = "log" if collective else None
    if collective is None and _is_all_reduce(rows):
        collective, source = "all_reduce", "inferred"
    hosts: List[str] = []
    for device in devices:
        if device["host"] not in hosts:
            hosts.append(device["host"])
    ranks = max(d["rank"] for d in devices) + 1 if devices else None
    sweep_end = _sweep_end(header, reduced)
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
        "sweep_end_bytes": sweep_end,
        "sweep_complete": _sweep_complete(header, sweep_end, rows),
        "sweep_gap": _sweep_gap(header, rows),
        "elided": elided,
        "rows_elided": rows_elided,
        "failed_lines": failed_lines[:5],
        "aborted": aborted[:5],
        "out_of_bounds": out_of_bounds,
        "avg_busbw_gbps": avg,
        "avg_ok": avg_ok,
    }


# One whitespace run per place, so a line of spaces is not matched quadratically.
_TABLE_HEADER = re.compile(r"^(?:[ \t]*[^\s#]\S*:[ \t]?)?[ \t#]*size[ \t]+count[ \t]+type\b", re.M)
# A run that stopped before its table: its header line, or nccl-tests' own error line.
_RUN_HEADER = re.compile(r"^(?:[ \t]*[^\s#]\S*:[ \t]?)?[ \t#]*nThread \d{1,9} nGpus \d", re.M)
_TEST_FAILURE = re.compile(r"Test (?:CUDA |NCCL )?failure [\w.-]{1,40}\.cu:\d")


def looks_like(text: str) -> bool:
    """nccl-tests output: its column header (`#  size  count  type ...`, without `#` before
    2.10) or its `nThread N nGpus N` line starts a line, after a launcher prefix if any; or
    it holds nccl-tests' error line (`Test CUDA failure common.cu:941 ...`)."""
    return any(p.search(text) for p in (_TABLE_HEADER, _RUN_HEADER, _TEST_FAILURE))
