"""Saved evidence (logs and tool outputs a node left behind) turned into facts documents.

Recognition is by content, not file name: people paste logs into tickets under any name.
Each family declares the kinds of evidence it reads (`families/<name>/evidence.py`); each kind
knows how to spot itself and how to become facts sections.

A ticket often holds several outputs one after another (`nvidia-smi`, some dmesg lines,
`ibstat`, with a person's sentences between them). The text is cut where an output begins (a
kind's `starts` line, or a shell prompt), each piece is recognised like a file, and each kind
is read once: excerpts of a log kind are joined into one log, two outputs of any other kind
are refused as two files giving the same facts are. What no kind reads is said, never judged.
"""

from __future__ import annotations

import re
import sys
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhealth import registry
from gpuhealth.documents import read_bounded
from gpuhealth.facts import PROBE_VERSION, SCHEMA_VERSION
from gpuhealth.parsing import ParseError
from gpuhealth.registry import Kind

# Pasted logs are kilobytes to megabytes; a kernel log of a whole boot is rarely 100 MB.
MAX_BYTES = 256 * 1024 * 1024
# `gpuhealth triage -`: the evidence comes on standard input.
STDIN = Path("-")

# A shell prompt and the command after it: `$ cmd`, `# cmd`, `user@host:~$ cmd`,
# `[root@host dir]# cmd`, `sh-5.1# cmd`, `(venv) user@host:~$ cmd`. A bare `#` needs one space
# and a lower-case command: nccl-tests' own `#  Rank ...` and `#       size` lines are output.
_PROMPT = re.compile(
    r"[ \t]*(?:\([\w.-]{1,40}\)[ \t]+)?"
    r"(?:(?:\[[^\]\n]{1,100}\]|[\w.-]{1,64}@[\w.-]{1,64}(?::[^\s$#]{0,200})?"
    r"|[\w.-]{1,64}(?::[^\s$#]{0,200})?)[$#][ \t]+|\$[ \t]+|# )"
    r"(?P<command>[a-z./~][^\n]{0,2000})"
)
# A line a person writes around pasted outputs: a sentence or a label ("ibstat:") starting
# with a letter at the margin, a Markdown fence, a prompt run into its command (`#ibv_devinfo`).
_PROSE = re.compile(r"[A-Za-z]|```|~~~|#[A-Za-z]")


class EvidenceError(ValueError):
    """Evidence that cannot be read or recognised; the message names the file (and line)."""


def recognise(path: Path, text: str | None) -> Kind | None:
    """The kind of evidence a file (text) or directory (text None) is, or None."""
    for kind in registry.evidence_kinds():
        if kind.directory == (text is None) and kind.detect(path if text is None else text):
            return kind
    return None


def display(path: Path) -> str:
    """A file's name in messages and reports: standard input is `stdin`."""
    return "stdin" if path == STDIN else str(path)


@dataclass(frozen=True)
class Part:
    """One output found in a file: its kind, the lines it spans (1-based, first and last of
    each excerpt; a prompt line above an output counts as its own) and its text."""

    number: int
    kind: Kind
    spans: tuple[tuple[int, int], ...]
    text: str

    def label(self, name: str) -> str:
        """`ticket.txt part 2 (dmesg, lines 31-44)`: where a finding's evidence came from."""
        return f"{name} part {self.number} ({self.kind.name}, lines {_ranges(self.spans)})"


def _ranges(spans: Iterable[tuple[int, int]]) -> str:
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


@dataclass
class _Piece:
    """Lines first..last (0-based) of a file between two cuts; `body` is where its output may
    begin (after its prompt line), `opener` the kind whose start line began it."""

    first: int
    last: int
    body: int
    opener: Kind | None
    kind: Kind | None = None


def _marks(text: str, lines: list[str]) -> list[Kind | None]:
    """For each line, the kind (first by priority) whose start pattern begins there."""
    offsets, at = [], 0
    for line in lines:
        offsets.append(at)
        at += len(line) + 1
    marks: list[Kind | None] = [None] * len(lines)
    seen: set[int] = set()
    for kind in registry.evidence_kinds():
        if kind.starts is None or id(kind.starts) in seen:
            continue
        seen.add(id(kind.starts))
        for match in kind.starts.finditer(text):
            number = bisect_right(offsets, match.start()) - 1
            marks[number] = marks[number] or kind
    return marks


