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
    def from_evidence(self) -> bool:
        """Built from a saved log: what it lacks was not captured, not found missing."""
        return self.facts.get("source") == "evidence-file"


class Scope:
    """How a family splits a node into items that per-item checks judge one by one, such as
    the GPU family's GPU slots (gpuhealth.families.gpu.scope). `name` is the checks' scope and
    their test parameter. The family knows how many slots a node has, the record in a slot,
    how a finding names it, and the verdict for a slot with no record (never a pass)."""

    name = ""
    section = ""  # the facts section its records are in: its checks read it unless they say

    def slots(self, node: NodeView) -> int:
        """How many slots the node is judged on."""
        raise NotImplementedError

    def record(self, node: NodeView, index: int) -> Record | None:
        """The item in slot `index`, if the node reported one."""
        raise NotImplementedError

    def listed(self, node: NodeView) -> bool:
        """Whether the facts list the node's items at all: a slot with no record then gets
        `missing`'s verdict even from a check whose own section is absent (no run history)."""
        raise NotImplementedError

    def label(self, host: str, index: int, record: Record | None) -> str:
        """How findings name the item in slot `index` (`record` None: not known)."""
        raise NotImplementedError

    def missing(self, node: NodeView, index: int) -> Result:
        """The verdict for slot `index` having no record."""
        raise NotImplementedError


class StopCheck(Exception):
    """Raised inside a check to end it with a ready Result (see `need`)."""

    def __init__(self, result: Result) -> None:
        super().__init__(result.message)
        self.result = result


CheckFn = Callable[..., Result]


@dataclass(frozen=True)
class Check:
    """A registered check; `fn(node)`, or `fn(node, record)` for a check judged per item of a
    Scope (`per`, e.g. per GPU), returns a Result or raises StopCheck.

    `section` is the top-level key of the facts document the check reads: when it is missing,
    saved evidence did not capture it (not evaluated) or the live probe failed to (a failure).
    `level` above "quick" marks a load test: its section comes from a run at that level.
    `group` is the report group (Allure suite); a family ranks the groups it reports in
    (CheckSet.ranks), which orders the check's findings in a verdict.
    `in_use` says whether it is judged on a node a job is using: fault rules are, rules that
    need an idle node (stray processes, idle temperature, load tests) are skipped there.
    `added` says why its section is missing when the controller adds it (not the probe).
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
    per: Scope | None = None
    added: str | None = None


@dataclass
class CheckSet:
    """The checks of one family in report order, registered with `node` and `per`, and the
    report groups the family ranks: group -> how early its findings come in a node's reasons
    (0 first: hardware and driver, then fabric and storage, then configuration and software).
    A check may report in a group another family ranks (the registry holds every group to one
    rank and every check's group to a rank). `section` is the facts section its checks read
    unless they name one; `added` maps a section the controller adds (not the probe) to why it
    can be missing."""

    family: str
    ranks: dict[str, int] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    section: str = ""
    added: dict[str, str] = field(default_factory=dict)

    def _register(
        self,
        per: Scope | str | None,
        name: str,
        group: str,
        in_use: bool,
        severity: str = "critical",
        section: str = "",
        level: str = "quick",
    ) -> Callable[[CheckFn], CheckFn]:
        if level != "quick" and in_use:
            raise ValueError(f"check {name}: a load test ({level}) never runs on a node in use")
        scope = "node" if per is None else per if isinstance(per, str) else per.name
        item = per if isinstance(per, Scope) else None  # a scope by name: the registry's
        section = section or self.section or (item.section if item else "")
        if not section:
            raise ValueError(f"check {name}: no facts section (section=, or the CheckSet's)")

        def wrap(fn: CheckFn) -> CheckFn:
            summary = (fn.__doc__ or name).strip().splitlines()[0]
            self.checks.append(
                Check(
                    name,
                    scope,
                    self.family,
                    group,
                    severity,
                    summary,
                    fn,
                    section,
                    level,
                    in_use,
                    item,
                    self.added.get(section),
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
        return self._register(None, name, group, in_use, **options)

    def per(
        self, scope: Scope | str, name: str, group: str, *, in_use: bool, **options: str
    ) -> Callable[[CheckFn], CheckFn]:
        """Register a check judged per slot of `scope` (e.g. the GPU family's GPU slots):
        `fn(node, record) -> Result`; a slot with no record gets the scope's verdict. A
        family that may not import the scope's family names it: the registry finds it."""
        return self._register(scope, name, group, in_use, **options)


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


# Why an idle rule is not judged on a busy node (the verdict says which state it was judged in).
IN_USE_SKIP = "node in use: judged on idle nodes only"


def _missing_section(node: NodeView, chk: Check) -> Result:
    name = chk.section
    if chk.added is not None:
        return skipped(f"not evaluated: {chk.added}")
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
    """Run one check on a node (or one slot of its scope: a GPU)."""
    per = chk.per
    if per is None and chk.scope != "node":
        raise ValueError(f"{chk.name}: its {chk.scope} scope is found by gpuhealth.registry")
    label = node.host if per is None or index is None else per.label(node.host, index, None)
    if node.in_use and not chk.in_use:
        return Finding(chk.name, node.host, index, label, skipped(IN_USE_SKIP))
    absent = node.facts.get(chk.section) is None
    # A section the controller did not add (no history) is no reason to forget a GPU missing
    # from the node's GPU list: that slot fails like every check's (a saved log with no GPU
    # list is still "not evaluated").
    if absent and not (chk.added is not None and per is not None and per.listed(node)):
        result = _missing_section(node, chk)
    elif per is not None:
        if index is None:
            raise ValueError(f"{chk.name} is judged per {per.name}: give the slot's index")
        item = per.record(node, index)
        if item is None:
            result = per.missing(node, index)
        elif absent:
            result = _missing_section(node, chk)
        else:
            label = per.label(node.host, index, item)
            result = _run(chk.fn, node, item)
    else:
        result = _run(chk.fn, node)
    return Finding(chk.name, node.host, index, label, result)


def _run(fn: CheckFn, *args: Any) -> Result:
    try:
        return fn(*args)
    except StopCheck as stop:
        return stop.result


def judged(checks: list[Check], view: NodeView, slots: int) -> list[Finding]:
    """Every check on one node: node checks once, per-item checks (per GPU) for each of
    `slots` slots."""
    found = [evaluate(c, view) for c in checks if c.scope == "node"]
    for index in range(slots):
        found += [evaluate(c, view, index) for c in checks if c.scope != "node"]
    return found
