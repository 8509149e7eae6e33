"""The DCGM diagnostic as a load test: `dcgmi diag -r LEVEL -j` on the node, its `dcgm` section."""

from __future__ import annotations

from typing import Any

from gpuhealth.active.runner import ActiveContext, Outcome, Run
from gpuhealth.facts import skipped
from gpuhealth.families.dcgm import parse_dcgm
from gpuhealth.families.dcgm.limits import DcgmLimits
from gpuhealth.parsing import ParseError
from gpuhealth.results import Action

# Expected wall time of `dcgmi diag -r N` on an 8-GPU node (DCGM docs: 1 quick, 2 ~2 min,
# 3 ~15-30 min, 4 extended): each level gets about twice that before it is killed.
TIMEOUTS_S = {1: 120, 2: 360, 3: 3600, 4: 6 * 3600}


def diag_level(limits: DcgmLimits, level: str) -> int:
    """`dcgm_diag_level` when set, else 2 at --level standard and 3 at --level full."""
    configured = limits.dcgm_diag_level
    return configured if configured is not None else (3 if level == "full" else 2)


def section_of(outcome: Outcome, level: int, timeout_key: str) -> dict[str, Any]:
    """The `dcgm` facts section of one `dcgmi diag -r LEVEL -j` launch (see checks.py)."""
    section: dict[str, Any] = {
        "level": level,
        "command": outcome.command,
        "rc": outcome.rc,
        "duration_s": outcome.duration_s,
        "error": None,
        "action": None,
        "advice": None,
        "diag": None,
    }
    text = f"{outcome.stdout}\n{outcome.stderr}"

    def fail(error: str, action: Action, advice: str) -> dict[str, Any]:
        section.update(error=error, action=action.value, advice=advice)
        return section

    if outcome.timed_out:
        return fail(
            f"dcgmi diag -r {level} timed out: {outcome.error} ({timeout_key})",
            Action.RESET_GPU,
            "a GPU may hang under load: check dmesg for Xid, then run `dcgmi diag -r "
            f"{level} -i INDEX` one GPU at a time",
        )
    if outcome.error:
        return fail(outcome.error, Action.RERUN, "check the connection to the node and re-run")
    if outcome.rc == 127:
        return fail(
            f"dcgmi not found: {outcome.tail(1)}",
            Action.FIX_CONFIG,
            "install DCGM (role dcgm: datacenter-gpu-manager), or set dcgm_installed: false",
        )
    try:
        section["diag"] = parse_dcgm.parse_diag(outcome.stdout)
    except ParseError as exc:
        lowered = text.lower()
        if "host engine" in lowered or "unable to establish a connection" in lowered:
            return fail(
                f"cannot reach the DCGM host engine: {outcome.tail()}",
                Action.FIX_CONFIG,
                "start it: `systemctl enable --now nvidia-dcgm` (nv-hostengine), then check its "
                "log",
            )
        return fail(
            f"{exc} (exit {outcome.rc}; last output: {outcome.tail()})",
            Action.RERUN,
            "read the attached output; run the same dcgmi command by hand",
        )
    return section


def launch(ctx: ActiveContext) -> Run:
    """`dcgmi diag` on the node at the configured (or the run's) level."""
    limits = ctx.view.limits.get(DcgmLimits)
    if not limits.dcgm_installed:
        return skipped("DCGM not expected on this host (dcgm_installed: false)"), []
    level = diag_level(limits, ctx.level)
    if level not in TIMEOUTS_S:
        section: dict[str, Any] = {
            "level": level,
            "error": f"dcgm_diag_level {level} is not a DCGM run level",
            "action": Action.FIX_CONFIG.value,
            "advice": "set dcgm_diag_level to 1, 2, 3 or 4 (or null: 2 at standard, 3 at full)",
            "diag": None,
        }
        return section, []
    timeout = limits.dcgm_diag_timeout_s or TIMEOUTS_S[level]
    name = f"dcgmi-diag-r{level}"
    outcome = ctx.launch(name, f"dcgmi diag -r {level} -j", timeout)
    return section_of(outcome, level, "dcgm_diag_timeout_s"), [(name, outcome)]