def _pieces(lines: list[str], marks: list[Kind | None]) -> list[_Piece]:
    """The file cut at prompts and at start lines. A start of the kind that began the piece
    continues it while nothing but its own lines, indented lines and blank lines came between
    (a log's every line is a start; an ibstat's next `CA` is the same output)."""
    pieces = [_Piece(0, -1, 0, None)]
    empty = True  # nothing but blank lines since the piece's body began
    broken = False  # a line at the margin that is no start of the piece's kind came since one
    for number, line in enumerate(lines):
        piece = pieces[-1]
        kind = marks[number]
        if kind is None and _PROMPT.fullmatch(line):
            if empty and piece.body == piece.first:
                piece.body = number + 1
            else:
                pieces.append(_Piece(number, number, number + 1, None))
                empty, broken = True, False
                continue
        elif kind is not None:
            if empty and piece.opener is None:
                piece.opener = kind
            elif kind is not piece.opener or broken:
                pieces.append(_Piece(number, number, number, kind))
            empty = broken = False
        elif line.strip():
            empty = False
            broken = broken or line[0] not in " \t"
        pieces[-1].last = number
    return pieces


def _kind_of(text: str, opener: Kind | None) -> Kind | None:
    """recognise() for a piece, the kinds that share its start pattern tried first."""
    kinds = registry.evidence_kinds()
    first = [k for k in kinds if opener is not None and k.starts is opener.starts]
    for kind in first + [k for k in kinds if all(k is not f for f in first)]:
        if not kind.directory and kind.detect(text):
            return kind
    return None


def _prose(lines: list[str], marks: list[Kind | None], number: int) -> bool:
    """A person's line (or a blank one), not the start of any kind's output."""
    line = lines[number]
    return not line.strip() or (marks[number] is None and _PROSE.match(line) is not None)


def _parsed(kind: Kind, text: str) -> dict[str, Any] | ParseError:
    try:
        return kind.parse(text)
    except ParseError as exc:
        return exc


def _trim(lines: list[str], marks: list[Kind | None], piece: _Piece, kind: Kind) -> tuple[int, int]:
    """The lines of a piece its kind reads: a person's lines before (where no start line began
    it) and after the output are left out where reading without them gives the same facts (or
    facts where with them there were none)."""
    lo, hi = piece.body, piece.last
    while lo <= hi and not lines[lo].strip():
        lo += 1
    while hi >= lo and not lines[hi].strip():
        hi -= 1
    a, b = lo, hi
    if piece.opener is None:
        while a <= b and _prose(lines, marks, a):
            a += 1
    while b >= a and _prose(lines, marks, b):
        b -= 1
    if (a, b) == (lo, hi) or a > b:
        return lo, hi
    whole = _parsed(kind, "\n".join(lines[lo : hi + 1]))
    cut = _parsed(kind, "\n".join(lines[a : b + 1]))
    if isinstance(cut, ParseError) or not (isinstance(whole, ParseError) or whole == cut):
        return lo, hi
    return a, b


@dataclass(frozen=True)
class Split:
    """A file's parts, and the lines (1-based spans) no kind reads."""

    parts: tuple[Part, ...]
    unread: tuple[tuple[int, int], ...]


