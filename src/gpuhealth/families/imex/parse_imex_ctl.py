"""`nvidia-imex-ctl -N`: every node of an IMEX domain, their connections and the domain state.

    Connectivity Table Legend:
    I - Invalid - Node wasn't reachable, no connection status available
    ...
    5/12/2025 06:08:10.580
    Nodes:
    Node #0   - 172.31.48.81    - READY                - Version: 570.172
    Node #1   - 172.31.48.98    - READY                - Version: 570.172

     Nodes From\\To  0   1
           0        C   C
           1        C   C

    Domain State: UP

Older releases (IMEX 570.00, seen on GH200) print no `Version:` column and no `!V!`/`!M!`
legend lines. Text before
the node list is skipped (a pasted log may start with its shell prompt); when the text holds
several status blocks (`nvidia-imex-ctl -n` repeats them), the last one is read.

Fail closed: a node list, table header or row that cannot be read, a table with fewer rows or
cells than nodes, or one whose columns are not the nodes listed is a ParseError. A field the
tool left out (a node's state, the domain state) is null with the reason, never READY or UP.
"""

import re
from typing import Any, Dict, List, Optional, Tuple

from gpuhealth.facts import Unavailable, why
from gpuhealth.parsing import ParseError

READY = "READY"
UP = "UP"
CONNECTED = "C"
# The connection codes of the table, as the tool's legend explains them.
CONNECTION_CODES = {
    "C": "connected",
    "I": "invalid: node not reachable, no connection status",
    "N": "never connected",
    "R": "recovering: connection lost, clean-up not yet triggered",
    "D": "disconnected: connection lost and cleaned up",
    "A": "authenticating",
    "!V!": "version mismatch, communication disabled",
    "!M!": "node map mismatch, communication disabled",
}
# Bounded patterns only: fuzzed lines carry 120,000 spaces between words.
_GAP = r"[ \t]{1,64}"
_NODE = re.compile(
    r"Node #([0-9]{1,6})"
    r"(?:" + _GAP + r"-" + _GAP + r"([0-9A-Za-z.:_%\[\]-]{1,255})"  # address (or host name)
    r"(?:" + _GAP + r"-(?:" + _GAP + r"([A-Z][A-Z_]{0,39}))?"  # state
    r"(?:" + _GAP + r"-" + _GAP + r"Version:(?:[ \t]{0,64}([0-9A-Za-z._-]{1,64}))?)?"
    r")?)?[ \t]{0,64}"
)
_HEADER = re.compile(r"[ \t]{0,64}Nodes From\\To(?=[ \t]|$)")
_INDEX = re.compile(r"[0-9]{1,6}")
_CELL = re.compile(r"[A-Z]|![A-Z]!")
_DOMAIN = re.compile(r"Domain State:(?:[ \t]{0,64}([A-Z][A-Z_]{0,39}))?[ \t]{0,64}")
_STAMP = re.compile(r"[0-9]{1,2}/[0-9]{1,2}/[0-9]{4} [0-9]{1,2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?")


def _shown(line: str) -> str:
    return repr(line.strip()[:80])


def _node(number: int, line: str) -> Dict[str, Any]:
    match = _NODE.fullmatch(line)
    if match is None:
        raise ParseError(f"line {number}: not an IMEX node line: {_shown(line)}")
    index, address, state, version = match.groups()
    record: Dict[str, Any] = {
        "index": int(index),
        "address": address,
        "state": state,
        "version": version,
    }
    missing: Dict[str, Unavailable] = {}
    if address is None:
        missing["address"] = why("error", f"line {number}: the node line gives no address")
    if state is None:
        missing["state"] = why("error", f"line {number}: the node line gives no state")
    if missing:
        record["unavailable"] = missing
    return record


def _nodes(lines: List[str], start: int) -> Tuple[List[Dict[str, Any]], int, List[str]]:
    """The node lines after `Nodes:` (at lines[start]), where the table header is, and the
    header's column labels."""
    nodes: List[Dict[str, Any]] = []
    seen = set()
    for at in range(start + 1, len(lines)):
        line = lines[at]
        if not line.strip():
            continue
        header = _HEADER.match(line)
        if header:
            if not nodes:
                raise ParseError(f"line {start + 1}: 'Nodes:' lists no node")
            return nodes, at, line[header.end() :].split()
        record = _node(at + 1, line)
        if record["index"] in seen:
            raise ParseError(f"line {at + 1}: node #{record['index']} listed twice")
        seen.add(record["index"])
        nodes.append(record)
    raise ParseError(f"no connection table after the {len(nodes)} nodes listed (output cut short?)")


