"""Load tests run on the node itself, for the fleet recipes (collect.yml, srun).

The controller plans the launches with the code that builds a live run's commands
(gpuhealth.active.collect) and sends them here; this runs each in turn, bounded exactly as a
live launch is bounded (`wrap`: `timeout` kills the command's whole process group), and
reports what each printed and how it ended. Reading and judging the outputs stay on the
controller, with the same code as a live run.

Node side: Python 3.6 and the standard library, one file: collect.yml runs it as
`python3 -c <this file's source>` with the plan as JSON on stdin, and prints one JSON line.
runner.py imports `wrap` and `stopped` so that both ways bound a launch alike.
"""

import json
import math
import shlex
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

KILL_GRACE_S = 10
# `timeout` exits 124 when it had to stop the command, 137 when it then had to SIGKILL it.
TIMEOUT_CODES = (124, 137)
# Past `timeout`'s own kill: how long to wait for output pipes a stray child keeps open.
PIPE_GRACE_S = 5
# Printed with the outcomes, so the controller tells them from a banner or a traceback.
MARK = "gpuhealth-load"


def wrap(command: str, timeout_s: float) -> Tuple[str, int]:
    """The shell command bounded on the node by `timeout` (its process group killed, then
    SIGKILLed `KILL_GRACE_S` later), and its limit in whole seconds."""
    limit = int(math.ceil(timeout_s))
    return f"timeout -k {KILL_GRACE_S} {limit} sh -c {shlex.quote(command)}", limit


def stopped(rc: Optional[int], duration_s: float, limit: int) -> Optional[str]:
    """Why a wrapped command did not finish on its own ("killed after N s"), or None."""
    if rc in TIMEOUT_CODES and duration_s >= limit:
        return f"killed after {limit} s"
    return None


def run(command: str, timeout_s: float) -> Dict[str, Any]:
    """Run one wrapped command here: what it printed and how it ended, as a plain dict."""
    wrapped, limit = wrap(command, timeout_s)
    started = time.monotonic()
    record: Dict[str, Any] = {
        "command": command,
        "rc": None,
        "stdout": "",
        "stderr": "",
        "duration_s": None,
        "error": None,
        "timed_out": False,
    }
    try:
        proc = subprocess.Popen(
            ["sh", "-c", wrapped],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except OSError as exc:
        record["error"] = f"cannot start sh: {exc}"
        return record
    try:
        out, err = proc.communicate(timeout=limit + KILL_GRACE_S + PIPE_GRACE_S)
    except subprocess.TimeoutExpired as stuck:
        # `timeout` ended the command, yet something it started keeps the pipes open. What it
        # printed until then is the evidence (Python 3.7+ hands it over; 3.6 does not).
        out, err = stuck.output or b"", stuck.stderr or b""
        proc.kill()
        _reap(proc)
        record["error"] = f"no end after {limit} s: its output stayed open"
        record["timed_out"] = True
    duration = round(time.monotonic() - started, 3)
    record["duration_s"] = duration
    record["stdout"] = out.decode("utf-8", "replace")
    record["stderr"] = err.decode("utf-8", "replace")
    if not record["timed_out"]:
        record["rc"] = proc.returncode
        record["error"] = stopped(proc.returncode, duration, limit)
        record["timed_out"] = record["error"] is not None
    return record


def _reap(proc: "subprocess.Popen[bytes]") -> None:
    """Wait for the killed shell (not for its pipes, which a stray child still holds) and
    close our ends of them, so no zombie or open pipe outlives the launch."""
    try:
        proc.wait(timeout=KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def run_plan(plan: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Every planned launch ({section, name, command, timeout_s}), one after the other (load
    tests never overlap on a node), each with its section and name."""
    done = []
    for launch in plan:
        record = run(str(launch["command"]), float(launch["timeout_s"]))
        record["section"] = str(launch["section"])
        record["name"] = str(launch["name"])
        done.append(record)
    return done


def main() -> None:
    """Read the plan (a JSON list) on stdin, print the outcomes as one JSON line."""
    plan = json.loads(sys.stdin.read() or "[]")
    sys.stdout.write(json.dumps({MARK: run_plan(plan)}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
