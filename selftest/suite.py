"""Run the real health suite (../tests with ../pytest.ini) in a subprocess and read its reports.

Subprocesses, not pytester: the suite must be exercised exactly as users run it, with its own
ini file, plugins, xdist workers and report files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuhealth.transport import ProbeCall

REPO = Path(__file__).resolve().parent.parent
# The test being run (set by conftest.py), so that run_suite can insist on its marker.
CURRENT: list[Any] = [None]


@dataclass
class SuiteRun:
    """The outcome of one suite run: exit code, output and parsed reports."""

    rc: int
    output: str
    reports: Path

    @property
    def verdicts(self) -> dict[str, Any]:
        return json.loads((self.reports / "verdicts.json").read_text())

    def outcomes(self) -> dict[str, str]:
        """Test id -> passed/failed/skipped/error, from the JUnit XML."""
        tree = ET.parse(self.reports / "junit.xml")
        result = {}
        for case in tree.iter("testcase"):
            name = case.get("name", "")
            status = "passed"
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    status = {"failure": "failed"}.get(child.tag, child.tag)
            result[name] = status
        return result

    def messages(self) -> dict[str, str]:
        """Test id -> failure/skip message, from the JUnit XML."""
        tree = ET.parse(self.reports / "junit.xml")
        found = {}
        for case in tree.iter("testcase"):
            for child in case:
                if child.tag in ("failure", "error", "skipped"):
                    found[case.get("name", "")] = child.get("message", "") + (child.text or "")
        return found


def run_suite(
    reports: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 300,
    cwd: Path = REPO,
    ini: bool = True,
) -> SuiteRun:
    """Run `pytest` on the health suite with all report files under `reports`: from the
    checkout, naming the suite's ini file and tests, unless `cwd`/`ini` say otherwise (`ini`
    False: neither, as a user who just types `pytest` somewhere).

    Only from a test marked `suite` (or `bed`): `-m "not suite"` must leave out every slow one."""
    item = CURRENT[0]
    if item is not None and not any(item.get_closest_marker(m) for m in ("suite", "bed")):
        raise AssertionError(f"{item.nodeid} runs the health suite: mark it @pytest.mark.suite")
    named = ["-c", str(REPO / "pytest.ini"), "--rootdir", str(REPO), str(REPO / "tests")]
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *(named if ini else []),
        f"--junitxml={reports / 'junit.xml'}",
        f"--alluredir={reports / 'allure-results'}",
        f"--verdicts={reports / 'verdicts.json'}",
        f"--save-facts={reports / 'facts'}",
        # Each run's own store, new: runs of other tests are no history of this one's nodes.
        *(
            []
            if any(a.startswith(("--history", "--no-history")) for a in args)
            else [f"--history={reports / 'history.sqlite'}", "--history-create"]
        ),
        *args,
    ]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
    return SuiteRun(proc.returncode, proc.stdout + proc.stderr, reports)


def shell(command: str, env: dict[str, str] | None = None, timeout: float = 60, stdin: str = ""):
    """Run a command line the way ssh runs it on a node: through /bin/sh, from /, `stdin` on
    its standard input."""
    return subprocess.run(
        ["/bin/sh", "-c", command],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd="/",
    )


def shell_probe(call: ProbeCall, env: dict[str, str] | None = None, timeout: float = 60):
    """Run the shipped probe the way ssh runs it on a node: `shell` with its payload on stdin."""
    return shell(call.command, env, timeout, stdin=call.stdin)


def fake_tool(folder: Path, name: str, body: str) -> Path:
    """A stand-in command (a shell script) named `name` in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


class ToolPath:
    """A PATH holding only the stand-in tools a test writes, so absent ones are missing."""

    def __init__(self, folder: Path, monkeypatch: Any) -> None:
        self.folder = folder
        folder.mkdir()
        monkeypatch.setenv("PATH", str(folder))

    def add(self, name: str, body: str) -> Path:
        """A shell script `name` with `body`, executable, on that PATH."""
        path = self.folder / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return path
