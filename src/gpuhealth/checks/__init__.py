"""The health checks as pure functions over a facts document and resolved limits.

The pytest suite (tests/) and `gpuhealth triage` both call `evaluate`, so a live run, a run on
saved facts and a triage of a saved log judge a node by exactly the same rules. Each family of
checks is a module of this package that registers its checks with `@check`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuhealth.config import Profile

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"


@dataclass(frozen=True)
class Result:
    """One check's verdict on one node or GPU; `message` says measured vs expected."""

    status: str
    message: str
    action: str | None = None


@dataclass(frozen=True)
class NodeView:
    """Everything a check may look at for one host."""

    host: str
    facts: dict[str, Any]
    limits: Profile

    @property
    def expected_gpus(self) -> int | None:
        return self.limits["gpu_count"]

    def gpu(self, index: int) -> dict[str, Any] | None:
        for gpu in self.facts.get("gpus") or []:
            if gpu.get("index") == index:
                return gpu
        return None

    @property
    def from_evidence(self) -> bool:
        """Built from a saved log: what it lacks was not captured, not found missing."""
        return self.facts.get("source") == "evidence-file"

    @property
    def no_nvidia(self) -> bool:
        """Nothing NVIDIA here at all: no driver, no GPU on the PCI bus."""
        driver = self.facts.get("driver") or {}
        pci = (self.facts.get("pci") or {}).get("nvidia_gpus")
        return not driver.get("loaded") and not self.facts.get("gpus") and not pci


class StopCheck(Exception):
    """Raised inside a check to end it with a ready Result (see `need`)."""

    def __init__(self, result: Result) -> None:
        super().__init__(result.message)
        self.result = result


@dataclass(frozen=True)
class Check:
    """A registered check: `fn` returns a Result or raises StopCheck through `need`."""

    name: str
    scope: str
    family: str
    severity: str
    summary: str
    fn: Callable[..., Result]
    section: str = "gpus"
    level: str = "quick"


REGISTRY: dict[str, Check] = {}


def check(
    name: str,
    scope: str,
    family: str,
    severity: str = "critical",
    section: str = "gpus",
    level: str = "quick",
) -> Callable:
    """Register a check function under a stable name used by tests, reports and triage.

    `section` is the top-level key of the facts document the check reads: when it is missing,
    saved evidence did not capture it (not evaluated) or the live probe failed to (a failure).
    `level` above "quick" marks a load test: its section comes from a run at that level, not
    from the probe, so without it the check was simply not run.
    """

    def wrap(fn: Callable[..., Result]) -> Callable[..., Result]:
        summary = (fn.__doc__ or name).strip().splitlines()[0]
        REGISTRY[name] = Check(name, scope, family, severity, summary, fn, section, level)
        return fn

    return wrap


def need(record: dict[str, Any], key: str, what: str, required: bool = False) -> Any:
    """record[key], or stop the check with the right verdict for why it is missing.

    Unsupported data skips unless the profile requires it; data the source failed to give fails
    (it is never a silent pass); data a saved log does not contain is "not evaluated".
    """
    value = record.get(key)
    if value is not None:
        return value
    why = (record.get("unavailable") or {}).get(key) or {"kind": "error", "detail": "no value"}
    kind, detail = why.get("kind"), why.get("detail", "")
    if kind == "absent":
        raise StopCheck(Result(SKIP, f"not evaluated: the evidence holds no {what} ({detail})"))
    if kind == "not_supported" and not required:
        raise StopCheck(Result(SKIP, f"{what} not supported here ({detail})"))
    if kind == "not_supported":
        raise StopCheck(
            Result(FAIL, f"{what} not supported ({detail}), but the profile requires it")
        )
    raise StopCheck(
        Result(
            FAIL,
            f"could not read {what}: {detail}",
            "re-run; if it persists, check the driver (nvidia-smi, dmesg) and reboot the node",
        )
    )


