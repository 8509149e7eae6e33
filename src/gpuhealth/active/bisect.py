"""Bisection: which node(s) make a multi-node NCCL run slow?

A set of nodes is as fast as its slowest member, so a slow run names no one. Bisection measures
smaller sets: halves while a slow set has more than three nodes, then disjoint pairs, then each
node of a slow pair together with a node already seen fast. A node that is slow with a fast
partner is named. Every set is measured at most once.

When no subset is fast (a fabric-wide problem, or two nodes in all) or every subset is fast
(the set is slow only at full scale: spine links, routing), no node is named and the result
says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Measure = Callable[[tuple[str, ...]], bool]


@dataclass
class Bisection:
    """The outcome: slow nodes, nodes seen fast, and every set measured in order (set, fast)."""

    slow: list[str] = field(default_factory=list)
    fast: list[str] = field(default_factory=list)
    trials: list[tuple[tuple[str, ...], bool]] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)


def bisect(nodes: list[str], measure: Measure) -> Bisection:
    """Name the slow nodes of `nodes`, a set already measured slow as a whole.

    `measure(subset)` runs the test on the subset (in the given order) and says whether it met
    the threshold; a run that fails to complete counts as slow.
    """
    out = Bisection()
    seen: dict[frozenset[str], bool] = {frozenset(nodes): False}
    fast: list[str] = []

    def ok(group: list[str]) -> bool:
        key = frozenset(group)
        if key not in seen:
            seen[key] = measure(tuple(group))
            out.trials.append((tuple(group), seen[key]))
        if seen[key]:
            fast.extend(n for n in group if n not in fast)
        return seen[key]

    small: list[list[str]] = []
    queue = [list(nodes)]
    while queue:
        group = queue.pop(0)
        if len(group) <= 3:
            small.append(group)
            continue
        half = len(group) // 2
        queue.extend(h for h in (group[:half], group[half:]) if not ok(h))
    suspects: list[str] = []
    for group in small:
        for start in range(0, len(group) - 1, 2):
            pair = group[start : start + 2]
            if not ok(pair):
                suspects.extend(pair)
        if len(group) % 2:
            suspects.append(group[-1])
    suspects = [n for n in dict.fromkeys(suspects) if n not in fast]
    if not fast:
        # No node known fast yet: try other pairings, at most one new run per suspect (past
        # that, the fabric as a whole is the likelier culprit).
        pairs = [[a, b] for i, a in enumerate(suspects) for b in suspects[i + 1 :]]
        for pair in [p for p in pairs if frozenset(p) not in seen][: len(suspects)]:
            if ok(pair):
                break
    for node in suspects:
        if node in fast:
            continue
        partner = next((n for n in fast if n != node), None)
        if partner is None:
            out.unresolved.append(node)
        elif not ok([partner, node]):
            out.slow.append(node)
    out.fast = [n for n in nodes if n in fast]
    return out
