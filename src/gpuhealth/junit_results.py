"""JUnit XML for the health suite, streamed to disk test by test by the controller.

pytest's junitxml plugin keeps an element tree of every test case until the end of the run
and reads each test's three reports through its own hooks: at 135,000 tests that is the
biggest cost of a run after pytest itself, and a few hundred MB. The suite's Reporter already
folds each test's phases into one outcome, so it writes the same xunit2 document pytest would
(`--junitxml`, `junit_suite_name`; one `testcase` per test with `failure`, `error` or
`skipped`) as it goes, and wraps it with the counts when the run ends.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

# Characters XML 1.0 cannot hold (evidence quoted in messages may carry any byte).
_ILLEGAL = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ATTRIBUTE = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        '"': "&quot;",
        "\n": "&#10;",
        "\r": "&#13;",
        "\t": "&#9;",
    }
)
_TEXT = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


# Text that needs no escaping anywhere (what a test id nearly always is).
_PLAIN = re.compile(r"[ !#-%'-;=?-~]*")


def _legal(text: str) -> str:
    return _ILLEGAL.sub(lambda m: f"#x{ord(m.group()):02X}", text)


def attribute(text: str) -> str:
    """Text as a double-quoted XML attribute value."""
    if _PLAIN.fullmatch(text):
        return text
    return _legal(text).translate(_ATTRIBUTE)


@functools.lru_cache(maxsize=1024)
def _classname(path: str) -> str:
    """A test file's `classname` attribute (`tests/test_gpu.py`: `tests.test_gpu`)."""
    return attribute(path.removesuffix(".py").replace("/", "."))


def content(text: str) -> str:
    """Text as XML element content."""
    return _legal(text).translate(_TEXT)


class JUnitResults:
    """One JUnit XML file; test cases go to a spool file next to it until `close`."""

    def __init__(self, path: Path, suite: str) -> None:
        self.path = path
        self.suite = suite
        path.parent.mkdir(parents=True, exist_ok=True)
        self._spool = tempfile.TemporaryFile("w+", encoding="utf-8", dir=path.parent)
        self._started = time.time()
        self.counts = {"errors": 0, "failures": 0, "skipped": 0, "tests": 0}

    def case(self, nodeid: str, seconds: float, kind: str | None, message: str, text: str) -> None:
        """One test: passed (`kind` None) or with its failure, error or skip."""
        path, _, name = nodeid.partition("::")
        self.counts["tests"] += 1
        head = (
            f'<testcase classname="{_classname(path)}" name="{attribute(name)}" '
            f'time="{seconds:.3f}"'
        )
        if kind is None:
            self._spool.write(head + " />")
            return
        self.counts[{"failure": "failures", "error": "errors", "skipped": "skipped"}[kind]] += 1
        extra = ' type="pytest.skip"' if kind == "skipped" else ""
        self._spool.write(
            f'{head}><{kind}{extra} message="{attribute(message)}">{content(text)}'
            f"</{kind}></testcase>"
        )

    def close(self) -> None:
        """Write the document (atomically: a temporary name, then renamed)."""
        stamp = datetime.fromtimestamp(self._started, timezone.utc).isoformat()
        counts = " ".join(f'{k}="{v}"' for k, v in self.counts.items())
        head = (
            '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
            f'<testsuite name="{attribute(self.suite)}" {counts} '
            f'time="{time.time() - self._started:.3f}" timestamp="{stamp}" '
            f'hostname="{attribute(socket.gethostname())}">'
        )
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as out:
            out.write(head)
            self._spool.seek(0)
            while chunk := self._spool.read(1 << 20):
                out.write(chunk)
            out.write("</testsuite></testsuites>\n")
        self._spool.close()
        tmp.replace(self.path)
