"""Mutations of real tool output for the fuzz tests: hypothesis strategies over a seed text.

Two families of mutation. `mutated` does anything that real-world damage or hostility does to
a file: lines lost, doubled, cut or swapped, values replaced by N/A, negative, NaN, 5,000-digit
or empty ones, 100 KB lines with runs of spaces, deep nesting, NUL bytes. `garbled` only
destroys: lines deleted, cut or spoiled with junk, never a value replaced by another valid one,
so whatever it does to a fault, a check that then says PASS has passed without evidence.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

# Values a parser must survive in place of any token.
JUNK = (
    "N/A",
    "[Not Supported]",
    "[Unknown Error]",
    "Requested functionality has been deprecated",
    "-2",
    "-1",
    "nan",
    "-nan",
    "inf",
    "1e400",
    "9" * 5000,
    "0x",
    "",
    " " * 3000,
    "\x00",
    "\ufffd\u202e",
    "{",
    "]",
    "<",
    "&amp;",
    ":",
    "#",
)
# Whole lines that stress patterns: long runs of spaces between words (quadratic regexes),
# long digit runs, deep nesting of JSON, XML and indentation.
LONG_LINES = (
    "a" + " " * 120_000 + "b",
    "#  Rank  0 Pid 1 on h device 0 [0x1] a" + " " * 120_000 + "b",
    "NVRM: Xid (PCI:0000:19:00): " + " " * 120_000 + "x",
    " " * 60_000 + ": " + " " * 60_000,
    "1 " * 60_000,
    "9" * 120_000,
    "[" * 50_000,
    "<a>" * 20_000,
    "".join(" " * depth + "x\n" for depth in range(0, 4000, 2)),
)


@st.composite
def mutated(draw: st.DrawFn, seed: str) -> str:
    """The seed after one to four mutations of any kind."""
    lines = seed.splitlines(keepends=True) or [""]
    for _ in range(draw(st.integers(1, 4))):
        op = draw(
            st.sampled_from(
                ("delete", "duplicate", "cut", "swap", "token", "flip", "insert", "truncate")
            )
        )
        at = draw(st.integers(0, len(lines) - 1)) if lines else 0
        if op == "delete" and len(lines) > 1:
            del lines[at]
        elif op == "duplicate":
            lines.insert(at, lines[at])
        elif op == "cut":
            lines[at] = lines[at][: draw(st.integers(0, len(lines[at])))]
        elif op == "swap" and len(lines) > 1:
            other = draw(st.integers(0, len(lines) - 1))
            lines[at], lines[other] = lines[other], lines[at]
        elif op == "token":
            lines[at] = _replace_token(draw, lines[at], draw(st.sampled_from(JUNK)))
        elif op == "flip" and lines[at]:
            pos = draw(st.integers(0, len(lines[at]) - 1))
            char = draw(st.characters(codec="utf-8", exclude_characters="\r\n"))
            lines[at] = lines[at][:pos] + char + lines[at][pos + 1 :]
        elif op == "insert":
            lines.insert(at, draw(st.sampled_from(LONG_LINES)) + "\n")
        elif op == "truncate":
            text = "".join(lines)
            lines = [text[: draw(st.integers(0, len(text)))]] or [""]
    return "".join(lines)


@st.composite
def garbled(draw: st.DrawFn, seed: str, protect: str | None = None) -> str:
    """The seed after one to four destructive mutations (see the module's docstring). The text
    `protect` is left whole where it stands (lines around it may be cut, spoiled, deleted): for
    evidence without an end marker, such as a kernel log, a log whose fault line is gone or
    mangled beyond recognition is a clean log, and nothing could tell otherwise."""
    lines = seed.splitlines(keepends=True) or [""]
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(("delete", "cut", "junk", "truncate", "duplicate")))
        at = draw(st.integers(0, len(lines) - 1))
        line = lines[at]
        # Where in this line a cut or an insertion may fall without touching `protect`.
        start = line.find(protect) if protect else -1
        floor = start + len(protect) if protect and start >= 0 else 0
        if op == "delete" and len(lines) > 1 and start < 0:
            del lines[at]
        elif op == "cut":
            lines[at] = line[: draw(st.integers(floor, max(len(line) - 1, floor)))] + "\n"
        elif op == "junk":
            pos = draw(st.integers(0, len(line)))
            if start < 0 or not start < pos < floor:
                junk = draw(st.sampled_from(("#?!", "\x00", "@@", "%%", "[[", "</>", "\ufffd")))
                lines[at] = line[:pos] + junk + line[pos:]
        elif op == "truncate":
            text = "".join(lines)
            start = text.find(protect) if protect else -1
            floor = start + len(protect) if protect and start >= 0 else 0
            lines = [text[: draw(st.integers(floor, max(len(text) - 1, floor)))]] or [""]
        elif op == "duplicate":
            lines.insert(at, line)
    return "".join(lines)


def _replace_token(draw: st.DrawFn, line: str, value: str) -> str:
    tokens = line.split(" ")
    at = draw(st.integers(0, len(tokens) - 1))
    tokens[at] = value
    return " ".join(tokens)


_HUGE = "<a 5,000-digit integer>"


@st.composite
def mutated_json(draw: st.DrawFn, seed: str) -> str:
    """The seed's JSON with one node swapped for a value of the wrong shape, or nested deep."""
    doc = json.loads(seed)
    paths = list(_paths(doc))
    path = draw(st.sampled_from(paths))
    replacement = draw(
        st.sampled_from(
            (
                None,
                [],
                {},
                "",
                "N/A",
                -1,
                _HUGE,
                1e308,
                [None],
                {"x": None},
                True,
                [[[[]]]],
            )
        )
    )
    if path:
        _set(doc, path, replacement)
    else:
        doc = replacement
    # json cannot write a 5,000-digit integer (int->str limit): put it in after.
    text = json.dumps(doc, default=str).replace(json.dumps(_HUGE), "9" * 5000)
    if draw(st.booleans()):
        return text
    depth = draw(st.sampled_from((10, 1000, 100_000)))
    return "[" * depth + text + "]" * depth


def _paths(node: Any, prefix: tuple = ()) -> Any:
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for index, value in enumerate(node[:20]):
            yield from _paths(value, (*prefix, index))


def _set(doc: Any, path: tuple, value: Any) -> None:
    for step in path[:-1]:
        doc = doc[step]
    doc[path[-1]] = value


# Values a facts document's field may hold after damage, a hand edit or another tool's export:
# every JSON type, numbers no sink can store (beyond 64 bits, NaN and infinities, which Python's
# json reads), negatives, NaN-like strings, an overlong string and deep nesting.
FACT_VALUES: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    -1,
    -(2**63) - 1,
    2**64,
    10**30,
    1.5,
    -0.5,
    1e308,
    float("nan"),
    float("inf"),
    "",
    "x",
    "N/A",
    "nan",
    "-1",
    "[Not Supported]",
    "9" * 40,
    "a" * 200_000,
    [],
    ["x"],
    [None],
    [{}],
    {},
    {"x": None},
    {"skipped": 1},
    [[[[]]]],
)


def _nested(depth: int) -> Any:
    found: Any = "x"
    for level in range(depth):
        found = [found] if level % 2 else {"x": found}
    return found


@st.composite
def mutated_facts(draw: st.DrawFn, doc: dict[str, Any], protect: tuple = ()) -> dict[str, Any]:
    """A copy of facts document `doc` after one to four mutations of its values and structure:
    a field given a value of another type or an impossible one (FACT_VALUES, or 60 levels of
    nesting), a key deleted inside its section, an element dropped from a list. The field at
    path `protect`, and the path leading to it, are left alone: for a fault's evidence."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 4))):
        paths = [
            path
            for path in _paths(doc)
            if path != protect[: len(path)] and not (protect and path[: len(protect)] == protect)
        ]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(("value", "value", "value", "delete", "nest")))
        parent = doc
        for step in path[:-1]:
            parent = parent[step]
        if op == "delete":
            del parent[path[-1]]
        elif op == "nest":
            parent[path[-1]] = _nested(60)
        else:
            parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(FACT_VALUES)))
    return doc
