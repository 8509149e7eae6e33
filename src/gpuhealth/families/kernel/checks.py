"""Kernel-log checks: XIDs per GPU, what the log says about the node, fabric manager errors.

The probe (or a saved log) gives event groups with exact counts; these checks keep the groups
inside the profile's `xid_window_h` and judge them by the XID table (xids.yml) and the table
of GPU faults reported without an Xid (parse_kernel_faults). The window ends where the log
was read (live) or at the log's last entry (triage, which has no "now").
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict

from gpuhealth.checks import CheckSet, NodeView, StopCheck, detail, need, section
from gpuhealth.families.gpu.checks import RECOVERY, UNKNOWN_RECOVERY, require_nvidia
from gpuhealth.families.gpu.schema import recovery_action_name
from gpuhealth.families.gpu.scope import GPU
from gpuhealth.families.kernel.limits import KernelLimits
from gpuhealth.families.kernel.parse_kernel_faults import FAULTS
from gpuhealth.families.kernel.parse_kernel_log import epoch, group_key, stamp
from gpuhealth.results import Action, Result, Status, failed, passed, skipped

CHECKS = CheckSet("kernel")
FAIL, WARN = Status.FAIL, Status.WARN

Rule = tuple[Status, str, Action, str]  # (verdict, meaning, action code, advice)


class _XidRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    verdict: Literal["FAIL", "WARN"]
    meaning: str
    action: Action
    advice: str
    source: str


class _XidTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    advice: dict[str, str]
    xids: dict[int, _XidRule]


@cache
def xid_table() -> dict[int, Rule]:
    """The XID table (xids.yml, with the source of every entry) as rules by XID."""
    text = (resources.files(__package__) / "xids.yml").read_text()
    table = _XidTable.model_validate(yaml.safe_load(text))
    return {
        code: (
            Status(rule.verdict),
            rule.meaning,
            rule.action,
            table.advice.get(rule.advice, rule.advice),
        )
        for code, rule in table.xids.items()
    }


class _FaultRule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    pattern: str
    verdict: Literal["FAIL", "WARN"]
    meaning: str
    action: Action
    advice: str
    source: str


@cache
def fault_table() -> dict[str, Rule]:
    """The kernel-fault table (parse_kernel_faults.FAULTS, validated) as rules by name."""
    rules = [_FaultRule.model_validate(entry) for entry in FAULTS]
    return {r.name: (Status(r.verdict), r.meaning, r.action, r.advice) for r in rules}


_UNKNOWN_XID: Rule = (
    WARN,
    "not in gpuhealth's XID table",
    Action.INSPECT,
    "look it up in NVIDIA's XID catalog",
)
_READ_ACTION = (
    "run the probe as root, or allow dmesg for its user (sysctl kernel.dmesg_restrict=0, or "
    "membership of the systemd-journal group)"
)


def _need_log(record: dict[str, Any], what: str) -> list[dict[str, Any]]:
    counts = record.get("counts")
    if counts is not None:
        return counts
    raise StopCheck(
        failed(
            f"could not read {what} ({detail(record, 'counts')})", Action.FIX_CONFIG, _READ_ACTION
        )
    )


class _Window:
    """The profile's window over one log section, anchored where the section says."""

    def __init__(self, node: NodeView, log: dict[str, Any]) -> None:
        self.hours = node.limits.get(KernelLimits).xid_window_h
        self.log = log
        until, until_uptime = log.get("until"), log.get("until_uptime_s")
        span = self.hours * 3600
        self.since = epoch(until) - span if self.hours and until else None
        self.since_uptime = until_uptime - span if self.hours and until_uptime is not None else None

    def holds(self, when: str | None, uptime: float | None) -> bool:
        if when is not None and self.since is not None:
            return epoch(when) >= self.since
        if uptime is not None and self.since_uptime is not None:
            return uptime >= self.since_uptime
        return True  # a time the window cannot place: keep it rather than hide it

    def groups(self, kinds: tuple[str, ...]) -> list[dict[str, Any]]:
        """Event groups of these kinds inside the window (counts cut at the window's start)."""
        kept = []
        for group in self.log["counts"]:
            if group["kind"] not in kinds or not self.holds(group["last"], group["last_uptime_s"]):
                continue
            if self.holds(group["first"], group["first_uptime_s"]):
                kept.append(group)
                continue
            key = group_key(group)
            members = [e for e in self.log["events"] or [] if group_key(e) == key]
            inside = [e for e in members if self.holds(e["time"], e["uptime_s"])]
            # The sample keeps each group's last events, but the 1000-event cap may cut them.
            first = inside[0] if inside else {"time": group["last"], "text": group["sample"]}
            kept.append(
                {
                    **group,
                    "count": max(len(inside), 1),
                    "at_least": len(members) < group["count"],
                    "first": first["time"],
                    "first_uptime_s": first.get("uptime_s", group["last_uptime_s"]),
                    "sample": first["text"],
                }
            )
        return kept

    def words(self) -> str:
        """Where the window lies, for messages; triage says it was anchored at the log's end."""
        log = self.log
        if log.get("anchored_at") == "newest_entry":
            if log.get("until") is None and log.get("until_uptime_s") is None:
                return "in the whole log (it has no timestamp to end a window at)"
            end = log.get("until") or f"{log.get('until_uptime_s')} s after boot"
            notes = "".join(f"; {note}" for note in log.get("notes") or [])
            if not self.hours:
                return f"in the whole log (last entry {end}{notes})"
            return (
                f"within {self.hours:g} h before the log's last entry {end} "
                f"(a saved log has no 'now', so the window ends there{notes})"
            )
        if not self.hours:
            return f"since boot (read {log.get('until')} from {log.get('source')})"
        since = log.get("since")
        if self.since is not None and (since is None or epoch(since) < self.since):
            since = stamp(self.since)
        return f"since {since} ({self.hours:g} h window, this boot; from {log.get('source')})"


