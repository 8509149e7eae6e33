"""The DCGM diagnostic as a load test: `dcgmi diag -r LEVEL -j` on the node, its `dcgm` section."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuhealth.active.runner import ActiveContext, Failure, Outcome, Run, Tool, read_output
from gpuhealth.facts import skipped
from gpuhealth.families.dcgm import parse_dcgm
from gpuhealth.families.dcgm.limits import DcgmLimits
from gpuhealth.limits import SharedLimits
from gpuhealth.parsing import ParseError
from gpuhealth.registry import ActiveRun
from gpuhealth.results import Action

# Expected wall time of `dcgmi diag -r N` on an 8-GPU node (DCGM docs: 1 quick, 2 ~2 min,
# 3 ~15-30 min, 4 extended): each level gets about twice that before it is killed.
TIMEOUTS_S = {1: 120, 2: 360, 3: 3600, 4: 6 * 3600}


def diag_level(limits: DcgmLimits, level: str) -> int:
    """`dcgm_diag_level` when set, else 2 at --level standard and 3 at --level full."""
    configured = limits.dcgm_diag_level
    return configured if configured is not None else (3 if level == "full" else 2)


_DCGMI = Tool(
    "dcgmi",
    "install DCGM (role dcgm: datacenter-gpu-manager), or set dcgm_installed: false",
    Action.RESET_GPU,
    "a GPU may hang under load: check dmesg for Xid, then run the same `dcgmi diag` one GPU "
    "at a time (`-i INDEX`)",
)


def _unreadable(outcome: Outcome) -> Callable[[ParseError], Failure]:
    def explain(exc: ParseError) -> Failure:
        lowered = f"{outcome.stdout}\n{outcome.stderr}".lower()
        if "host engine" in lowered or "unable to establish a connection" in lowered:
            return (
                f"cannot reach the DCGM host engine: {outcome.tail()}",
                Action.FIX_CONFIG,
                "start it: `systemctl enable --now nvidia-dcgm` (nv-hostengine), then check "
                "its log",
            )
        return (
            f"{exc} (exit {outcome.rc}; last output: {outcome.tail()})",
            Action.RERUN,
            "read the attached output; run the same dcgmi command by hand",
        )

    return explain


def section_of(outcome: Outcome, level: int, timeout_key: str) -> dict[str, Any]:
    """The `dcgm` facts section of one `dcgmi diag -r LEVEL -j` launch (see checks.py)."""
    return read_output(
        outcome,
        _DCGMI,
        timeout_key,
        "diag",
        parse_dcgm.parse_diag,
        _unreadable(outcome),
        level=level,
    )


def launch(ctx: ActiveContext) -> Run:
    """`dcgmi diag` on the node at the configured (or the run's) level."""
    limits = ctx.view.limits.get(DcgmLimits)
    if not ctx.view.limits.get(SharedLimits).dcgm_installed:
        return skipped("DCGM not expected on this host (dcgm_installed: false)"), []
    level = diag_level(limits, ctx.level)
    timeout = limits.dcgm_diag_timeout_s or TIMEOUTS_S[level]
    name = f"dcgmi-diag-r{level}"
    outcome = ctx.launch(name, f"dcgmi diag -r {level} -j", timeout)
    return section_of(outcome, level, "dcgm_diag_timeout_s"), [(name, outcome)]


RUNS = (ActiveRun("dcgm", "standard", launch),)
