"""What a check says: a typed status, the human message, and an action code next to the advice.

The action code is what drain scripts, Slurm and Kubernetes actions and the node health service
act on; the advice is the same thing in words, for the engineer reading the report.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

if TYPE_CHECKING:
    from gpuhealth.report import VerdictBook


class _Code(str, Enum):
    """A code that prints (and serialises) as itself."""

    def __str__(self) -> str:
        return str(self.value)


class Status(_Code):
    """A check's verdict on one node or GPU."""

    PASS = "PASS"
    WARN = "WARN"
    FAIL = "FAIL"
    SKIP = "SKIP"


class Action(_Code):
    """What to do about a finding, most drastic first (the order ranks a node's actions).

    In the spirit of GPUd's repair actions; verdicts.json lists them with their meanings.
    """

    RMA = "RMA"
    REBOOT_NODE = "REBOOT_NODE"
    RESET_GPU = "RESET_GPU"
    DRAIN = "DRAIN"
    INSPECT = "INSPECT"
    FIX_CONFIG = "FIX_CONFIG"
    CHECK_APP = "CHECK_APP"
    RERUN = "RERUN"
    NONE = "NONE"

    @property
    def rank(self) -> int:
        """0 for the most drastic action (RMA) up to NONE."""
        return list(Action).index(self)

    @property
    def meaning(self) -> str:
        """What the code asks for, in words."""
        return ACTION_MEANINGS[self]


ACTION_MEANINGS = {
    Action.RMA: "replace the part (GPU, HCA, cable, baseboard) with the vendor",
    Action.REBOOT_NODE: "drain the node, then reboot or power-cycle it",
    Action.RESET_GPU: "drain the GPU's jobs, then reset the GPU (nvidia-smi -r) or reboot",
    Action.DRAIN: "take the node out of scheduling until someone has looked",
    Action.INSPECT: "a person must look: hardware, cooling, cabling, logs or the fabric",
    Action.FIX_CONFIG: "set software, BIOS, limits, services or the inventory right",
    Action.CHECK_APP: "the user's application (or the last job) caused it",
    Action.RERUN: "the data could not be read: run again; if it persists, see the advice",
    Action.NONE: "nothing to do",
}


class Detail:
    """What a check adds to its Result beyond status and words, declared by the family that
    owns it (a frozen dataclass of plain values, such as the history family's regressions and
    notes). `reach` puts it into the run's verdicts on the controller (verdicts.json, and the
    run store through them); from an xdist worker it travels as its `kind` (where the class
    lives) and its field values (`wire`, `unwire`)."""

    kind: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = f"{cls.__module__}:{cls.__qualname__}"
        _KINDS[cls.kind] = cls

    def reach(self, host: str, nodeid: str, book: VerdictBook) -> None:
        """Add it to the verdicts of `host`, reported by test `nodeid`."""
        raise NotImplementedError

    def wire(self) -> tuple[Any, ...]:
        """Plain values: its kind, then its fields in order."""
        return (self.kind, *vars(self).values())

    @staticmethod
    def unwire(wired: tuple[Any, ...] | list[Any]) -> Detail:
        """The detail `wire` gave. Its class is one a family declares: where this process
        has not defined it yet, its module is imported, but only one of the modules families
        declare details in (gpuhealth.results, gpuhealth.families), never a `__main__` or
        any other module a wire might name."""
        kind, *values = wired
        cls = _KINDS.get(kind) if isinstance(kind, str) else None
        if cls is None and isinstance(kind, str):
            module = kind.partition(":")[0]
            parts = module.split(".")
            declaring = module == __name__ or parts[:2] == ["gpuhealth", "families"]
            if declaring and all(p.isidentifier() and not p.startswith("_") for p in parts):
                importlib.import_module(module)
                cls = _KINDS.get(kind)  # defined by the import, if it is a Detail
        if cls is None:
            raise TypeError(f"not a result detail: {kind!r}")
        return cls(*values)


# Every Detail subclass by its kind, as each is defined (Detail.__init_subclass__).
_KINDS: dict[str, Callable[..., Detail]] = {}
D = TypeVar("D", bound=Detail)


@dataclass(frozen=True)
class Shared(Detail):
    """A value every node of one inventory group must report alike, such as the NVLink domain
    identity of the nodes `nvlink_domain: rack07` puts in one NVL72 rack. Only the controller
    sees every host, so a node check states its value and the Reporter compares them
    (gpuhealth.report.shared_outcomes) as fleet check `check`."""

    check: str  # the fleet check's name, e.g. nvlink_domain
    key: str  # the inventory var that names the group, e.g. nvlink_domain
    group: str  # its value for this node, e.g. rack07
    what: str  # what is compared, e.g. "NVLink domain (clique, cluster UUID)"
    value: str  # what this node reports
    advice: str  # what to do about a node that differs from its group

    def reach(self, host: str, nodeid: str, book: VerdictBook) -> None:
        """Held for the comparison with the rest of the group, at the end of the run."""
        book.share(host, self, nodeid)


@dataclass(frozen=True)
class Result:
    """One check's verdict on one node or GPU: `message` says what was measured against what
    was expected; `action` and `advice` say what to do (FAIL and WARN only); `details` are
    what the check's family adds to the node's verdict (see Detail)."""

    status: Status
    message: str
    action: Action = Action.NONE
    advice: str | None = None
    details: tuple[Detail, ...] = ()

    def of(self, kind: type[D]) -> list[D]:
        """Its details of one kind, in order."""
        return [found for found in self.details if isinstance(found, kind)]


def passed(message: str) -> Result:
    """A PASS with what was measured."""
    return Result(Status.PASS, message)


def skipped(message: str) -> Result:
    """A SKIP with the reason the check does not apply (or could not be evaluated)."""
    return Result(Status.SKIP, message)


def failed(message: str, action: Action, advice: str | None = None) -> Result:
    """A FAIL, with what to do about it."""
    return Result(Status.FAIL, message, action, advice)


def warned(message: str, action: Action, advice: str | None = None) -> Result:
    """A WARN (soft limit crossed; the run still passes), with what to do about it."""
    return Result(Status.WARN, message, action, advice)
