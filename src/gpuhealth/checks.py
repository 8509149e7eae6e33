"""The toolkit of check families: registering checks, reading facts, and judging a node.

Checks are pure functions over one facts document and the node's resolved limits. The pytest
suite, `gpuhealth triage` and the node-local modes all call `evaluate`, so a live run, a run on
saved facts and a triage of a pasted log judge a node by exactly the same rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuhealth.facts import IDLE, IN_USE, NODE_STATES, reason
from gpuhealth.results import Action, Result, Status, failed, skipped

if TYPE_CHECKING:
    from gpuhealth.config import Profile

Record = dict[str, Any]
# GPU slots parametrised when nothing says how many GPUs a host should have: enough for the
# 8-GPU nodes this tool is for; more GPUs than slots fail the gpu_count check with a hint.
UNKNOWN_GPU_SLOTS = 8


@dataclass(frozen=True)
class NodeView:
    """Everything a check may look at for one host: its facts, its resolved limits and the
    node state it is judged in (`state`; by default the state the probe decided, see
    `node_state`)."""

    host: str
    facts: Record
    limits: Profile
    state: str | None = None

    @property
    def node_state(self) -> str:
        """`idle` or `in-use`: the given state, else the facts' `node_state.state`, else idle
        (facts from before node states, and a malformed record, get the strictest rules)."""
        if self.state is not None:
            return self.state
        record = self.facts.get("node_state")
        found = record.get("state") if isinstance(record, dict) else None
        return found if found in NODE_STATES else IDLE

    @property
    def node_state_source(self) -> str:
        """Why the node is judged in its state, in words (for every verdict and answer)."""
        if self.state is not None:
            return "given"
        record = self.facts.get("node_state")
        if isinstance(record, dict) and record.get("state") in NODE_STATES:
            return str(record.get("source") or "the probe")
        if record is None and "node_state" not in self.facts:
            return "facts without a node state: judged idle"
        return "no valid node state in the facts: judged idle"

    @property
    def in_use(self) -> bool:
        """A job owns the GPUs: only fault rules apply."""
        return self.node_state == IN_USE

    @property
    def expected_gpus(self) -> int | None:
        """The GPU count the inventory or profile expects, if any."""
        return self.limits.values.get("gpu_count")

    def gpu(self, index: int) -> Record | None:
        """The GPU record with this index, if the node reported one."""
        for gpu in self.facts.get("gpus") or []:
            if isinstance(gpu, dict) and gpu.get("index") == index:
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


CheckFn = Callable[..., Result]


@dataclass(frozen=True)
class Check:
    """A registered check; `fn(node)` or `fn(node, gpu)` returns a Result or raises StopCheck.

    `section` is the top-level key of the facts document the check reads: when it is missing,
    saved evidence did not capture it (not evaluated) or the live probe failed to (a failure).
    `level` above "quick" marks a load test: its section comes from a run at that level.
    `group` is the report group (Allure suite); a family ranks the groups it reports in
    (CheckSet.ranks), which orders the check's findings in a verdict.
    `in_use` says whether it is judged on a node a job is using: fault rules are, rules that
    need an idle node (stray processes, idle temperature, load tests) are skipped there.
    """

    name: str
    scope: str
    family: str
    group: str
    severity: str
    summary: str
    fn: CheckFn
    section: str
    level: str
    in_use: bool


@dataclass
class CheckSet:
    """The checks of one family in report order, registered with `node` and `gpu`, and the
    report groups the family ranks: group -> how early its findings come in a node's reasons
    (0 first: hardware and driver, then fabric and storage, then configuration and software).
    A check may report in a group another family ranks (the registry holds every group to one
    rank and every check's group to a rank)."""

    family: str
    ranks: dict[str, int] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    def _register(
        self,
        scope: str,
        name: str,
        group: str,
        in_use: bool,
        severity: str = "critical",
        section: str = "gpus",
        level: str = "quick",
    ) -> Callable[[CheckFn], CheckFn]:
        if level != "quick" and in_use:
            raise ValueError(f"check {name}: a load test ({level}) never runs on a node in use")

        def wrap(fn: CheckFn) -> CheckFn:
            summary = (fn.__doc__ or name).strip().splitlines()[0]
            self.checks.append(
                Check(
                    name, scope, self.family, group, severity, summary, fn, section, level, in_use
                )
            )
            return fn

        return wrap

    def node(
        self, name: str, group: str, *, in_use: bool, **options: str
    ) -> Callable[[CheckFn], CheckFn]:
        """Register a check judged once per node: `fn(node) -> Result`. `in_use` is required:
        every check says whether it is judged on a node a job is using (options: severity,
        section, level)."""
        return self._register("node", name, group, in_use, **options)

    def gpu(
        self, name: str, group: str, *, in_use: bool, **options: str
    ) -> Callable[[CheckFn], CheckFn]:
        """Register a check judged per expected GPU slot: `fn(node, gpu_record) -> Result`."""
        return self._register("gpu", name, group, in_use, **options)


def need(record: Record, key: str, what: str, required: bool = False) -> Any:
    """record[key], or stop the check with the right verdict for why it is missing.

    Unsupported data skips unless the profile requires it; data the source failed to give fails
    (it is never a silent pass); data a saved log does not contain is "not evaluated".
    """
    value = record.get(key)
    if value is not None:
        return value
    raise StopCheck(missing(record, key, what, required))


def missing(record: Record | None, key: str, what: str, required: bool = False) -> Result:
    """The verdict for record[key] being null, from the reason recorded next to it."""
    why = reason(record, key)
    kind, detail = why["kind"], why["detail"]
    if kind == "absent":
        return skipped(f"not evaluated: the evidence holds no {what} ({detail})")
    if kind == "not_supported" and not required:
        return skipped(f"{what} not supported here ({detail})")
    if kind == "not_supported":
        return failed(
            f"{what} not supported ({detail}), but the profile requires it",
            Action.FIX_CONFIG,
            "update the driver, or set the profile key that requires it to false",
        )
    return failed(
        f"could not read {what}: {detail}",
        Action.RERUN,
        "re-run; if it persists, check the driver (nvidia-smi, dmesg) and reboot the node",
    )


# Which null weighs most when several are: a failed read, then an unsupported field, then
# one a saved log does not hold.
_WORST = {"error": 0, "timeout": 0, "not_supported": 1, "absent": 2}


def null_rank(record: Record | None, key: str) -> int:
    """How much record[key]'s null weighs (0 most), to pick the one several unknowns are
    judged by."""
    return _WORST[reason(record, key)["kind"]]


def missing_any(
    record: Record | None, keys: list[str], what: str, required: bool = False
) -> Result:
    """`missing` for several null keys of one record, judged by the worst reason among them."""
    worst = min(keys, key=lambda key: null_rank(record, key))
    return missing(record, worst, what, required)


def detail(record: Record | None, key: str) -> str:
    """Why record[key] is null, in words, for messages that only report it."""
    return reason(record, key)["detail"]


def section(node: NodeView, name: str) -> Record:
    """A facts section that `evaluate` found present; stop with SKIP when it does not apply."""
    value = node.facts[name]
    if not isinstance(value, dict):
        raise StopCheck(
            failed(
                f"the {name} section is not an object ({type(value).__name__})",
                Action.RERUN,
                "re-collect the facts with this gpuhealth",
            )
        )
    if value.get("skipped"):
        raise StopCheck(skipped(str(value["skipped"])))
    return value


def load_test_output(node: NodeView, name: str, key: str, what: str, evidence: str) -> Any:
    """The parsed output of a load test, or stop: SKIP when the runner said it does not apply,
    FAIL when it produced nothing (a load test that did not run is never a pass). The runner
    records why in the section's `error`, with an `action` code and `advice`."""
    record = section(node, name)
    output = record.get(key)
    if record.get("error") or output is None:
        code = record.get("action")
        raise StopCheck(
            failed(
                f"{what}: {record.get('error') or 'no output'}",
                Action(code) if code in Action.__members__ else Action.RERUN,
                record.get("advice") or f"read the attached {evidence}",
            )
        )
    return output


def gpu_label(host: str, index: int, gpu: Record | None) -> str:
    """`node17 gpu3 (GPU-..., serial ..., bus ...)`: how findings name a GPU."""
    if not gpu:
        return f"{host} gpu{index}"
    ids = [str(gpu.get("uuid") or "uuid unknown")]
    if gpu.get("serial"):
        ids.append(f"serial {gpu['serial']}")
    if gpu.get("pci_bus_id"):
        ids.append(f"bus {gpu['pci_bus_id']}")
    return f"{host} gpu{index} ({', '.join(ids)})"


def _missing_gpu(node: NodeView, index: int) -> Result:
    gpus = node.facts.get("gpus") or []
    found = len(gpus)
    expected = node.expected_gpus
    if node.no_nvidia and not expected:
        return skipped(f"no NVIDIA GPU/driver on {node.host}")
    reported = node.facts.get("gpu_count")
    # A saved output that lists every GPU it saw (reported) leaves out none of a smaller count;
    # a fragment that does not say how many there are leaves the others unknown, not missing.
    if node.from_evidence and (reported is None or isinstance(reported, int) and index < reported):
        return skipped(f"not evaluated: the evidence has no record of GPU {index}")
    if expected is None:
        return skipped(
            f"GPU index {index} not present on {node.host} (found {found}; set gpu_count in "
            "the inventory or --expected-gpus to assert a count)"
        )
    pci = (node.facts.get("pci") or {}).get("nvidia_gpus")
    if isinstance(pci, list) and len(pci) >= expected:
        # Every GPU is still on the PCI bus: the driver lost one (NVML renumbers the rest, so
        # this slot is not necessarily the lost GPU's), which a reboot brings back.
        return failed(
            f"expected {expected} GPUs, found {found} (all {len(pci)} on the PCI bus): GPU "
            f"index {index} missing on {node.host}",
            Action.REBOOT_NODE,
            "see gpu_count for the bus id the driver lost; drain and reboot the node, then "
            "reseat or RMA that GPU if it stays lost",
        )
    return failed(
        f"expected {expected} GPUs, found {found}: GPU index {index} missing on {node.host}",
        Action.RMA,
        "check `nvidia-smi -L`, `lspci -d 10de:` and dmesg for Xid 79 (fallen off the bus); "
        "reseat the GPU or RMA it",
    )


# Why an idle rule is not judged on a busy node (the verdict says which state it was judged in).
IN_USE_SKIP = "node in use: judged on idle nodes only"

# The section the controller adds from the run store (families/history), never the probe.
HISTORY_SECTION = "history"


def _missing_section(node: NodeView, chk: Check) -> Result:
    name = chk.section
    if name == HISTORY_SECTION:
        return skipped("not evaluated: no run history given (the suite adds it: --history)")
    if node.from_evidence:
        return skipped(f"not evaluated: the evidence holds no {name} data")
    if chk.level != "quick":
        return skipped(f"not run: {chk.name} is a load test (--level {chk.level})")
    errors = [
        str(e.get("error", ""))
        for e in node.facts.get("errors") or []
        if isinstance(e, dict) and e.get("probe") == name
    ]
    if name not in node.facts and not errors:
        # Every probe writes every section it knows (None when it failed): a section missing
        # altogether means facts from a probe older than the family, judged offline.
        version = node.facts.get("probe_version") or "unknown"
        return skipped(
            f"not evaluated: these facts have no {name} section (collected by probe "
            f"{version}, before that family existed); collect them again to judge it"
        )
    why = f": {'; '.join(errors)}" if errors else ""
    return failed(
        f"the probe returned no {name} data{why}",
        Action.RERUN,
        "run `gpuhealth probe` on the node to see the error; update gpuhealth if it is a bug",
    )


@dataclass(frozen=True)
class Finding:
    """A check's Result on one host (and GPU), with the label that names the GPU."""

    check: str
    host: str
    gpu: int | None
    label: str
    result: Result

    @property
    def status(self) -> Status:
        """The result's status."""
        return self.result.status

    @property
    def action(self) -> Action:
        """The result's action code."""
        return self.result.action

    @property
    def advice(self) -> str | None:
        """The result's advice, in words."""
        return self.result.advice

    @property
    def text(self) -> str:
        """The finding as one line: `label: message. Action CODE: advice` (FAIL and WARN)."""
        text = f"{self.label}: {self.result.message}"
        if self.result.status in (Status.FAIL, Status.WARN):
            text += f". Action {self.result.action}"
            text += f": {self.result.advice}" if self.result.advice else ""
        return text


def evaluate(chk: Check, node: NodeView, index: int | None = None) -> Finding:
    """Run one check on a node (or one GPU slot of it)."""
    label = node.host if index is None else gpu_label(node.host, index, None)
    if node.in_use and not chk.in_use:
        return Finding(chk.name, node.host, index, label, skipped(IN_USE_SKIP))
    absent = node.facts.get(chk.section) is None
    # No history is no reason to forget a GPU missing from the node's GPU list: that slot
    # fails like every check's (a saved log with no GPU list is still "not evaluated").
    gpus_known = node.facts.get("gpus") is not None
    if absent and not (chk.section == HISTORY_SECTION and chk.scope == "gpu" and gpus_known):
        result = _missing_section(node, chk)
    elif chk.scope == "gpu":
        if index is None:
            raise ValueError(f"{chk.name} is judged per GPU: give the GPU index")
        gpu = node.gpu(index)
        if gpu is None:
            result = _missing_gpu(node, index)
        elif absent:
            result = _missing_section(node, chk)
        else:
            label = gpu_label(node.host, index, gpu)
            result = _run(chk.fn, node, gpu)
    else:
        result = _run(chk.fn, node)
    return Finding(chk.name, node.host, index, label, result)


def _run(fn: CheckFn, *args: Any) -> Result:
    try:
        return fn(*args)
    except StopCheck as stop:
        return stop.result


def judged(checks: list[Check], view: NodeView, slots: int) -> list[Finding]:
    """Every check on one node: node checks once, GPU checks for each of `slots` GPUs."""
    found = [evaluate(c, view) for c in checks if c.scope == "node"]
    for index in range(slots):
        found += [evaluate(c, view, index) for c in checks if c.scope == "gpu"]
    return found


def gpu_slots(expected: int | None, facts: Record | None = None) -> int:
    """How many GPU slots a node is judged on: the expected count when there is one, else
    what its facts report (never fewer than it shows), else the 8 of the nodes gpuhealth is
    for (a node with more GPUs than slots fails gpu_count with a hint)."""
    if expected is not None:
        return expected
    if facts is not None:
        reported = facts.get("gpu_count")
        gpus = facts.get("gpus") or []
        return max(reported if isinstance(reported, int) and reported >= 0 else 0, len(gpus))
    return UNKNOWN_GPU_SLOTS