def load_test_output(node: NodeView, section: str, key: str, what: str, evidence: str) -> Any:
    """The parsed output of a load test, or stop: SKIP when the runner said it does not apply,
    FAIL when it produced nothing (a load test that did not run is never a pass)."""
    record = node.facts[section]
    if record.get("skip"):
        raise StopCheck(Result(SKIP, record["skip"]))
    output = record.get(key)
    if record.get("error") or output is None:
        raise StopCheck(
            Result(
                FAIL,
                f"{what}: {record.get('error') or 'no output'}",
                record.get("action") or f"read the attached {evidence}",
            )
        )
    return output


def _gpu_label(host: str, index: int, gpu: dict[str, Any] | None) -> str:
    if not gpu:
        return f"{host} gpu{index}"
    ids = [gpu.get("uuid") or "uuid unknown"]
    if gpu.get("serial"):
        ids.append(f"serial {gpu['serial']}")
    if gpu.get("pci_bus_id"):
        ids.append(f"bus {gpu['pci_bus_id']}")
    return f"{host} gpu{index} ({', '.join(ids)})"


def _missing_gpu(node: NodeView, index: int) -> Result:
    found = len(node.facts.get("gpus") or [])
    expected = node.expected_gpus
    if node.no_nvidia and not expected:
        return Result(SKIP, f"no NVIDIA GPU/driver on {node.host}")
    reported = node.facts.get("gpu_count")
    if node.from_evidence and reported is not None and index < reported:
        return Result(SKIP, f"not evaluated: the evidence has no record of GPU {index}")
    if expected is None:
        return Result(
            SKIP,
            f"GPU index {index} not present on {node.host} (found {found}; set gpu_count in "
            "the inventory or --expected-gpus to assert a count)",
        )
    return Result(
        FAIL,
        f"expected {expected} GPUs, found {found}: GPU index {index} missing on {node.host}",
        "check `nvidia-smi -L`, `lspci -d 10de:` and dmesg for Xid 79 (fallen off the bus); "
        "reseat the GPU or RMA it",
    )


def _missing_section(node: NodeView, chk: Check) -> Result:
    section = chk.section
    if node.from_evidence:
        return Result(SKIP, f"not evaluated: the evidence holds no {section} data")
    if chk.level != "quick":
        return Result(SKIP, f"not run: {chk.name} is a load test (--level {chk.level})")
    errors = [
        e.get("error", "") for e in node.facts.get("errors") or [] if e.get("probe") == section
    ]
    why = f": {'; '.join(errors)}" if errors else ""
    return Result(
        FAIL,
        f"the probe returned no {section} data{why}",
        "run `gpuhealth probe` on the node to see the error; update gpuhealth if it is a bug",
    )


def evaluate(name: str, node: NodeView, index: int | None = None) -> Result:
    """Run one registered check on a node (or one GPU of it) and format its message."""
    chk = REGISTRY[name]
    if node.facts.get(chk.section) is None:
        label = node.host if index is None else _gpu_label(node.host, index, None)
        result = _missing_section(node, chk)
    elif chk.scope == "gpu":
        assert index is not None
        gpu = node.gpu(index)
        if gpu is None:
            result = _missing_gpu(node, index)
            label = _gpu_label(node.host, index, None)
        else:
            label = _gpu_label(node.host, index, gpu)
            try:
                result = chk.fn(node, gpu)
            except StopCheck as stop:
                result = stop.result
    else:
        label = node.host
        try:
            result = chk.fn(node)
        except StopCheck as stop:
            result = stop.result
    message = f"{label}: {result.message}"
    if result.action and result.status in (FAIL, WARN):
        message += f". Action: {result.action}"
    return Result(result.status, message, result.action)


def names(scope: str) -> list[str]:
    """Registered check names of a scope, in registration order."""
    return [c.name for c in REGISTRY.values() if c.scope == scope]


# The families register their checks on import; their order is the report order.
FAMILIES = ("gpu", "system", "storage", "fabric", "kernel", "memory", "nccl", "dcgm", "gpud")
for _family in FAMILIES:
    importlib.import_module(f"gpuhealth.checks.{_family}")
