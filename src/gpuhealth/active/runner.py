"""Launching load tests on a node from the controller, bounded twice.

Every launch is bounded by `timeout` on the node, which kills the command's whole process
group (mpirun and its ranks, dcgmi and nvvs), and on the controller, in case the connection
itself hangs. What a run printed is kept whole (`Outcome.log`) as evidence, even when it timed
out half-way. The families' `active.py` build the commands and read the outcomes.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuhealth.active.node import KILL_GRACE_S, stopped, wrap
from gpuhealth.checks import NodeView
from gpuhealth.deadline import DeadlineExceeded, within
from gpuhealth.parsing import ParseError
from gpuhealth.results import Action

TRANSPORT_GRACE_S = 60


@dataclass
class Outcome:
    """What one launch did; `error` is set when it could not run or did not finish."""

    command: str
    rc: int | None
    stdout: str
    stderr: str
    duration_s: float | None  # None: not known (not run, or a saved log)
    error: str | None = None
    timed_out: bool = False

    @property
    def log(self) -> str:
        """The raw evidence: the command, its stdout, then its stderr."""
        text = f"$ {self.command}\n{self.stdout}"
        if self.stderr.strip():
            text += f"\n--- stderr ---\n{self.stderr}"
        if self.error:
            text += f"\n--- gpuhealth: {self.error} ---\n"
        return text

    def tail(self, lines: int = 3) -> str:
        """The last lines it printed (stderr first: that is where tools explain a failure)."""
        for text in (self.stderr, self.stdout):
            kept = [line.strip() for line in text.splitlines() if line.strip()]
            if kept:
                return " | ".join(kept[-lines:])[-400:]
        return "no output"


def run_on(host: Any, command: str, timeout_s: float) -> Outcome:
    """Run a shell command on a testinfra host, killed after `timeout_s` seconds."""
    wrapped, limit = wrap(command, timeout_s)
    started = time.monotonic()
    try:
        result = within(limit + KILL_GRACE_S + TRANSPORT_GRACE_S, lambda: host.run(wrapped))
    except DeadlineExceeded:
        duration = round(time.monotonic() - started, 3)
        error = f"no answer from the node after {duration:g} s"
        return Outcome(command, None, "", "", duration, error, True)
    except Exception as exc:  # the transport failed, not the command
        duration = round(time.monotonic() - started, 3)
        result = exc.args[0] if exc.args else None
        detail = getattr(result, "stderr", None) or str(exc)
        return Outcome(command, None, "", "", duration, f"connection failed: {detail}"[:500])
    duration = round(time.monotonic() - started, 3)
    killed = stopped(result.rc, duration, limit)
    return Outcome(command, result.rc, result.stdout, result.stderr, duration, killed, bool(killed))


def shell_args(text: str, key: str) -> str:
    """A profile string of command-line arguments, re-quoted token by token for the shell."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"{key} {text!r}: {exc}") from exc
    return " ".join(shlex.quote(token) for token in tokens)


Failure = tuple[str, Action, str]  # (error, action code, advice) of a section


@dataclass(frozen=True)
class Tool:
    """What a load test's tool needs said when it cannot give a result: its name as the shell
    reports it missing, how to install it, and what to do when it hangs."""

    name: str
    install: str
    hung: Action
    hung_advice: str


def launch_failure(outcome: Outcome, timeout_key: str, tool: Tool) -> Failure | None:
    """Why a launch gave no output to read, the same way for every load test: it was killed at
    its timeout, the connection failed, or the tool is not installed. None when there is
    output to parse."""
    if outcome.timed_out:
        return f"timed out: {outcome.error} ({timeout_key})", tool.hung, tool.hung_advice
    if outcome.error:
        return outcome.error, Action.RERUN, "check the connection to the node and re-run"
    if outcome.rc == 127:
        return f"{tool.name} not found: {outcome.tail(1)}".lstrip(), Action.FIX_CONFIG, tool.install
    return None


def read_output(
    outcome: Outcome,
    tool: Tool,
    timeout_key: str,
    key: str,
    parse: Callable[[str], Any],
    unreadable: Callable[[ParseError], Failure],
    **fields: Any,
) -> dict[str, Any]:
    """A load test's facts section: what every launch records, its own `fields`, and under
    `key` what `parse` made of its stdout, or why there is none (see
    checks.load_test_output): a failed launch, or output `parse` refused (`unreadable` says
    what that means for this tool)."""
    section = {
        **fields,
        key: None,
        "command": outcome.command,
        "rc": outcome.rc,
        "duration_s": outcome.duration_s,
        "error": None,
        "action": None,
        "advice": None,
    }
    failure = launch_failure(outcome, timeout_key, tool)
    if failure is None:
        try:
            section[key] = parse(outcome.stdout)
            return section
        except ParseError as exc:
            failure = unreadable(exc)
    error, action, advice = failure
    section.update(error=error, action=action.value, advice=advice)
    return section


Launch = Callable[[str, str, float], Outcome]


@dataclass
class ActiveContext:
    """What a family's load test gets: the node (facts and limits), the run's level, and
    `launch(name, command, timeout_s)`, which runs the command on the node under the load
    lock and keeps its output as evidence named `name`."""

    view: NodeView
    level: str
    launch: Launch


# A load test's facts section, and the outcomes kept as evidence (name, outcome).
Run = tuple[dict[str, Any], list[tuple[str, Outcome]]]
