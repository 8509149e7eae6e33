"""Masking secrets in text before it leaves the node (`gpuhealth bundle`).

A bundle goes into tickets, so a token that a launcher's argument, a process name or a log line
carried must not go with it. Each pattern keeps its key (`--token=`, `AWS_SECRET_ACCESS_KEY=`,
`Bearer `) and replaces only the value, so the text still shows that something was there; the
counts say what was masked, never the values.

A value stops at whitespace, quotes, `<`, `>` and backslashes, so masking a value inside a JSON
string or an XML element keeps the document well-formed.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

MASK = "[REDACTED]"
_VALUE = r"[^\s\"'<>\\]+"
# Words that make a key a secret's: `--api-key`, `HF_TOKEN`, `db_password`, `client-secret`.
_WORD = (
    r"(?:token|secret|passw(?:or)?d|pwd|api[-_]?key|access[-_]?key|private[-_]?key|credentials?)"
)
# Bounded on both sides of the word: two unbounded runs would backtrack against each other
# (quadratic on a long line of word characters).
_KEY = rf"[\w.-]{{0,64}}{_WORD}[\w.-]{{0,64}}"

# Every pattern has three groups: what comes before the value (kept), the value (masked), and
# what follows it (kept).
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "private key",
        re.compile(
            # The body never runs past another "-----": a BEGIN without its END costs the text
            # up to the next armour line, not the rest of the text.
            r"(-----BEGIN [A-Z ]{0,32}PRIVATE KEY-----)((?:[^-]|-(?!----))*?)"
            r"(-----END [A-Z ]{0,32}PRIVATE KEY-----)"
        ),
    ),
    # --token=x, --token x, -password=x (a dash that starts a word: not "non-token")
    ("secret option", re.compile(rf"(?i)((?<![\w-])--?{_KEY}(?:=|\s+))({_VALUE})()")),
    # AWS_SECRET_ACCESS_KEY=x, password=x, db.password: x
    ("secret assignment", re.compile(rf"(?i)((?<![\w.-]){_KEY}\s*[=:]\s*)({_VALUE})()")),
    # "password": "x" in JSON (a number or null after such a key is no secret, and stays)
    ("secret json value", re.compile(rf'(?i)("{_KEY}"\s*:\s*")((?:[^"\\]|\\.)+)(")')),
    (
        "authorization",
        re.compile(
            r"(?i)(\bauthorization:\s*(?:bearer\s+|basic\s+)?|\bbearer\s+)([\w.~+/=-]{8,})()"
        ),
    ),
    (
        "url credentials",
        re.compile(r"((?<![a-z0-9+.-])[a-z][a-z0-9+.-]{0,32}://[^\s:/@\"'<>]+:)([^\s@/\"'<>]+)(@)"),
    ),
    ("aws access key id", re.compile(r"(\b)((?:AKIA|ASIA)[0-9A-Z]{16})(\b)")),
    # Starts only where no word character precedes: a run of "eyJ-" is one start, not many.
    ("jwt", re.compile(r"()((?<![\w-])eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,})()")),
    (
        "vendor token",
        re.compile(
            r"(\b)(gh[pousr]_[A-Za-z0-9]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|hf_[A-Za-z0-9]{20,})()"
        ),
    ),
)


def _masker(counts: Counter[str], name: str) -> Callable[[re.Match[str]], str]:
    def mask(match: re.Match[str]) -> str:
        if match.group(2) == MASK:  # masked already by an earlier pattern
            return match.group(0)
        counts[name] += 1
        return match.group(1) + MASK + match.group(3)

    return mask


def redact(text: str) -> tuple[str, dict[str, int]]:
    """The text with every secret value masked, and how many of each pattern were masked."""
    counts: Counter[str] = Counter()
    for name, pattern in PATTERNS:
        text = pattern.sub(_masker(counts, name), text)
    return text, dict(counts)