def split(text: str) -> Split:
    """The outputs one text holds, each with its kind (see the module's docstring)."""
    lines = text.split("\n")
    marks = _marks(text, lines)
    pieces = _pieces(lines, marks)
    read: list[tuple[Kind, int, int, int]] = []  # kind, first line shown, lo, hi
    unread: list[tuple[int, int]] = []
    for piece in pieces:
        lo = piece.body
        kind = _kind_of("\n".join(lines[lo : piece.last + 1]), piece.opener)
        if kind is None:  # a person's sentences above an output with no start line of its own
            while lo <= piece.last and _prose(lines, marks, lo):
                lo += 1
            if piece.body < lo <= piece.last:
                kind = _kind_of("\n".join(lines[lo : piece.last + 1]), None)
        after = read[-1] if read else None
        if kind is None and after and piece.opener and after[0].starts is piece.opener.starts:
            if not any(s.strip() for s in lines[after[3] + 1 : piece.body]):
                read[-1] = (after[0], after[1], after[2], piece.last)  # more of that output
                continue
        if kind is None:
            if any(line.strip() for line in lines[piece.first : piece.last + 1]):
                unread.append((piece.first, piece.last))
            continue
        start, end = _trim(lines, marks, _Piece(piece.first, piece.last, lo, piece.opener), kind)
        shown = piece.first if start == piece.body else start
        if piece.first < shown and any(s.strip() for s in lines[piece.first : shown]):
            unread.append((piece.first, shown - 1))
        if any(s.strip() for s in lines[end + 1 : piece.last + 1]):
            unread.append((end + 1, piece.last))
        if (
            read
            and read[-1][0] is kind
            and not any(s.strip() for s in lines[read[-1][3] + 1 : start])
        ):
            read[-1] = (kind, read[-1][1], read[-1][2], end)  # one output, as in a file
        else:
            read.append((kind, shown, start, end))
    groups: list[list[tuple[Kind, int, int, int]]] = []
    for entry in read:
        same = [
            g for g in groups if entry[0].log and g[0][0].log and g[0][0].parse is entry[0].parse
        ]
        if same:
            same[0].append(entry)
        else:
            groups.append([entry])
    parts = tuple(
        Part(
            number,
            group[0][0],
            tuple((shown + 1, hi + 1) for _, shown, _, hi in group),
            "\n".join("\n".join(lines[lo : hi + 1]) for _, _, lo, hi in group),
        )
        for number, group in enumerate(groups, 1)
    )
    return Split(parts, tuple(_merged(unread, lines)))


def _merged(spans: list[tuple[int, int]], lines: list[str]) -> list[tuple[int, int]]:
    """0-based spans as 1-based ones, blank lines at their ends left out."""
    found = []
    for a, b in sorted(spans):
        while a <= b and not lines[a].strip():
            a += 1
        while b >= a and not lines[b].strip():
            b -= 1
        if a <= b:
            found.append((a + 1, b + 1))
    return found


def _closest(text: str) -> str:
    """What the kinds came closest to reading in a text none of them reads: a kind's start
    line, a prompt that ran a kind's command, or a kind's command named in the text."""
    lines = text.split("\n")
    kinds = [k for k in registry.evidence_kinds() if not k.directory]
    for number, kind in enumerate(_marks(text, lines)):
        if kind is not None:
            return f"line {number + 1} begins {kind.name} output, but what follows is not one"
    for number, line in enumerate(lines):
        prompt = _PROMPT.fullmatch(line)
        words = prompt.group("command").split("|")[0].split() if prompt else []
        if words:
            words[0] = words[0].rsplit("/", 1)[-1]
            runs = " ".join(words)
            named = [k for k in kinds if k.name.split()[0] == words[0]]
            if named:
                best = max(named, key=lambda k: runs.startswith(k.name) * len(k.name))
                return f"line {number + 1} runs {words[0]}, but no {best.name} output follows"
    head = text[:65536]
    for kind in kinds:
        word = kind.name.split()[0]
        if re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", head, re.I):
            return f"it names {word}, but holds no {kind.name} output gpuhealth reads"
    return "no line of it begins an output of any kind"


def _text(path: Path) -> str:
    """A file's text, or standard input's, bounded like every file."""
    try:
        if path == STDIN:
            data = sys.stdin.buffer.read(MAX_BYTES + 1)
            if len(data) > MAX_BYTES:
                raise OSError(f"larger than {MAX_BYTES >> 20} MiB")
            return data.decode("utf-8", errors="replace")
        return read_bounded(path, MAX_BYTES)
    except OSError as exc:
        raise EvidenceError(f"{display(path)}: cannot read: {exc.strerror or exc}") from exc


def _parse(kind: Kind, what: Any, where: str) -> dict[str, Any]:
    try:
        return kind.parse(what)
    except ParseError as exc:
        raise EvidenceError(f"{where}: {exc}") from exc


@dataclass(frozen=True)
class Source:
    """What one file gave: each part (None for a file read whole, as one kind) with its kind
    and facts sections, and the lines no kind reads."""

    name: str
    parts: tuple[tuple[Part | None, Kind, dict[str, Any]], ...]
    unread: tuple[tuple[int, int], ...] = ()