def _table(
    lines: List[str], header: int, columns: List[str], nodes: List[Dict[str, Any]]
) -> Tuple[List[List[str]], int]:
    """The connection rows (in node order) and the line after the last one."""
    indices = [n["index"] for n in nodes]
    if not all(_INDEX.fullmatch(c) for c in columns) or [int(c) for c in columns] != indices:
        raise ParseError(
            f"line {header + 1}: table columns {' '.join(columns)[:80]!r} are not the "
            f"{len(nodes)} nodes listed"
        )
    rows: List[List[str]] = []
    at = header + 1
    while len(rows) < len(indices):
        while at < len(lines) and not lines[at].strip():
            at += 1
        expected = indices[len(rows)]
        if at == len(lines) or not _INDEX.fullmatch(lines[at].split()[0]):
            raise ParseError(
                f"connection table cut short: {len(rows)} of {len(indices)} rows, "
                f"no row for node #{expected}"
            )
        cells = lines[at].split()
        if int(cells[0]) != expected:
            raise ParseError(f"line {at + 1}: row of node #{cells[0]}, expected #{expected}")
        cells = cells[1:]
        if len(cells) != len(indices):
            raise ParseError(
                f"line {at + 1}: row of node #{expected} has {len(cells)} cells, expected "
                f"{len(indices)} (output cut short?)"
            )
        bad = [c for c in cells if not _CELL.fullmatch(c)]
        if bad:
            raise ParseError(f"line {at + 1}: not a connection code: {bad[0][:20]!r}")
        rows.append(cells)
        at += 1
    return rows, at


def _domain_state(lines: List[str], at: int) -> Tuple[Optional[str], Optional[Unavailable]]:
    """The `Domain State:` line that follows the table, or null and why."""
    while at < len(lines) and not lines[at].strip():
        at += 1
    if at == len(lines):
        return None, why("error", "no 'Domain State:' line after the table (output cut short?)")
    match = _DOMAIN.fullmatch(lines[at])
    if match is None:
        raise ParseError(f"line {at + 1}: expected 'Domain State:', got {_shown(lines[at])}")
    if match.group(1) is None:
        return None, why("error", f"line {at + 1}: 'Domain State:' gives no state")
    return match.group(1), None


def _timestamp(lines: List[str], start: int) -> Optional[str]:
    """The time the tool prints right above `Nodes:`, when it is there."""
    for at in range(start - 1, -1, -1):
        if lines[at].strip():
            stamp = lines[at].strip()
            return stamp if _STAMP.fullmatch(stamp) else None
    return None


def parse(text: str) -> Dict[str, Any]:
    """The last status block of `nvidia-imex-ctl -N` output.

    `nodes`: index, address, state and version (null when the release prints none) of each
    node; `connections[i][j]`: the code of the connection from nodes[i] to nodes[j];
    `domain_state`: UP, DEGRADED, DOWN, ... Raises ParseError naming the line.
    """
    lines = text.splitlines()
    starts = [at for at, line in enumerate(lines) if line.strip() == "Nodes:"]
    if not starts:
        raise ParseError("no 'Nodes:' list: not nvidia-imex-ctl -N output")
    start = starts[-1]
    nodes, header, columns = _nodes(lines, start)
    connections, after = _table(lines, header, columns, nodes)
    domain_state, missing = _domain_state(lines, after)
    unavailable: Dict[str, Unavailable] = {}
    if missing is not None:
        unavailable["domain_state"] = missing
    # Older releases print no versions at all; a version missing where other nodes have one
    # is damage.
    printed = any(n["version"] is not None for n in nodes)
    for record in nodes:
        if record["version"] is None:
            gap = (
                why("error", f"node #{record['index']}: no version, where others have one")
                if printed
                else why("not_supported", "this nvidia-imex-ctl prints no versions")
            )
            record.setdefault("unavailable", {})["version"] = gap
    return {
        "timestamp": _timestamp(lines, start),
        "nodes": nodes,
        "connections": connections,
        "domain_state": domain_state,
        "unavailable": unavailable,
    }