def _xid_rule(code: int) -> Rule:
    return xid_table().get(code, _UNKNOWN_XID)


def _when(group: dict[str, Any], which: str) -> str:
    value = group[which]
    if value is not None:
        return value
    uptime = group[f"{which}_uptime_s"]
    return f"{uptime:.0f} s after boot" if uptime is not None else "time unknown"


def _describe(group: dict[str, Any], label: str) -> str:
    """`Xid 48 (double-bit ECC error) x1 [time]: "text"`, with processes when known."""
    count = f"{'>=' if group.get('at_least') else ''}{group['count']}"
    first, last = _when(group, "first"), _when(group, "last")
    span = first if first == last else f"{first} .. {last}"
    procs = f", processes {', '.join(group['processes'])}" if group.get("processes") else ""
    sample = group["sample"] if len(group["sample"]) <= 100 else group["sample"][:97] + "..."
    return f'{label} x{count} [{span}]{procs}: "{sample}"'


Found = tuple[Status, str, Action, str]  # (status, what was seen, action code, advice)


def _judge(found: list[Found], window: _Window, clean: str) -> Result:
    """One Result from the findings: the worst status, its most drastic action, its advice,
    and every text. The message starts with the window, so a saved log's finding says where
    its window ends."""
    if not found:
        return passed(f"{clean} {window.words()}")
    worst = FAIL if any(status == FAIL for status, _, _, _ in found) else WARN
    found.sort(key=lambda item: item[0] != FAIL)
    advice: list[str] = []
    for status, _, _, words in found:
        if status == worst and words not in advice:
            advice.append(words)
    action = min((a for st, _, a, _ in found if st == worst), key=lambda a: a.rank)
    texts = "; ".join(text for _, text, _, _ in found)
    return Result(worst, f"{window.words()}: {texts}", action, "; ".join(advice))


def _group_rule(group: dict[str, Any]) -> Rule:
    """The XID table's rule, as the lines themselves refine it: an NVLink5 XID (144-150) that
    says Nonfatal warns; XID 154 is judged by the recovery action its latest change left."""
    status, meaning, action, advice = _xid_rule(group["code"])
    if group.get("fatal") is False and group["code"] in range(144, 151):
        return WARN, f"{meaning}, Nonfatal", Action.INSPECT, advice
    if group["code"] == 154 and "recovery" in group:
        pending = group["recovery"]
        if pending == 0:
            return WARN, f"{meaning}, back to NONE", Action.INSPECT, "watch for the XID again"
        if pending is not None:
            action, advice = RECOVERY.get(pending, UNKNOWN_RECOVERY)
            name = recovery_action_name(pending)
            return FAIL, f"{meaning}, pending {name} ({pending})", action, advice
    return status, meaning, action, advice


def _xid_findings(groups: list[dict[str, Any]], where: str = "") -> list[Found]:
    found: list[Found] = []
    rules = [(group, _group_rule(group)) for group in groups]
    for group, (status, meaning, action, advice) in sorted(
        rules, key=lambda pair: (pair[1][0] != FAIL, pair[0]["code"])
    ):
        label = f"Xid {group['code']} ({meaning}){where.format(bus=group['bus_id'])}"
        found.append((status, _describe(group, label), action, advice))
    return found


def _fault_findings(groups: list[dict[str, Any]], where: Any = None) -> list[Found]:
    """Kernel faults reported without an Xid, each with the GPU it is on (`where` names it)."""
    found: list[Found] = []
    for group in groups:
        status, meaning, action, advice = fault_table().get(
            group.get("fault") or "", (FAIL, "GPU fault", Action.INSPECT, "read the log")
        )
        label = f"{meaning} (kernel fault {group.get('fault')}, no Xid)"
        found.append(
            (status, _describe(group, label + (where(group) if where else "")), action, advice)
        )
    return found


def _fault_gpu(known: dict[str, int]) -> Any:
    """The words that name a kernel fault's GPU in the node's message."""

    def where(group: dict[str, Any]) -> str:
        bus = group.get("bus_id")
        if bus:
            index = known.get(bus)
            return f" on {bus}" + (f" (gpu{index})" if index is not None else "")
        if group.get("gpu"):
            return (
                f" on the driver's {group['gpu']} (its number, not nvidia-smi's index; the log "
                "gives no bus id for it)"
            )
        return " on a GPU the line does not name"

    return where