def _read(path: Path) -> Source:
    name = display(path)
    if path != STDIN and path.is_dir():
        kind = recognise(path, None)
        if kind is None:
            known = ", ".join(k.name for k in registry.evidence_kinds())
            raise EvidenceError(f"{name}: not a kind of evidence gpuhealth reads ({known})")
        return Source(name, ((None, kind, _parse(kind, path, name)),))
    text = _text(path)
    found = split(text)
    whole = recognise(path, text)
    one = len(found.parts) == 1 and whole is not None and _same(found.parts[0].kind, whole)
    if whole is not None and (not found.parts or one):  # one kind: read whole, as always
        return Source(name, ((None, whole, _parse(whole, text, name)),))
    if len(found.parts) < 2:  # what no kind reads whole is refused, as always
        known = ", ".join(k.name for k in registry.evidence_kinds())
        raise EvidenceError(
            f"{name}: not a kind of evidence gpuhealth reads (closest: {_closest(text)}; "
            f"kinds read: {known})"
        )
    parts = tuple(
        (part, part.kind, _parse(part.kind, part.text, part.label(name))) for part in found.parts
    )
    return Source(name, parts, found.unread)


def _same(a: Kind, b: Kind) -> bool:
    """One kind, or two formats of one log (read by the same parser)."""
    return a is b or (a.log and b.log and a.parse is b.parse)


def facts_from_files(paths: list[Path], host: str) -> tuple[list[Kind], dict[str, Any]]:
    """One facts document for `host` from evidence files of one node (`-`: standard input).

    Sections no file provides stay null, so their checks report "not evaluated". Each
    `evidence` entry says which file (and part of it) gave which sections.
    """
    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "probe_version": PROBE_VERSION,
        "source": "evidence-file",
        "collected_at": None,
        "duration_s": None,
        "host": {"hostname": host, "kernel": None, "arch": None, "os": None},
        "errors": [],
        "evidence": [],
        "driver": None,
        "pci": {"nvidia_gpus": None},
        "gpu_count": None,
        "gpus": None,
    }
    kinds = []
    provided: dict[str, str] = {}
    for path in paths:
        source = _read(path)
        for part, kind, sections in source.parts:
            where = part.label(source.name) if part else source.name
            kinds.append(kind)
            doc["errors"].extend(sections.pop("errors", []))
            for key, value in sections.items():
                if key in provided and key != "driver":
                    raise EvidenceError(
                        f"{where}: {key} data for {host} already came from {provided[key]}"
                    )
                provided.setdefault(key, where)
                doc[key] = value
            entry: dict[str, Any] = {
                "file": source.name,
                "kind": kind.name,
                "sections": sorted(sections),
            }
            if part:
                entry.update(
                    part=part.number, lines=[list(span) for span in part.spans], label=where
                )
            doc["evidence"].append(entry)
        if source.unread:
            doc["evidence"].append(
                {"file": source.name, "not_read": [list(s) for s in source.unread]}
            )
    return kinds, doc


def facts_from_file(path: Path) -> tuple[Kind, dict[str, Any]]:
    """One evidence file as the facts document of a host named after the file."""
    kinds, doc = facts_from_files([path], path.stem)
    return kinds[0], doc


def described(doc: dict[str, Any]) -> str:
    """What a facts document was read from, file by file: `smi.xml (nvidia-smi -q -x)`, or for
    a ticket `ticket.txt part 1 (nvidia-smi, lines 3-25), part 2 (...); lines 1-2 not read`."""
    files: dict[str, list[str]] = {}
    for entry in doc.get("evidence") or []:
        said = files.setdefault(entry["file"], [])
        if "not_read" in entry:
            spans = [tuple(span) for span in entry["not_read"]]
            many = len(spans) > 1 or spans[0][0] != spans[0][1]
            said.append(f"; {'lines' if many else 'line'} {_ranges(spans)} not read")
        elif "part" in entry:
            lines = _ranges(tuple(span) for span in entry["lines"])
            text = f"part {entry['part']} ({entry['kind']}, lines {lines})"
            said.append(f"{entry['file']} {text}" if not said else f", {text}")
        else:
            said.append(f"{entry['file']} ({entry['kind']})")
    return ", ".join("".join(said) for said in files.values())


def section_sources(doc: dict[str, Any]) -> dict[str, str]:
    """Facts section -> the part of a ticket it came from (`ticket.txt part 2 (dmesg, lines
    31-44)`); sections of files read whole are not listed."""
    found: dict[str, str] = {}
    for entry in doc.get("evidence") or []:
        for section in entry.get("sections", []) if "label" in entry else []:
            found.setdefault(section, entry["label"])
    return found
