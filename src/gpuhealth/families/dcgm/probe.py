"""The `dcgm_health` section: `dcgmi health -c -j`, DCGM's verdict from its background watches.

Cheap (it reads what nv-hostengine already watches), so it belongs to the passive probe; the
load test (`dcgmi diag`) is an active check run from the controller at `--level standard`. Run
only where the inventory says DCGM is installed (`dcgm_installed`).
Node side: Python 3.6 and the standard library.
"""

from typing import TYPE_CHECKING, Any, Dict, Optional

from gpuhealth.facts import Unavailable, skipped, why
from gpuhealth.families.dcgm import parse_dcgm, schema
from gpuhealth.parsing import ParseError
from gpuhealth.probe import command
from gpuhealth.schema import written

if TYPE_CHECKING:
    from gpuhealth.probe.main import Context

SECTIONS = written(schema.SECTIONS)
ARGV = ["dcgmi", "health", "-c", "-j"]


def collect(ctx: "Context") -> Dict[str, Any]:
    """Overall health and incidents, or why they could not be read."""
    if not ctx.setting("dcgm_installed"):
        return {"dcgm_health": skipped("DCGM not expected on this host (dcgm_installed: false)")}
    section: Dict[str, Any] = {"health": None, "unavailable": {}}
    result = command.run(ARGV, float(ctx.setting("dcgm_health_timeout_s")))
    output = (result.stdout + "\n" + result.stderr).strip()
    reason: Optional[Unavailable] = None
    if result.error:
        reason = why("timeout" if result.timed_out else "error", result.error)
    else:
        try:
            section["health"] = parse_dcgm.parse_health(result.stdout)
        except ParseError as exc:
            # dcgmi prints its own errors (no host engine, no watches) on stdout, exit != 0.
            detail = "; ".join(output.splitlines()[:3]) if output and result.rc else str(exc)
            reason = why("error", f"dcgmi health -c -j (exit {result.rc}): {detail}")
    if reason:
        section["unavailable"]["health"] = reason
        ctx.error("dcgm_health", reason["detail"])
    return {"dcgm_health": section}
