"""Saved `nvidia-imex-ctl -N` output for triage: the IMEX domain as one node saw it."""

from __future__ import annotations

import re
from typing import Any

from gpuhealth.facts import why
from gpuhealth.families.imex import parse_imex_ctl
from gpuhealth.registry import Kind

# The node list (`Nodes:` then `Node #0 ...`) or the legend above it: a paste cut short after
# either is still recognised, and then refused by the parser with the reason.
_HEAD = re.compile(
    r"^(?:Connectivity Table Legend:|Nodes:[ \t]*\r?\n(?:[ \t]*\r?\n)*Node #[0-9])", re.M
)


def looks_like_imex_ctl(text: str) -> bool:
    """Saved `nvidia-imex-ctl -N` output, or a paste holding one."""
    return _HEAD.search(text) is not None


def from_imex_ctl(text: str) -> dict[str, Any]:
    """The `imex` section a saved `nvidia-imex-ctl -N` output gives: the domain, no service."""
    absent = why("absent", "a saved nvidia-imex-ctl -N output holds no service state")
    return {
        "imex": {
            "service": None,
            "domain": parse_imex_ctl.parse(text),
            "unavailable": {"service": absent},
        }
    }


KINDS = (Kind("nvidia-imex-ctl -N", looks_like_imex_ctl, from_imex_ctl, priority=25, starts=_HEAD),)
