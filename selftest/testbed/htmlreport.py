"""The Allure HTML report as a user sees it: `make report`, served, rendered by Chromium.

Checking the rendered DOM (not the results JSON) proves the whole reporting chain: labels and
statuses written by the suite, Allure's generator, and a browser actually showing the failures.
The HTML comes from the Makefile's `report` target itself (which installs Allure 3 with npm
into .tools/ when missing), so users get exactly what is tested; Debian's chromium is installed
with apt-get when missing. Nothing here needs the network once both are installed.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
# Flags that keep headless Chromium off the network and give the report's scripts time to
# render (without a virtual time budget the single-page app is captured blank).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=10000",
)
CHROMIUM_HELPERS = ("chromium", "chrome_crashpad")


def ensure_chromium() -> str:
    """Debian's chromium, apt-get installed when missing (root, as on CI)."""
    found = shutil.which("chromium")
    if found:
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], check=True, capture_output=True)
        subprocess.run(install, env=env, check=True, capture_output=True, timeout=900)
    return shutil.which("chromium") or "chromium"


def make_report(reports: Path, history: Path | None = None) -> Path:
    """`make report REPORTS=reports` (and ALLURE_HISTORY=history): reports/allure-results ->
    the HTML file it prints."""
    more = [f"ALLURE_HISTORY={history}"] if history else []
    proc = subprocess.run(
        ["make", "-s", "-C", str(REPO), "report", f"REPORTS={reports}", *more],
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("HTML report: ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"make report failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return Path(lines[-1].removeprefix("HTML report: "))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve(directory: Path) -> Iterator[str]:
    """Serve a directory on 127.0.0.1 (a free port) for as long as the block runs."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def chromium(url: str, *args: str, timeout: float = 120) -> str:
    """Run headless Chromium on url with a fresh profile; its stdout (e.g. --dump-dom)."""
    with tempfile.TemporaryDirectory(prefix="gpuhealth-chromium-") as profile:
        proc = subprocess.run(
            [ensure_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    _reap_orphans()
    if proc.returncode != 0:
        raise RuntimeError(f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout


def _reap_orphans(deadline_s: float = 10) -> None:
    """Wait for Chromium's detached helpers (crashpad handler, zygotes).

    They outlive the browser for a moment; a subreaper (bedlib.become_subreaper, as the bed
    tests and `bed demo` are) adopts them and must reap them, or they stay as zombies.
    """
    me, end = str(os.getpid()), time.monotonic() + deadline_s
    while True:
        running = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                comm, rest = stat.read_text().rsplit(")", 1)
                state, ppid = rest.split()[:2]
                if ppid != me or comm.split("(", 1)[1] not in CHROMIUM_HELPERS:
                    continue
                if state == "Z":
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(int(stat.parent.name), os.WNOHANG)
                else:
                    running.append(stat.parent.name)
        if not running or time.monotonic() > end:
            return
        time.sleep(0.1)


class _TreeLeaves(HTMLParser):
    """(status, title) of each test row Allure's awesome report rendered in its tree.

    The tree opens every group holding a failed or broken test, so those are always rendered;
    groups of passed and skipped tests start closed.
    """

    def __init__(self) -> None:
        super().__init__()
        self.leaves: list[tuple[str, str]] = []
        self._status: str | None = None
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        testid = dict(attrs).get("data-testid") or ""
        if testid.startswith("tree-leaf-status-"):
            self._status = testid.removeprefix("tree-leaf-status-")
        elif testid == "tree-leaf-title":
            self._in_title = True

    def handle_data(self, data: str) -> None:
        if self._in_title and self._status is not None:
            self.leaves.append((self._status, data.strip()))
            self._status, self._in_title = None, False


def rendered_tests(dom: str) -> dict[str, str]:
    """Test title -> status as shown in the rendered report page."""
    parser = _TreeLeaves()
    parser.feed(dom)
    return dict((title, status) for status, title in parser.leaves)


def test_history(index: Path, name: str) -> list[str]:
    """The statuses Allure's page of test `name` lists under History (earlier runs, newest
    first), as Chromium renders the single-file report's `#<result id>/history` route."""
    blobs = re.findall(r'd\("data/test-results/[^"]+","([A-Za-z0-9+/=]*)"\)', index.read_text())
    ids = [
        found["id"]
        for found in (json.loads(base64.b64decode(blob)) for blob in blobs)
        if found.get("name") == name
    ]
    if len(ids) != 1:
        raise RuntimeError(f"{index}: {len(ids)} results named {name}")
    with serve(index.parent) as url:
        dom = chromium(f"{url}#{ids[0]}/history", "--dump-dom")
    items = dom.split('data-testid="test-result-history-item"')[1:]
    return [re.search(r'data-testid="tree-leaf-status-(\w+)"', item).group(1) for item in items]


def render(reports: Path) -> tuple[dict[str, str], Path, Path]:
    """`make report`, then the page served on 127.0.0.1 and opened in Chromium.

    Returns the rendered tests (title -> status), the index.html and a screenshot next to it.
    """
    index = make_report(reports)
    screenshot = reports / "allure-report.png"
    with serve(index.parent) as url:
        dom = chromium(url, "--dump-dom")
        chromium(url, f"--screenshot={screenshot}", "--window-size=1400,1000")
    return rendered_tests(dom), index, screenshot
