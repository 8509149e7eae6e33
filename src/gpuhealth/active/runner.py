"""Launching active tests on a node and turning their output into facts sections.

Every launch is bounded twice: by `timeout` on the node, which kills the command's whole process
group (mpirun and its ranks, dcgmi and nvvs), and on the controller, in case the connection
itself hangs. What a run printed is kept whole (`Outcome.log`) as evidence, even when it timed
out half-way.
"""

from __future__ import annotations

import math
import os
import shlex
import threading
import time
from dataclasses import dataclass
from typing import Any

from gpuhealth.parsers import ParseError, dcgm, nccl_tests

KILL_GRACE_S = 10
TRANSPORT_GRACE_S = 60
# `timeout` exits 124 when it had to stop the command, 137 when it then had to SIGKILL it.
TIMEOUT_CODES = (124, 137)
# Expected wall time of `dcgmi diag -r N` on an 8-GPU node (DCGM docs: 1 quick, 2 ~2 min,
# 3 ~15-30 min, 4 extended): each level gets about twice that before it is killed.
DCGM_TIMEOUTS_S = {1: 120, 2: 360, 3: 3600, 4: 6 * 3600}


@dataclass
class Outcome:
    """What one launch did; `error` is set when it could not run or did not finish."""

    command: str
    rc: int | None
    stdout: str
    stderr: str
    duration_s: float
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
    limit = int(math.ceil(timeout_s))
    wrapped = f"timeout -k {KILL_GRACE_S} {limit} sh -c {shlex.quote(command)}"
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = host.run(wrapped)
        except Exception as exc:  # the transport failed, not the command
            box["error"] = exc

    started = time.monotonic()
    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(limit + KILL_GRACE_S + TRANSPORT_GRACE_S)
    duration = round(time.monotonic() - started, 3)
    if worker.is_alive():
        return Outcome(
            command, None, "", "", duration, f"no answer from the node after {duration:g} s", True
        )
    if "error" in box:
        exc = box["error"]
        result = exc.args[0] if exc.args else None
        detail = getattr(result, "stderr", None) or str(exc)
        return Outcome(command, None, "", "", duration, f"connection failed: {detail}"[:500])
    result = box["result"]
    outcome = Outcome(command, result.rc, result.stdout, result.stderr, duration)
    if result.rc in TIMEOUT_CODES and duration >= limit:
        outcome.timed_out = True
        outcome.error = f"killed after {limit} s"
    return outcome


def _args(text: str, key: str) -> str:
    """A profile string of command-line arguments, re-quoted token by token for the shell."""
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"{key} {text!r}: {exc}") from exc
    return " ".join(shlex.quote(token) for token in tokens)


def nccl_single_command(binary: str, sizes: str, gpus: int) -> str:
    """One process driving all local GPUs (`-g N`): NVLink/NVSwitch only, no MPI needed."""
    return f"{shlex.quote(binary)} {_args(sizes, 'nccl_sizes')} -g {int(gpus)}"


def nccl_multi_command(
    launcher: str, launcher_args: str, binary: str, sizes: str, nodes: list[str], gpus: int
) -> str:
    """One rank per GPU on every node: `srun` on Slurm, else mpirun with a hostfile.

    The binary must be built with MPI (`make MPI=1`). mpirun is Open MPI style (`--hostfile`
    with `slots=`, `-np`); put site options (`-x LD_LIBRARY_PATH`, `--mca pml ucx`,
    `--mpi=pmix` for srun) in `nccl_launcher_args`.
    """
    test = f"{shlex.quote(binary)} {_args(sizes, 'nccl_sizes')} -g 1"
    extra = _args(launcher_args, "nccl_launcher_args")
    if os.path.basename(launcher) == "srun":
        return (
            f"{shlex.quote(launcher)} --nodes={len(nodes)} --ntasks-per-node={int(gpus)} "
            f"--nodelist={shlex.quote(','.join(nodes))} {extra} {test}"
        )
    names = " ".join(shlex.quote(n) for n in nodes)
    return (
        f"f=$(mktemp) && printf '%s slots={int(gpus)}\\n' {names} > \"$f\" && "
        f'{shlex.quote(launcher)} --hostfile "$f" -np {len(nodes) * int(gpus)} {extra} {test}; '
        'rc=$?; rm -f "$f"; exit $rc'
    )


