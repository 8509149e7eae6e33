"""Storage checks: the paths jobs read and write, and the network filesystems under them.

The probe measured every path and mount in a child process with a timeout
(families/storage/probe.py); these checks compare those measurements with the inventory's
storage_paths, so a facts document saved today can be re-judged with tomorrow's free-space
limits.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.checks import CheckSet, NodeView, detail, section
from gpuhealth.facts import reason
from gpuhealth.families.storage.limits import StorageLimits, StoragePath
from gpuhealth.results import Action, Result, failed, passed, skipped

CHECKS = CheckSet("storage", ranks={"storage": 2})

_WRITE_STEPS = ("write:", "fsync:", "read back:", "delete:")

# What to do about each kind of path failure (the action code, then the words), in the order
# the advice is given.
_PATH_ACTIONS = {
    "hung": Action.DRAIN,
    "access": Action.FIX_CONFIG,
    "write": Action.FIX_CONFIG,
    "full": Action.FIX_CONFIG,
    "unmeasured": Action.RERUN,
}
_PATH_ADVICE = {
    "hung": "a hung mount under {path}: check the NFS/Lustre server and the network to it "
    "(dmesg: 'not responding', LustreError), then remount (`umount -l MOUNTPOINT && mount "
    "MOUNTPOINT`) or drain and reboot the node",
    "access": "check the mount (`mount | grep {top}`, `mount -a` for /etc/fstab entries) and "
    "the permissions of {path}",
    "write": "check that the mount of {path} is read-write (`mount | grep {top}`; ro after "
    "errors: dmesg) and its quota",
    "full": "free space on {path} (old checkpoints, caches) or grow the filesystem",
    "unmeasured": "re-run the probe with this inventory: these facts were collected without "
    "that part of storage_paths",
}


def _top(path: str) -> str:
    """The first component of a path, a grep pattern that finds the mount holding it."""
    return "/" + path.strip("/").split("/")[0]


def _measured(storage: dict[str, Any]) -> dict[str, dict[str, Any]]:
    # The same path may be listed twice (read-only and writable): keep the record that wrote.
    found: dict[str, dict[str, Any]] = {}
    for record in storage.get("paths") or []:
        if record.get("path") not in found or record.get("wrote") is not None:
            found[record.get("path")] = record
    return found


def _path_problem(
    entry: StoragePath, record: dict[str, Any] | None, minimum: float | None
) -> tuple[str, str] | None:
    """(kind of failure, what was measured) for one configured path, or None when it is fine."""
    if record is None:
        return "unmeasured", "not measured by the probe"
    error = str(record.get("error") or "failed without a reason")
    if not record.get("ok"):
        if record.get("timed_out"):
            return "hung", error
        return ("write" if error.startswith(_WRITE_STEPS) else "access"), error
    if entry.writable and record.get("wrote") is not True:
        return "unmeasured", "write test not run by the probe"
    if minimum is None:
        return None
    free = record.get("free_gb")
    if free is None:
        return "unmeasured", "free space not measured by the probe"
    if free < minimum:
        return "full", f"only {free:.1f} GB free, expected >= {minimum:.12g} GB"
    return None


@CHECKS.node("storage_paths", "storage", section="storage", in_use=True)
def storage_paths(node: NodeView) -> Result:
    """Every storage path of the inventory is readable, writable where marked, with free space."""
    lim = node.limits.get(StorageLimits)
    configured = lim.storage_paths
    if not configured:
        return skipped(f"no storage_paths configured for {node.host} (set them in the inventory)")
    measured = _measured(section(node, "storage"))
    failing: list[tuple[str, str, str]] = []  # (kind of failure, path, what was measured)
    limited = 0
    for entry in configured:
        minimum = entry.min_free_gb if entry.min_free_gb is not None else lim.storage_min_free_gb
        limited += minimum is not None
        found = _path_problem(entry, measured.get(entry.path), minimum)
        if found is not None:
            failing.append((found[0], entry.path, found[1]))
    if failing:
        listed = "; ".join(f"{path}: {what}" for _, path, what in failing)
        first: dict[str, str] = {}
        for kind, path, _ in failing:
            first.setdefault(kind, path)
        advice = [
            _PATH_ADVICE[kind].format(path=first[kind], top=_top(first[kind]))
            for kind in _PATH_ADVICE
            if kind in first
        ]
        action = min((_PATH_ACTIONS[kind] for kind in first), key=lambda a: a.rank)
        return failed(
            f"{len(failing)} of {len(configured)} storage paths failing: {listed}",
            action,
            "; ".join(advice),
        )
    writable = sum(1 for e in configured if e.writable)
    return passed(
        f"{len(configured)} storage paths readable"
        + (f", {writable} writable" if writable else "")
        + (f", free space within limits on {limited}" if limited else "")
    )


def _lustre_problem(storage: dict[str, Any], lustre_mounted: bool) -> str | None:
    health = storage.get("lustre_health_check")
    if health is not None:
        if str(health).strip() == "healthy":
            return None
        shown = " / ".join(line.strip() for line in str(health).splitlines() if line.strip())
        return f"Lustre health_check reads {shown[:300]!r}, expected 'healthy'"
    if reason(storage, "lustre_health_check")["kind"] in ("error", "timeout") or lustre_mounted:
        return f"Lustre health_check unreadable: {detail(storage, 'lustre_health_check')}"
    return None


@CHECKS.node("distributed_mounts", "storage", section="storage", in_use=True)
def distributed_mounts(node: NodeView) -> Result:
    """Every Lustre/NFS mount (plus storage_mount_types) answers; Lustre's health is healthy."""
    storage = section(node, "storage")
    mounts = storage.get("mounts")
    if mounts is None:
        if reason(storage, "mounts")["kind"] == "absent":
            return skipped("not evaluated: the evidence holds no mount table")
        return failed(
            f"could not read the mount table: {detail(storage, 'mounts')}",
            Action.RERUN,
            "run `cat /proc/mounts` on the node; update gpuhealth if it is a parser bug",
        )
    types = ", ".join(storage.get("mount_types") or [])
    lustre = _lustre_problem(storage, any(m.get("fstype") == "lustre" for m in mounts))
    if not mounts and lustre is None and storage.get("lustre_health_check") is None:
        return skipped(f"no network filesystem mounted on {node.host} (types: {types})")
    problems = [
        f"{m['mountpoint']} ({m['fstype']} from {m['device']}): {m.get('error') or 'failed'}"
        for m in mounts
        if not m.get("ok")
    ]
    advice = []
    if problems:
        mountpoint = next(m["mountpoint"] for m in mounts if not m.get("ok"))
        advice.append(
            "check the NFS/Lustre servers and the node's network to them (dmesg: 'not "
            f"responding', LustreError; `mount | grep {mountpoint}`), then remount "
            f"(`umount -l {mountpoint} && mount {mountpoint}`) or drain and reboot the node"
        )
    if lustre is not None:
        problems.append(lustre)
        advice.append(
            "read dmesg for LustreError/LBUG and `lctl get_param health_check`: an LBUG needs a "
            "reboot, otherwise check the Lustre servers (MDT/OST) with the storage team"
        )
    if problems:
        return failed("; ".join(problems), Action.DRAIN, "; ".join(advice))
    healthy = "Lustre health_check healthy" if storage.get("lustre_health_check") else ""
    if not mounts:
        return passed(f"{healthy} (no network filesystem mounted)")
    shown = ", ".join(f"{m['fstype']} {m['mountpoint']}" for m in mounts[:5])
    more = f" and {len(mounts) - 5} more" if len(mounts) > 5 else ""
    healthy = f", {healthy}" if healthy else ""
    return passed(f"{len(mounts)} network mounts answer ({shown}{more}){healthy}")
