"""Allure results written by gpuhealth itself: one result file per test, one facts attachment
per host, from the outcomes the plugin already collects.

allure-pytest's listener follows every test and fixture through a dozen hooks and writes a
result plus container files for each (about 4 files per test): at fleet scale most of the
offline judging time. The health suite knows everything a result needs (host, GPU, check,
family, severity, profile, GPU serial) when a test ends, so the controller writes each result
once, in the format of allure-commons' model (what Allure 2 and 3 read), and allure-pytest
only parses `--alluredir` / `--clean-alluredir`.

Creating a file costs this machine 40-500 us (ext4; the most soon after many files were
deleted), about what pytest spends on a whole trivial test. So the controller hands the files to a
writer process (gpuhealth.allure_writer; a thread would fight the suite for the GIL) through
a pipe and goes on; `close` waits for it. A folder to clean is renamed away at once and
deleted by the writer at the end.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _text
from pathlib import Path
from typing import Any

from allure_commons.utils import md5

from gpuhealth import allure_writer
from gpuhealth.results import ACTION_MEANINGS, Action

# Allure's statuses; a WARN finding is a passed test with its message and a WARN tag.
PASSED, FAILED, BROKEN, SKIPPED = "passed", "failed", "broken", "skipped"
_TYPES = {
    "json": "application/json",
    "text": "text/plain",
    "html": "text/html",
    "png": "image/png",
}


@dataclass(slots=True)
class Case:
    """One finished test as Allure shows it."""

    nodeid: str
    name: str
    status: str
    message: str
    trace: str
    start_ms: int
    stop_ms: int
    labels: list[tuple[str, str]]
    parameters: list[tuple[str, str]]
    description: str
    attachments: list[dict[str, str]]


@dataclass(frozen=True)
class _Function:
    """What every result of one test function shares: its fullName, testCaseId and
    titlePath, as the JSON fragment each of its results carries, and the md5 state of its
    historyId before the parameters are added."""

    full_name: str
    head: str  # `"testCaseId": ..., "fullName": ..., "titlePath": [...]`
    history: Any  # hashlib's md5 of the fullName, copied for each result


@functools.lru_cache(maxsize=4096)
def _function(path: str, test: str) -> _Function:
    full = f"{path.removesuffix('.py').replace('/', '.')}#{test}"
    title = [p for p in path.split("/") if p]
    head = (
        f'"testCaseId": {_text(md5(full))}, "fullName": {_text(full)}, '
        f'"titlePath": {json.dumps(title)}'
    )
    return _Function(full, head, hashlib.md5(full.encode()))


def _identity(nodeid: str) -> _Function:
    """A test's fullName, testCaseId and titlePath as allure-pytest makes them (so history
    and test ids carry over from reports it wrote): `tests/test_gpu.py::test_ecc_errors[..]`
    is `tests.test_gpu#test_ecc_errors`. One test function's are computed once."""
    path, _, test = nodeid.partition("::")
    return _function(path, test.partition("[")[0])


@functools.lru_cache(maxsize=1 << 14)
def _pair(name: str, value: str) -> str:
    """`{"name": ..., "value": ...}` as json.dumps writes it: a fleet's labels and
    parameters repeat (host, check, suite, profile), each is encoded once."""
    return f'{{"name": {_text(name)}, "value": {_text(value)}}}'


