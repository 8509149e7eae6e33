"""`dcgmi diag` and `dcgmi health -c` in their default form: box-drawn tables, as pasted.

The diagnostic (DCGM 3.x; 4.x adds a `GPU0: Pass` line per entity under each test):

    +---------------------------+------------------------------------------------+
    | Diagnostic                | Result                                         |
    +===========================+================================================+
    |-----  Metadata  ----------+------------------------------------------------|
    | DCGM Version              | 3.3.8                                          |
    |-----  Deployment  --------+------------------------------------------------|
    | Persistence Mode          | Pass                                           |
    | Info                      | Persistence mode for GPU 0 is disabled. Enabl  |
    |                           | e persistence mode by running "nvidia-smi -i   |
    +-----  Hardware  ----------+------------------------------------------------+
    | GPU Memory                | Fail - All                                     |
    | Warning                   | GPU 0 Error using CUDA API cuInit ...          |
    +---------------------------+------------------------------------------------+

The health check: `| Overall Health | Warning |`, then a group (`GPU`), its entities
(`-> 0`), `-> Errors` and the subsystems (`-> Power system | Warning`) with DCGM's message
wrapped under them. Both are read into the shapes of their `-j` forms (parse_dcgm), so the
same checks judge them. Cells wrapped over several lines are joined. A table without its
closing border was cut short: it is refused, as is a test row whose status cannot be read.
"""

import re
from typing import Any, Dict, List, Optional, Tuple

from gpuhealth.families.dcgm.parse_dcgm import status_name
from gpuhealth.parsing import ParseError

_DIAG_HEAD = re.compile(r"^[ \t]*\|[ \t]*Diagnostic[ \t]+\|[ \t]*Result[ \t]+\|", re.M)
_HEALTH_HEAD = re.compile(r"^[ \t]*\|[ \t]*Health Monitor Report[ \t]+\|", re.M)
_BORDER = re.compile(r"^\+[-=+]+\+$")
_CATEGORY = re.compile(r"^[|+]-{2,}[ \t]+([A-Za-z][A-Za-z ]{0,40}?)[ \t]+-+\+-+[|+]$")
# `Pass`, `Fail - All`, `Fail - GPU: 0`, `Pass - GPUs: 0, 1, 2` (3.x); `GPU0: Pass` (4.x).
_RESULT = re.compile(
    r"^(Pass|Fail|Warn|Skip|Not Run)(?: - (?:(All)|GPUs?: ?([0-9][0-9, ]{0,200})))?$"
)
_ENTITY = re.compile(r"^(GPU|CPU|NvSwitch|Switch|ConnectX) ?(\d{1,4}): ([A-Za-z][A-Za-z ]{0,20})$")
_MESSAGE = re.compile(r"^(Warning|Info|Error)\b")
_METADATA = {"DCGM Version": "version", "Driver Version Detected": "driver_version"}


def looks_like_diag(text: str) -> bool:
    """A `dcgmi diag` table: its `| Diagnostic | Result |` header."""
    return _DIAG_HEAD.search(text) is not None


def looks_like_health(text: str) -> bool:
    """A `dcgmi health -c` table: its `| Health Monitor Report |` header."""
    return _HEALTH_HEAD.search(text) is not None


def _rows(text: str, head: "re.Pattern[str]", what: str) -> List[Tuple[int, str, Optional[str]]]:
    """(line, name cell and value cell as printed, the value None for a full-width row) of
    every table in the text; a category separator is given as ("-", name). Raises ParseError
    on a table left open."""
    rows: List[Tuple[int, str, Optional[str]]] = []
    inside = False
    last = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not inside:
            if head.match(raw):
                inside, last = True, number
            continue
        last = number
        category = _CATEGORY.match(line)
        if category:
            rows.append((number, "-", category.group(1).strip()))
            continue
        if _BORDER.match(line):
            inside = "=" in line  # `+===+` closes the header, `+---+` the table
            continue
        if not (line.startswith("|") and line.endswith("|") and len(line) >= 2):
            raise ParseError(f"line {number}: not a row of the {what} table: {line[:80]!r}")
        name, sep, value = line[1:-1].partition("|")
        rows.append((number, name, value[1:] if sep else None))
    if inside:
        raise ParseError(f"line {last}: the {what} table has no closing border (cut short?)")
    if not rows:
        raise ParseError(f"line 1: no {what} table")
    return rows


def _join(pieces: List[str]) -> str:
    """A wrapped cell's text. dcgmi cuts the diagnostic's cells at the cell's width, mid-word,
    and the health report's between words: a piece that fills its cell continues on the next
    line without a space."""
    text = ""
    for index, piece in enumerate(pieces):
        if index:
            before = pieces[index - 1]
            text += "" if len(before.rstrip()) >= len(before) - 2 else " "
        text += piece.rstrip()
    return " ".join(text.split())


def _gpus(spec: str, number: int) -> List[int]:
    try:
        return [int(part) for part in spec.split(",") if part.strip()]
    except ValueError:
        raise ParseError(f"line {number}: bad GPU list {spec[:40]!r}") from None


def _result(value: str, number: int) -> Optional[Dict[str, Any]]:
    match = _RESULT.match(value.strip())
    if match:
        gpus = _gpus(match.group(3), number) if match.group(3) else []
        return {"gpus": gpus, "entity": None, "status": status_name(match.group(1))}
    entity = _ENTITY.match(value.strip())
    if entity:
        kind, index = entity.group(1), int(entity.group(2))
        status = status_name(entity.group(3))
        if kind == "GPU":
            return {"gpus": [index], "entity": None, "status": status}
        return {"gpus": [], "entity": f"{kind} {index}", "status": status}
    return None