def nccl_section(outcome: Outcome, hosts: list[str], timeout_key: str) -> dict[str, Any]:
    """The `nccl` facts section of one nccl-tests launch (see checks/nccl.py)."""
    section: dict[str, Any] = {
        "nodes": len(hosts),
        "hosts": list(hosts),
        "command": outcome.command,
        "rc": outcome.rc,
        "duration_s": outcome.duration_s,
        "error": None,
        "action": None,
        "exit_note": None,
        "run": None,
    }
    if outcome.timed_out:
        section["error"] = (
            f"timed out: {outcome.error} ({timeout_key}); the partial log is attached"
        )
        section["action"] = (
            "look for a hung GPU or link (dmesg Xid, `nvidia-smi`) and re-run; raise "
            f"{timeout_key} only if the sweep legitimately takes longer"
        )
        return section
    if outcome.error:
        section["error"] = outcome.error
        section["action"] = "check the connection to the node and re-run"
        return section
    if outcome.rc == 127:
        section["error"] = f"not found: {outcome.tail(1)}"
        section["action"] = (
            "install nccl-tests (role nccl_tests; built with MPI=1 for multi-node) or set "
            "nccl_tests_dir / nccl_launcher to where they are"
        )
        return section
    try:
        section["run"] = nccl_tests.parse(outcome.stdout)
    except ParseError as exc:
        if outcome.rc:
            section["error"] = f"exited {outcome.rc}: {outcome.tail()}"
        else:
            section["error"] = f"output is not an nccl-tests result: {exc}"
        section["action"] = "read the attached log (NCCL errors name the failing rank and call)"
        return section
    if outcome.rc:
        section["exit_note"] = f"nccl-tests exited {outcome.rc} after its results: {outcome.tail()}"
    return section


def dcgm_section(outcome: Outcome, level: int, timeout_key: str) -> dict[str, Any]:
    """The `dcgm` facts section of one `dcgmi diag -r LEVEL -j` launch (see checks/dcgm.py)."""
    section: dict[str, Any] = {
        "level": level,
        "command": outcome.command,
        "rc": outcome.rc,
        "duration_s": outcome.duration_s,
        "error": None,
        "action": None,
        "diag": None,
    }
    text = f"{outcome.stdout}\n{outcome.stderr}"
    if outcome.timed_out:
        section["error"] = f"dcgmi diag -r {level} timed out: {outcome.error} ({timeout_key})"
        section["action"] = (
            "a GPU may hang under load: check dmesg for Xid, then run `dcgmi diag -r "
            f"{level} -i INDEX` one GPU at a time"
        )
    elif outcome.error:
        section["error"] = outcome.error
        section["action"] = "check the connection to the node and re-run"
    elif outcome.rc == 127:
        section["error"] = f"dcgmi not found: {outcome.tail(1)}"
        section["action"] = (
            "install DCGM (role dcgm: datacenter-gpu-manager), or set dcgm_installed: false"
        )
    else:
        try:
            section["diag"] = dcgm.parse_diag(outcome.stdout)
        except ParseError as exc:
            lowered = text.lower()
            if "host engine" in lowered or "unable to establish a connection" in lowered:
                section["error"] = f"cannot reach the DCGM host engine: {outcome.tail()}"
                section["action"] = (
                    "start it: `systemctl enable --now nvidia-dcgm` (nv-hostengine), then check "
                    "its log"
                )
            else:
                section["error"] = f"{exc} (exit {outcome.rc}; last output: {outcome.tail()})"
                section["action"] = "read the attached output; run the same dcgmi command by hand"
    return section
