"""The `dcgm_health` section: `dcgmi health -c -j`, DCGM's verdict from its background watches.

Cheap (it reads what nv-hostengine already watches), so it belongs to the passive probe; the
load tests (`dcgmi diag`) are active checks run from the controller at `--level standard`. Run
only where the inventory says DCGM is installed (`dcgm_installed`).
"""

from __future__ import annotations

from typing import Any

from gpuhealth.parsers import ParseError, dcgm
from gpuhealth.probe import command

TIMEOUT_S = 30.0
ARGV = ["dcgmi", "health", "-c", "-j"]


def collect(config: dict[str, Any], errors: list[dict[str, Any]]) -> dict[str, Any]:
    """Overall health and incidents, or why they could not be read."""
    if not (config.get("expect") or {}).get("dcgm_installed"):
        return {"expected": False}
    section: dict[str, Any] = {"expected": True, "health": None, "unavailable": {}}
    result = command.run(ARGV, TIMEOUT_S)
    output = (result.stdout + "\n" + result.stderr).strip()
    why = None
    if result.error:
        why = {"kind": "timeout" if result.timed_out else "error", "detail": result.error}
    else:
        try:
            section["health"] = dcgm.parse_health(result.stdout)
        except ParseError as exc:
            # dcgmi prints its own errors (no host engine, no watches) on stdout, exit != 0.
            detail = "; ".join(output.splitlines()[:3]) if output and result.rc else str(exc)
            why = {"kind": "error", "detail": f"dcgmi health -c -j (exit {result.rc}): {detail}"}
    if why:
        why["detail"] = why["detail"][:500]
        section["unavailable"]["health"] = why
        errors.append({"probe": "dcgm_health", "error": why["detail"]})
    return section
