"""Creates the Allure files a suite run hands it on stdin, in a process of its own.

    python -m gpuhealth.allure_writer DIR [OLD_DIR ...]

Frames on stdin: a header line `<file name> <length>` and that many bytes of content. Each
file is written under a temporary name and renamed, so a reader never sees half a result.
OLD_DIR folders (an earlier run's results, renamed away by --clean-alluredir) are deleted
after the last frame. At the end it prints what it could not write on stderr and exits 1 if
anything failed. Standard library only.
"""

from __future__ import annotations

import os
import queue
import shutil
import sys
import threading
from pathlib import Path


def _safe(name: str) -> bool:
    return bool(name) and "/" not in name and name not in (".", "..") and "\0" not in name


class Files:
    """Writes files into one folder and remembers what failed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.failed = 0
        self.errors: list[str] = []  # the first few

    def write(self, name: str, body: bytes) -> None:
        """One file, complete or not at all (temporary name, then rename)."""
        if not _safe(name):
            self._fail(f"refused file name {name!r}")
            return
        tmp = self.folder / f".{name}.tmp"
        try:
            with open(tmp, "wb") as handle:
                handle.write(body)
            os.replace(tmp, self.folder / name)
        except OSError as exc:
            self._fail(f"{exc.filename or self.folder}: {exc.strerror}")

    def _fail(self, error: str) -> None:
        self.failed += 1
        if len(self.errors) < 5:
            self.errors.append(error)

    def problem(self) -> str | None:
        """What could not be written, in one line; None when everything was."""
        if not self.failed:
            return None
        return f"{self.failed} Allure files not written ({'; '.join(self.errors)})"


def _read(frames: queue.SimpleQueue[tuple[str, bytes] | None]) -> None:
    """Take frames off the pipe as fast as they come, so the suite never waits on a full
    pipe while files are created."""
    stream = sys.stdin.buffer
    while header := stream.readline():
        name, _, size = header.decode(errors="replace").rstrip("\n").rpartition(" ")
        frames.put((name, stream.read(int(size))))
    frames.put(None)


def main(argv: list[str]) -> int:
    """Write every frame of stdin into argv[0]; delete the folders argv[1:]."""
    files = Files(Path(argv[0]))
    frames: queue.SimpleQueue[tuple[str, bytes] | None] = queue.SimpleQueue()
    threading.Thread(target=_read, args=(frames,), daemon=True).start()
    while (frame := frames.get()) is not None:
        files.write(*frame)
    for path in argv[1:]:
        shutil.rmtree(path, ignore_errors=True)
    problem = files.problem()
    if problem:
        print(problem, file=sys.stderr)
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
