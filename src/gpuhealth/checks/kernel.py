"""Kernel-log checks: XIDs per GPU, what the log says about the node, fabric manager errors.

The probe (or a saved log) gives event groups with exact counts; these checks keep the groups
inside the profile's `xid_window_h` and judge them by the XID table below. The window ends
where the log was read (live) or at the log's newest entry (triage, which has no "now").
"""

from __future__ import annotations

from typing import Any

from gpuhealth.checks import FAIL, PASS, SKIP, WARN, NodeView, Result, StopCheck, check, need
from gpuhealth.parsers.kernel_log import epoch, stamp

# XID -> (verdict, what it means, what to do). Sources: NVIDIA's XID catalog, "Resolution
# Bucket" columns (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, mirrored in
# leptonai/gpud components/accelerator/nvidia/xid/catalog_generated.go); NVIDIA's GPU memory
# error management guide (row remapping: 63 pending until reset, 64 failure, 94 contained,
# 95 uncontained); GPUd's curated table (components/accelerator/nvidia/xid/xid.go: 48, 63, 64,
# 74, 79, 95, 119 ask for a reboot and hardware inspection if they recur; 13, 31, 43, 45 are
# the application's); ../shared/reference/nvml-and-tools.md section 8. Hardware and driver
# XIDs fail; application XIDs and XIDs not listed here warn.
_RESET = "drain the node and reset the GPU (nvidia-smi -r -i INDEX) or reboot"
_APP = (
    "check the user application (compute-sanitizer, cuda-gdb); if other jobs hit it too, reset "
    "the GPU"
)
_NVLINK = (
    "drain and reboot; if it recurs, check `nvidia-smi nvlink -e` and the NVSwitch/fabric manager "
    "logs and have the NVLink path (baseboard) inspected"
)
XID_TABLE: dict[int, tuple[str, str, str]] = {
    13: (WARN, "graphics engine exception", _APP),
    31: (WARN, "GPU memory page fault", _APP),
    43: (WARN, "GPU stopped processing, channel reset", _APP),
    45: (WARN, "preemptive cleanup after earlier errors", "look for the XID that preceded it"),
    46: (FAIL, "GPU stopped processing", _RESET),
    48: (
        FAIL,
        "double-bit ECC error, DBE",
        "drain the node and reset the GPU (or reboot); RMA the GPU if DBEs recur",
    ),
    54: (FAIL, "auxiliary power not connected", "check the GPU's power cables and reseat them"),
    61: (FAIL, "internal micro-controller breakpoint", _RESET),
    62: (FAIL, "internal micro-controller halt", _RESET),
    63: (
        FAIL,
        "row remap / page retirement recorded, pending reset",
        "drain the node and reset the GPU (or reboot) to apply the remap",
    ),
    64: (FAIL, "row remap / page retirement failed", "drain the node and RMA the GPU"),
    74: (FAIL, "NVLink error", _NVLINK),
    79: (
        FAIL,
        "GPU has fallen off the bus",
        "drain and power-cycle the node; reseat the GPU and check its power; RMA if it recurs",
    ),
    92: (WARN, "high single-bit ECC error rate", "watch the ECC trend; RMA if it keeps rising"),
    94: (
        FAIL,
        "contained ECC error",
        "restart the affected job, then drain the node and reset the GPU to remap the row",
    ),
    95: (
        FAIL,
        "uncontained ECC error",
        "drain and reboot the node (reset the GPU if MIG is on); RMA if it recurs",
    ),
    109: (FAIL, "context switch timeout", _RESET),
    110: (FAIL, "security fault", _RESET),
    119: (
        FAIL,
        "GSP RPC timeout",
        "drain the node and reset the GPU or reboot; if it recurs, update the driver",
    ),
    120: (
        FAIL,
        "GSP error",
        "drain the node and reset the GPU or reboot; if it recurs, update the driver",
    ),
    136: (FAIL, "NVLink link training failed", _NVLINK),
    140: (FAIL, "unrecovered ECC error", _RESET + "; RMA if it recurs"),
    143: (FAIL, "GPU initialization error", _RESET),
    **{code: (FAIL, "NVLink5 error", _NVLINK) for code in range(144, 151)},
    154: (
        FAIL,
        "GPU recovery action changed",
        "do what NVML's recovery action says (see the recovery_action check)",
    ),
    155: (FAIL, "NVLink software-defined error", _RESET),
    156: (FAIL, "resource retirement event", _RESET),
    158: (FAIL, "GPU fatal timeout", _RESET),
}
_UNKNOWN_XID = (WARN, "not in gpuhealth's XID table", "look it up in NVIDIA's XID catalog")
_READ_ACTION = (
    "run the probe as root, or allow dmesg for its user (sysctl kernel.dmesg_restrict=0, or "
    "membership of the systemd-journal group)"
)


