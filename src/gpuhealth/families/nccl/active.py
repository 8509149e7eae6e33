"""nccl-tests as a load test: all_reduce_perf on all local GPUs, and across the nodes.

The single-node run (`-g N`, one process driving every GPU over NVLink/NVSwitch) is this
family's ActiveRun; the multi-node run and its bisection live in fleet.py.
"""

from __future__ import annotations

import os
import posixpath
import shlex
from typing import Any

from gpuhealth.active.runner import (
    ActiveContext,
    Failure,
    Outcome,
    Run,
    Tool,
    read_output,
    shell_args,
)
from gpuhealth.facts import skipped
from gpuhealth.families.gpu.scope import GPU
from gpuhealth.families.nccl import parse_nccl_tests
from gpuhealth.families.nccl.limits import NcclLimits
from gpuhealth.parsing import ParseError
from gpuhealth.registry import ActiveRun
from gpuhealth.results import Action


def binary(limits: NcclLimits) -> str:
    """Path of all_reduce_perf on the nodes."""
    return posixpath.join(limits.nccl_tests_dir, "all_reduce_perf")


def single_command(path: str, sizes: str, gpus: int) -> str:
    """One process driving all local GPUs (`-g N`): NVLink/NVSwitch only, no MPI needed."""
    return f"{shlex.quote(path)} {shell_args(sizes, 'nccl_sizes')} -g {int(gpus)}"


def multi_command(
    launcher: str, launcher_args: str, path: str, sizes: str, nodes: list[str], gpus: int
) -> str:
    """One rank per GPU on every node: `srun` on Slurm, else mpirun with a hostfile.

    The binary must be built with MPI (`make MPI=1`). mpirun is Open MPI style (`--hostfile`
    with `slots=`, `-np`); put site options (`-x LD_LIBRARY_PATH`, `--mca pml ucx`,
    `--mpi=pmix` for srun) in `nccl_launcher_args`.
    """
    test = f"{shlex.quote(path)} {shell_args(sizes, 'nccl_sizes')} -g 1"
    extra = shell_args(launcher_args, "nccl_launcher_args")
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


def _tool(timeout_key: str) -> Tool:
    return Tool(
        "",
        "install nccl-tests (role nccl_tests; built with MPI=1 for multi-node) or set "
        "nccl_tests_dir / nccl_launcher to where they are",
        Action.DRAIN,
        "look for a hung GPU or link (dmesg Xid, `nvidia-smi`) and re-run; raise "
        f"{timeout_key} only if the sweep legitimately takes longer",
    )


def section_of(outcome: Outcome, hosts: list[str], timeout_key: str) -> dict[str, Any]:
    """The `nccl` facts section of one nccl-tests launch (see checks.py)."""

    def unreadable(exc: ParseError) -> Failure:
        error = (
            f"exited {outcome.rc}: {outcome.tail()}"
            if outcome.rc
            else f"output is not an nccl-tests result: {exc}"
        )
        return (
            error,
            Action.INSPECT,
            "read the attached log (NCCL errors name the failing rank and call)",
        )

    section = read_output(
        outcome,
        _tool(timeout_key),
        timeout_key,
        "run",
        parse_nccl_tests.parse,
        unreadable,
        nodes=len(hosts),
        hosts=list(hosts),
        exit_note=None,
    )
    if section["run"] is not None and outcome.rc:
        section["exit_note"] = f"nccl-tests exited {outcome.rc} after its results: {outcome.tail()}"
    return section


def launch(ctx: ActiveContext) -> Run:
    """all_reduce_perf on all GPUs of the node (`-g N`)."""
    view = ctx.view
    gpus = GPU.slots(view)
    if not gpus:
        return skipped(f"no NVIDIA GPU on {view.host} and none expected"), []
    limits = view.limits.get(NcclLimits)
    name = "nccl-all_reduce_perf"
    command = single_command(binary(limits), limits.nccl_sizes, gpus)
    outcome = ctx.launch(name, command, limits.nccl_timeout_s)
    return section_of(outcome, [view.host], "nccl_timeout_s"), [(name, outcome)]


RUNS = (ActiveRun("nccl", "standard", launch),)
