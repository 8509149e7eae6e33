"""`gpuhealth act TARGET`: act on a run's verdicts.json through the fleet's own tools.

Each target reads the verdicts, maps inventory names to its own node names (an inventory
variable per target, default the inventory name), prints every change it would make, and
makes them only with `--apply`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gpuhealth.integrations import kubernetes, slurm


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`gpuhealth act {slurm,kubernetes}` and their shared options."""
    act = sub.add_parser(
        "act",
        help="act on a run's verdicts: drain/resume in Slurm, label/taint in Kubernetes",
        description=__doc__.splitlines()[0],
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--verdicts",
        type=Path,
        default=Path("reports/verdicts.json"),
        help="the run to act on (default: reports/verdicts.json)",
    )
    common.add_argument("--inventory", help="inventory with per-host node-name variables")
    common.add_argument(
        "--apply", action="store_true", help="make the changes (default: print them only)"
    )
    targets = act.add_subparsers(dest="target", required=True)
    slurm.add_parser(targets, common)
    kubernetes.add_parser(targets, common)