def _need_nvidia(node: NodeView) -> None:
    """Live nodes without NVIDIA hardware skip; saved logs are judged on what they hold."""
    if node.no_nvidia and not node.expected_gpus and not node.from_evidence:
        raise StopCheck(Result(SKIP, f"no NVIDIA GPU/driver on {node.host}"))


def _need_log(section: dict[str, Any], what: str) -> list[dict[str, Any]]:
    counts = section.get("counts")
    if counts is not None:
        return counts
    why = (section.get("unavailable") or {}).get("counts") or {"detail": "no value"}
    raise StopCheck(Result(FAIL, f"could not read {what} ({why.get('detail')})", _READ_ACTION))


class _Window:
    """The profile's window over one log section, anchored where the section says."""

    def __init__(self, node: NodeView, section: dict[str, Any]) -> None:
        self.hours = node.limits["xid_window_h"]
        self.section = section
        until, until_uptime = section.get("until"), section.get("until_uptime_s")
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
        for group in self.section["counts"]:
            if group["kind"] not in kinds or not self.holds(group["last"], group["last_uptime_s"]):
                continue
            if self.holds(group["first"], group["first_uptime_s"]):
                kept.append(group)
                continue
            key = (group["kind"], group["bus_id"], group["code"])
            members = [
                e
                for e in self.section["events"] or []
                if (e["kind"], e.get("bus_id"), e.get("code")) == key
            ]
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
        section = self.section
        if section.get("anchored_at") == "newest_entry":
            end = section.get("until") or f"{section.get('until_uptime_s')} s after boot"
            if not self.hours:
                return f"in the whole log (newest entry {end})"
            return (
                f"within {self.hours:g} h before the log's newest entry {end} "
                "(a saved log has no 'now', so the window ends there)"
            )
        if not self.hours:
            return f"since boot (read {section.get('until')} from {section.get('source')})"
        since = section.get("since")
        if self.since is not None and (since is None or epoch(since) < self.since):
            since = stamp(self.since)
        return f"since {since} ({self.hours:g} h window, this boot; from {section.get('source')})"


def _xid_rule(code: int) -> tuple[str, str, str]:
    return XID_TABLE.get(code, _UNKNOWN_XID)


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


def _judge(found: list[tuple[str, str, str | None]], window: _Window, clean: str) -> Result:
    """One Result from (status, text, action) findings: worst status, its actions, all texts.

    The message starts with the window, so a saved log's finding says where its window ends.
    """
    if not found:
        return Result(PASS, f"{clean} {window.words()}")
    worst = FAIL if any(status == FAIL for status, _, _ in found) else WARN
    found.sort(key=lambda item: item[0] != FAIL)
    actions = []
    for status, _, action in found:
        if status == worst and action and action not in actions:
            actions.append(action)
    texts = "; ".join(text for _, text, _ in found)
    return Result(worst, f"{window.words()}: {texts}", "; ".join(actions))


def _xid_findings(
    groups: list[dict[str, Any]], where: str = ""
) -> list[tuple[str, str, str | None]]:
    found: list[tuple[str, str, str | None]] = []
    for group in sorted(groups, key=lambda g: (_xid_rule(g["code"])[0] != FAIL, g["code"])):
        status, meaning, action = _xid_rule(group["code"])
        label = f"Xid {group['code']} ({meaning}){where.format(bus=group['bus_id'])}"
        found.append((status, _describe(group, label), action))
    return found


