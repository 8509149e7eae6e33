"""Running node commands with a hard timeout, so one hung tool cannot hang the probe.

Node side: Python 3.6 and the standard library.
"""

import os
import shutil
import signal
import subprocess
from typing import List, Optional

# How long to wait for a killed command's pipes to close before giving up on them.
KILL_GRACE_S = 2.0


class CommandResult:
    """What a command did; `error` is set when it could not run or timed out."""

    def __init__(
        self,
        rc: Optional[int],
        stdout: str,
        stderr: str,
        error: Optional[str] = None,
        timed_out: bool = False,
    ) -> None:
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.error = error
        self.timed_out = timed_out

    def failure(self) -> Optional[str]:
        """Why the command did not give a usable answer (could not run, timed out, exit != 0)
        in one line, or None when it exited 0."""
        if self.error:
            return self.error
        if self.rc != 0:
            text = (self.stderr.strip() or self.stdout.strip() or "no output").splitlines()[0]
            return f"exit {self.rc}: {text[:300]}"
        return None


def run(argv: List[str], timeout_s: float) -> CommandResult:
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
            error="{} timed out after {:g} s".format(" ".join(argv), timeout_s),
            timed_out=True,
        )
    return CommandResult(
        proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")
    )