class AllureResults:
    """The Allure results folder of a run (`--alluredir`), written by its controller; xdist
    workers only write attachments into it."""

    def __init__(self, directory: Path, clean: bool, background: bool) -> None:
        self._files = allure_writer.Files(directory)
        self._problem: str | None = None
        # Result uuids: a random one per run with its last 48 bits counting the results (a
        # uuid4 per test costs more than the rest of its result's JSON).
        self._uuid_prefix = str(uuid.uuid4())[:24]
        self._count = 0
        # Old folders (this run's, an earlier run's) are the writer's to delete: workers, which
        # have none, leave them alone.
        old = list(directory.parent.glob(f".{directory.name}.old-*")) if background else []
        if clean and directory.is_dir():
            old.append(directory.with_name(f".{directory.name}.old-{uuid.uuid4().hex[:8]}"))
            directory.rename(old[-1])
        directory.mkdir(parents=True, exist_ok=True)
        self._writer: subprocess.Popen[bytes] | None = None
        if background:
            command = [sys.executable, "-I", allure_writer.__file__, str(directory)]
            self._writer = subprocess.Popen(
                [*command, *map(str, old)],
                stdin=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=1 << 20,
                # Its own session: ^C stops the suite, not the writer, which writes what it was
                # sent (the interrupted run's reports) and ends at the end of its input.
                start_new_session=True,
            )

    def _put(self, name: str, body: bytes) -> None:
        writer = self._writer
        if writer is None or writer.stdin is None:
            self._files.write(name, body)
            return
        try:
            writer.stdin.write(f"{name} {len(body)}\n".encode() + body)
        except OSError as exc:  # the writer died: say so at the end, write the rest here
            self._problem = (
                f"Allure writer process died ({exc}): results before that may be missing, "
                "the rest were written by the suite itself"
            )
            self._writer = None
            self._files.write(name, body)

    def attach(self, body: str | bytes, name: str, kind: str) -> dict[str, str]:
        """Write an attachment (`json`, `text`, `html` or `png`); the reference a result
        lists."""
        source = f"{uuid.uuid4()}-attachment.{'txt' if kind == 'text' else kind}"
        self._put(source, body.encode() if isinstance(body, str) else body)
        return {"name": name, "source": source, "type": _TYPES[kind]}

    def write(self, case: Case) -> None:
        """One test's result file: the fields of allure-commons' TestResult model (checked
        against it by the tests), written as json.dumps would write them (the tests hold it
        to that) from fragments each test function, label and parameter encodes once: at
        ~180,000 tests per run even json.dumps of the plain dict costs seconds."""
        function = _identity(case.nodeid)
        self._count += 1
        uuid_ = f"{self._uuid_prefix}{self._count:012x}"
        history = function.history.copy()
        for _, value in sorted(case.parameters):
            history.update(value.encode())
        labels = ", ".join([_pair(n, v) for n, v in case.labels])
        params = ", ".join([_pair(n, v) for n, v in case.parameters])
        text = (
            f'{{"uuid": "{uuid_}", "historyId": "{history.hexdigest()}", {function.head}, '
            f'"name": {_text(case.name)}, "status": {_text(case.status)}, '
            f'"stage": "finished", "start": {case.start_ms}, "stop": {case.stop_ms}, '
            f'"labels": [{labels}], "parameters": [{params}]'
        )
        if case.message or case.trace:
            details = {"message": case.message, "trace": case.trace}
            text += f', "statusDetails": {json.dumps({k: v for k, v in details.items() if v})}'
        if case.description:
            text += f', "description": {_text(case.description)}'
        if case.attachments:
            text += f', "attachments": {json.dumps(case.attachments)}'
        self._put(f"{uuid_}-result.json", (text + "}").encode())

    def finish(
        self, environment: Iterable[tuple[str, str]], overview: str, trends: bytes | None = None
    ) -> None:
        """What the whole run comes to: categories.json (one category per action code), the
        environment (shown as the report's metadata, at the top of its page) and `overview`,
        an HTML page attached to the run (the report's Global Attachments tab), with the
        history's `trends` plot (a PNG) when there is one."""
        categories = [
            {
                "name": name,
                **({"messageRegex": message} if message else {}),
                "matchedStatuses": [status],
            }
            for name, status, _, message in CATEGORIES
        ]
        self._put("categories.json", json.dumps(categories).encode())
        lines = [f"{_escape(k, key=True)}={_escape(v)}" for k, v in environment]
        lines.append(f"python={platform.python_version()}")
        self._put("environment.properties", ("\n".join(lines) + "\n").encode())
        pages = [self.attach(overview, "gpuhealth fleet overview", "html")]
        if trends is not None:
            pages.append(self.attach(trends, "gpuhealth history trends (30 days)", "png"))
        run = uuid.uuid4()
        stamp = int(time.time() * 1000)
        globals_ = {"attachments": [{**p, "timestamp": stamp} for p in pages], "errors": []}
        self._put(f"{run}-globals.json", json.dumps(globals_).encode())

    def close(self) -> str | None:
        """Wait until every file is written; what could not be, or None when all were."""
        writer, self._writer = self._writer, None
        problems = [self._problem]
        if writer is not None and writer.stdin is not None:
            try:
                writer.stdin.close()
            except OSError as exc:
                problems.append(f"Allure writer process died ({exc}): results may be missing")
            error = writer.stderr.read().decode(errors="replace").strip() if writer.stderr else ""
            if writer.wait() != 0:
                problems.append(error or f"Allure writer process exited {writer.returncode}")
        problems.append(self._files.problem())
        found = [p for p in problems if p]
        return "; ".join(found) if found else None


# The report's categories, most drastic first: one per action code (by the `action` label of
# failed tests), unreachable hosts, then checks that could not run. Allure 2 reads them from
# the results (categories.json), Allure 3 from its config (allurerc.json, report_config).
CATEGORIES = [
    *(
        (f"{a.value}: {ACTION_MEANINGS[a]}", FAILED, a.value, rf"(?s).*\. Action {a.value}\b.*")
        for a in Action
        if a is not Action.NONE
    ),
    ("Unreachable hosts", BROKEN, None, "(?s)host unreachable: .*"),
    ("Checks that could not run", BROKEN, None, None),
]


def report_config() -> dict[str, Any]:
    """Allure 3's configuration for the health suite's report (the repository's
    allurerc.json, which `make report` passes to `allure awesome`)."""
    rules = []
    for name, status, action, message in CATEGORIES:
        matchers: dict[str, Any] = {"statuses": [status]}
        if action:
            matchers["labels"] = {"action": f"^{action}$"}
        elif message:
            matchers["message"] = message.removeprefix("(?s)")
        rules.append(
            {
                "name": name,
                "matchers": matchers,
                "groupBy": [{"label": "host"}],
                "groupByMessage": False,
            }
        )
    return {"name": "gpuhealth", "categories": {"rules": rules}}


def _escape(value: str, key: bool = False) -> str:
    """A key or value for a .properties file (backslashes, line breaks; in keys, the spaces,
    `=` and `:` that would end the key)."""
    text = value.replace("\\", "\\\\").replace("\n", "\\n")
    if key:
        for char in " =:":
            text = text.replace(char, f"\\{char}")
    return text
