"""Active checks: load tests run on the nodes from the controller, opt-in by `--level`.

The passive probe tells what a node says about itself; these put it under load: nccl-tests on
all local GPUs and across nodes, and the DCGM diagnostic. They run through the testinfra host
the suite already has, each bounded by its own timeout, never on the quick path. The families
declare their load tests (`ActiveRun` in family.py); this package holds what they share: the
levels, the bounded launcher (runner.py) and bisection.
"""

from __future__ import annotations

# What each level adds (README "Active checks"): quick = the passive probe only.
LEVELS = ("quick", "standard", "full")


def level_allows(current: str, needed: str) -> bool:
    """True when a run at `current` includes checks of level `needed`."""
    return LEVELS.index(current) >= LEVELS.index(needed)