@CHECKS.per(GPU, "xid_errors", "errors", section="kernel_log", in_use=True)
def xid_errors(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No hardware XIDs or kernel-reported faults (off the bus, GSP timeouts...) for this GPU
    in the kernel log within the window (app XIDs warn)."""
    log = section(node, "kernel_log")
    _need_log(log, "the kernel log")
    bus = need(gpu, "pci_bus_id", "PCI bus id (to find the GPU's XIDs)")
    window = _Window(node, log)
    groups = [g for g in window.groups(("xid",)) if g["bus_id"] == bus.upper()]
    mine = [g for g in window.groups(("fault",)) if g["bus_id"] == bus.upper()]
    return _judge(_xid_findings(groups) + _fault_findings(mine), window, "no XIDs or GPU faults")


@CHECKS.node("kernel_log", "errors", section="kernel_log", in_use=True)
def kernel_log(node: NodeView) -> Result:
    """No XIDs of unknown GPUs, kernel-reported GPU faults, NVSwitch SXIDs or nvidia-peermem
    errors in the kernel log."""
    require_nvidia(node, evidence_too=False)
    log = section(node, "kernel_log")
    _need_log(log, "the kernel log")
    window = _Window(node, log)
    gpus = node.facts.get("gpus")
    known = {g["pci_bus_id"].upper() for g in gpus or [] if g.get("pci_bus_id")}
    xids = window.groups(("xid",))
    mine = [g for g in xids if g["bus_id"] in known]
    others = [g for g in xids if g["bus_id"] not in known]
    where = " on {bus}" + (
        ", which is none of the node's GPUs" if gpus else " (the evidence names no GPUs)"
    )
    found = _xid_findings(others, where)
    # A GPU fault fails the node whichever GPU it is on: it may be the one the driver lost.
    indexes = {g["pci_bus_id"].upper(): g.get("index") for g in gpus or [] if g.get("pci_bus_id")}
    found += _fault_findings(window.groups(("fault",)), _fault_gpu(indexes))
    for group in window.groups(("sxid",)):
        label = f"NVSwitch SXid {group['code']} ({'fatal' if group.get('fatal') else 'non-fatal'})"
        text = _describe(group, f"{label} on {group['bus_id']}")
        if group.get("fatal"):
            advice = (
                "drain the node; reboot to reset the NVSwitch fabric and check "
                "nvidia-fabricmanager; have the baseboard inspected if it recurs"
            )
            found.append((FAIL, text, Action.REBOOT_NODE, advice))
        else:
            advice = "watch for repeats; check the NVSwitch port it names"
            found.append((WARN, text, Action.INSPECT, advice))
    for group in window.groups(("unreadable",)):
        found.append(
            (
                FAIL,
                _describe(group, "XID/SXID reports that cannot be read"),
                Action.INSPECT,
                "read the lines in the log: a mangled report may hide a hardware error",
            )
        )
    for group in window.groups(("peermem",)):
        found.append(
            (
                WARN,
                _describe(group, "nvidia-peermem errors"),
                Action.CHECK_APP,
                "check the GPUDirect RDMA job and that nvidia-peermem matches the driver",
            )
        )
    mapped = f" ({len(mine)} XID kinds on the node's GPUs are for xid_errors)" if mine else ""
    return _judge(
        found, window, f"no SXIDs, GPU faults, peermem errors or XIDs of unknown GPUs{mapped}"
    )


@CHECKS.node("fabric_manager", "nvlink", section="fabric_manager", in_use=True)
def fabric_manager(node: NodeView) -> Result:
    """No NVSwitch fatal errors (fail) or other errors (warn) in the fabric manager's log."""
    require_nvidia(node, evidence_too=False)
    log = section(node, "fabric_manager")
    if not log.get("present"):
        return skipped(f"no fabric manager log at {log.get('log')} (no NVSwitch here?)")
    _need_log(log, f"the fabric manager log {log.get('log') or ''}".rstrip())
    window = _Window(node, log)
    found: list[Found] = [
        (
            FAIL,
            _describe(group, "fabric manager entries that cannot be read"),
            Action.INSPECT,
            "read the entries in the log: a garbled level or date may hide a fatal error",
        )
        for group in window.groups(("unreadable",))
    ]
    for group in window.groups(("fabric_manager",)):
        code = f" {group['code']}" if group["code"] is not None else ""
        where = f" on NVSwitch {group['bus_id']}" if group["bus_id"] else ""
        if group.get("fatal"):
            label = f"fabric manager fatal error{code}{where}"
            advice = (
                "drain the node; restart nvidia-fabricmanager or reboot to reset the fabric; have "
                "the baseboard inspected if it recurs"
            )
            found.append((FAIL, _describe(group, label), Action.REBOOT_NODE, advice))
        else:
            label = f"fabric manager error{code}{where}"
            advice = "watch for repeats; check `nvidia-smi nvlink -s` and the NVSwitch port named"
            found.append((WARN, _describe(group, label), Action.INSPECT, advice))
    return _judge(found, window, "no fabric manager errors")