def parse_diag(text: str) -> Dict[str, Any]:
    """The diagnostic's tests, in the shape parse_dcgm.parse_diag gives for `-j` output."""
    rows = _rows(text, _DIAG_HEAD, "dcgmi diag")
    meta: Dict[str, List[str]] = {}
    tests: List[Dict[str, Any]] = []
    category: Optional[str] = None
    current: Optional[Dict[str, Any]] = None  # the test being read
    pieces: Optional[List[str]] = None  # the cell text being read (metadata or message)
    for number, cell, value in rows:
        name = cell.strip()
        if name == "-":
            category, current, pieces = value, None, None
            continue
        if value is None:
            if name:
                category, current, pieces = name, None, None  # a full-width title row
            continue
        if name in ("Diagnostic",) and value.strip() == "Result":
            continue
        if not name:
            if pieces is not None:
                pieces.append(value)
            elif current is not None:
                found = _result(value, number)
                if found is None:
                    raise ParseError(f"line {number}: not a result of {current['name']!r}")
                _add(current, found)
            continue
        if category == "Metadata" or name in _METADATA:
            pieces = meta.setdefault(name, [value])
            current = None
            continue
        message = _MESSAGE.match(name)
        if message and current is not None:
            target = _target(current)
            pieces = [value]
            key = "info" if message.group(1) == "Info" else "warnings"
            target.setdefault(f"_{key}", []).append(pieces)
            continue
        found = _result(value, number)
        if found is None:
            raise ParseError(f"line {number}: cannot read the result of {name!r}: {value[:80]!r}")
        current = {"category": category, "name": name, "summary": None, "results": []}
        pieces = None
        tests.append(current)
        _add(current, found)
    for test in tests:
        for result in test["results"]:
            for key in ("info", "warnings"):
                result[key] = [_join(p) for p in result.pop(f"_{key}", [])]
    version = _join(meta["DCGM Version"]) if "DCGM Version" in meta else None
    driver = meta.get("Driver Version Detected")
    major = version.split(".")[0] if version else ""
    return {
        "layout": f"{major}.x table" if major.isdigit() else "table",
        "version": version,
        "driver_version": _join(driver) if driver else None,
        "runtime_error": None,
        "tests": tests,
        "gpu_serials": {},
    }


def _add(test: Dict[str, Any], found: Dict[str, Any]) -> None:
    """A result line of a test. In 4.x the test's own line is its summary and the entity lines
    follow: the first entity line replaces a summary-only result."""
    results = test["results"]
    if (
        results
        and not results[0]["gpus"]
        and results[0]["entity"] is None
        and (found["gpus"] or found["entity"])
        and test["summary"] is None
    ):
        test["summary"] = results.pop(0)["status"]
    results.append(found)


def _target(test: Dict[str, Any]) -> Dict[str, Any]:
    """The result a Warning/Info/Error line belongs to: the last one that did not pass."""
    results = test["results"]
    failing = [r for r in results if r["status"] != "Pass"]
    return (failing or results)[-1]


def parse_health(text: str) -> Dict[str, Any]:
    """Overall health and incidents, in the shape parse_dcgm.parse_health gives for `-j`.

    Under a group row (`GPU`) come its entities (`-> 0`, the least indented arrows), each with
    `-> Errors` and its subsystems (`-> Power system`, deeper) whose message is wrapped below.
    """
    rows = _rows(text, _HEALTH_HEAD, "dcgmi health")
    overall: Optional[str] = None
    incidents: List[Dict[str, Any]] = []
    group: Optional[str] = None
    entity: Optional[Dict[str, Any]] = None
    indent: Optional[int] = None  # of the group's entity rows
    pieces: Optional[List[str]] = None
    for number, cell, value in rows:
        name = cell.strip()
        if value is None or name == "-":
            continue
        health = value.strip() or None
        if not name:
            if pieces is not None:
                pieces.append(value)
            elif health:
                raise ParseError(f"line {number}: text under no subsystem: {value[:80]!r}")
            continue
        pieces = None
        if name == "Overall Health":
            if overall is not None:
                raise ParseError(f"line {number}: a second 'Overall Health'")
            overall = health
            continue
        if not name.startswith("->"):
            group, entity, indent = name, None, None
            continue
        label = name[2:].strip()
        depth = len(cell) - len(cell.lstrip())
        if group is None:
            raise ParseError(f"line {number}: {name!r} under no group")
        if indent is None or depth <= indent:
            indent = depth
            entity = {"entity": f"{group} {label}", "system": None, "health": health}
            incidents.append({**entity, "message": None})
        elif label != "Errors":
            if entity is None:
                raise ParseError(f"line {number}: {name!r} under no entity")
            pieces = []
            incidents.append({**entity, "system": label, "health": health, "_pieces": pieces})
    if overall is None:
        raise ParseError("line 1: the dcgmi health table has no 'Overall Health' row")
    # An entity with subsystems under it is their parent, not an incident of its own.
    parents = {i["entity"] for i in incidents if i["system"] is not None}
    found = []
    for incident in incidents:
        if incident["system"] is None and incident["entity"] in parents:
            continue
        if "_pieces" in incident:
            incident["message"] = _join(incident.pop("_pieces")) or None
        found.append(incident)
    return {"overall": overall, "incidents": found}
