"""Running node commands with a hard timeout, so one hung tool cannot hang the probe."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass

# How long to wait for a killed command's pipes to close before giving up on them.
KILL_GRACE_S = 2.0


@dataclass
class CommandResult:
    """What a command did; `error` is set when it could not run or timed out."""

    rc: int | None
    stdout: str
    stderr: str
    error: str | None = None
    timed_out: bool = False


def run(argv: list[str], timeout_s: float) -> CommandResult:
    """Run argv in its own process group and kill the whole group on timeout."""
    if shutil.which(argv[0]) is None:
        return CommandResult(None, "", "", error=f"{argv[0]}: command not found")
    try:
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        return CommandResult(None, "", "", error=f"{argv[0]}: {exc}")
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            out, err = proc.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired as exc:
            # Killed, yet the pipes stay open: a process in another session inherited them, or
            # the command sleeps uninterruptibly in the kernel (a dead NFS server) where SIGKILL
            # waits. Stop listening and leave it to be reaped later; never wait for it.
            out, err = exc.output or b"", exc.stderr or b""
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        return CommandResult(
            None,
            out.decode(errors="replace"),
            err.decode(errors="replace"),
            error=f"{' '.join(argv)} timed out after {timeout_s:g} s",
            timed_out=True,
        )
    return CommandResult(
        proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    )