@check("xid_errors", "gpu", "errors", section="kernel_log")
def xid_errors(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No hardware XIDs for this GPU in the kernel log within the window (app XIDs warn)."""
    section = node.facts["kernel_log"]
    _need_log(section, "the kernel log")
    bus = need(gpu, "pci_bus_id", "PCI bus id (to find the GPU's XIDs)")
    window = _Window(node, section)
    groups = [g for g in window.groups(("xid",)) if g["bus_id"] == bus.upper()]
    return _judge(_xid_findings(groups), window, "no XIDs")


@check("kernel_log", "node", "errors", section="kernel_log")
def kernel_log(node: NodeView) -> Result:
    """No XIDs of unknown GPUs, NVSwitch SXIDs or nvidia-peermem errors in the kernel log."""
    _need_nvidia(node)
    section = node.facts["kernel_log"]
    _need_log(section, "the kernel log")
    window = _Window(node, section)
    gpus = node.facts.get("gpus")
    known = {g["pci_bus_id"].upper() for g in gpus or [] if g.get("pci_bus_id")}
    xids = window.groups(("xid",))
    mine = [g for g in xids if g["bus_id"] in known]
    others = [g for g in xids if g["bus_id"] not in known]
    where = " on {bus}" + (
        ", which is none of the node's GPUs" if gpus else " (the evidence names no GPUs)"
    )
    found = _xid_findings(others, where)
    for group in window.groups(("sxid",)):
        label = f"NVSwitch SXid {group['code']} ({'fatal' if group.get('fatal') else 'non-fatal'})"
        text = _describe(group, f"{label} on {group['bus_id']}")
        if group.get("fatal"):
            action = (
                "drain the node; reboot to reset the NVSwitch fabric and check "
                "nvidia-fabricmanager; have the baseboard inspected if it recurs"
            )
            found.append((FAIL, text, action))
        else:
            found.append((WARN, text, "watch for repeats; check the NVSwitch port it names"))
    for group in window.groups(("peermem",)):
        found.append(
            (
                WARN,
                _describe(group, "nvidia-peermem errors"),
                "check the GPUDirect RDMA job and that nvidia-peermem matches the driver",
            )
        )
    mapped = f" ({len(mine)} XID kinds on the node's GPUs are for xid_errors)" if mine else ""
    return _judge(found, window, f"no SXIDs, peermem errors or XIDs of unknown GPUs{mapped}")


@check("fabric_manager", "node", "nvlink", section="fabric_manager")
def fabric_manager(node: NodeView) -> Result:
    """No NVSwitch fatal errors (fail) or other errors (warn) in the fabric manager's log."""
    _need_nvidia(node)
    section = node.facts["fabric_manager"]
    if not section.get("present"):
        return Result(SKIP, f"no fabric manager log at {section.get('log')} (no NVSwitch here?)")
    _need_log(section, f"the fabric manager log {section.get('log') or ''}".rstrip())
    window = _Window(node, section)
    found: list[tuple[str, str, str | None]] = []
    for group in window.groups(("fabric_manager",)):
        code = f" {group['code']}" if group["code"] is not None else ""
        where = f" on NVSwitch {group['bus_id']}" if group["bus_id"] else ""
        if group.get("fatal"):
            label = f"fabric manager fatal error{code}{where}"
            action = (
                "drain the node; restart nvidia-fabricmanager or reboot to reset the fabric; have "
                "the baseboard inspected if it recurs"
            )
            found.append((FAIL, _describe(group, label), action))
        else:
            label = f"fabric manager error{code}{where}"
            action = "watch for repeats; check `nvidia-smi nvlink -s` and the NVSwitch port named"
            found.append((WARN, _describe(group, label), action))
    return _judge(found, window, "no fabric manager errors")
