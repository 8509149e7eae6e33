"""Storage checks: the paths jobs read and write, and the network filesystems under them.

The probe measured every path and mount in a child process with a timeout
(gpuhealth.probe.storage); these checks compare those measurements with the inventory's
storage_paths, so a facts document saved today can be re-judged with tomorrow's free-space
limits.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.checks import FAIL, PASS, SKIP, NodeView, Result, check
from gpuhealth.probe.storage import DEFAULT_MOUNT_TYPES, TIMED_OUT, normalise_paths

_WRITE_STEPS = ("write:", "fsync:", "read back:", "delete:")

# What to do about each kind of path failure, in the order the advice is given.
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
    entry: dict[str, Any], record: dict[str, Any] | None, minimum: float | None
) -> tuple[str, str] | None:
    """(kind of failure, what was measured) for one configured path, or None when it is fine."""
    if record is None:
        return "unmeasured", "not measured by the probe"
    error = record.get("error") or "failed without a reason"
    if not record.get("ok"):
        if error.startswith(TIMED_OUT):
            return "hung", error
        return ("write" if error.startswith(_WRITE_STEPS) else "access"), error
    if entry["writable"] and record.get("wrote") is not True:
        return "unmeasured", "write test not run by the probe"
    if minimum is None:
        return None
    free = record.get("free_gb")
    if free is None:
        return "unmeasured", "free space not measured by the probe"
    if free < minimum:
        return "full", f"only {free:.1f} GB free, expected >= {minimum:.12g} GB"
    return None


@check("storage_paths", "node", "storage", section="storage")
def storage_paths(node: NodeView) -> Result:
    """Every storage path of the inventory is readable, writable where marked, with free space."""
    configured = normalise_paths(node.limits["storage_paths"])
    if not configured:
        return Result(
            SKIP, f"no storage_paths configured for {node.host} (set them in the inventory)"
        )
    measured = _measured(node.facts["storage"])
    default_minimum = node.limits["storage_min_free_gb"]
    failing: list[tuple[str, str, str]] = []  # (kind of failure, path, what was measured)
    limited = 0
    for entry in configured:
        minimum = entry["min_free_gb"]
        if minimum is None:
            minimum = default_minimum
        limited += minimum is not None
        found = _path_problem(entry, measured.get(entry["path"]), minimum)
        if found is not None:
            failing.append((found[0], entry["path"], found[1]))
    if failing:
        detail = "; ".join(f"{path}: {what}" for _, path, what in failing)
        first = {}
        for kind, path, _ in failing:
            first.setdefault(kind, path)
        advice = [
            _PATH_ADVICE[kind].format(path=first[kind], top=_top(first[kind]))
            for kind in _PATH_ADVICE
            if kind in first
        ]
        return Result(
            FAIL,
            f"{len(failing)} of {len(configured)} storage paths failing: {detail}",
            "; ".join(advice),
        )
    writable = sum(1 for e in configured if e["writable"])
    return Result(
        PASS,
        f"{len(configured)} storage paths readable"
        + (f", {writable} writable" if writable else "")
        + (f", free space within limits on {limited}" if limited else ""),
    )


def _lustre_problem(storage: dict[str, Any], lustre_mounted: bool) -> str | None:
    health = storage.get("lustre_health_check")
    if health is not None:
        if health.strip() == "healthy":
            return None
        shown = " / ".join(line.strip() for line in health.splitlines() if line.strip())
        return f"Lustre health_check reads {shown[:300]!r}, expected 'healthy'"
    why = (storage.get("unavailable") or {}).get("lustre_health_check") or {}
    if why.get("kind") in ("error", "timeout") or lustre_mounted:
        return f"Lustre health_check unreadable: {why.get('detail') or 'no value'}"
    return None


@check("distributed_mounts", "node", "storage", section="storage")
def distributed_mounts(node: NodeView) -> Result:
    """Every Lustre/NFS mount (plus storage_mount_types) answers; Lustre's health is healthy."""
    storage = node.facts["storage"]
    mounts = storage.get("mounts")
    if mounts is None:
        why = (storage.get("unavailable") or {}).get("mounts") or {}
        if why.get("kind") == "absent":
            return Result(SKIP, "not evaluated: the evidence holds no mount table")
        return Result(
            FAIL,
            f"could not read the mount table: {why.get('detail') or 'no value'}",
            "run `cat /proc/mounts` on the node; update gpuhealth if it is a parser bug",
        )
    types = ", ".join(storage.get("mount_types") or DEFAULT_MOUNT_TYPES)
    lustre = _lustre_problem(storage, any(m.get("fstype") == "lustre" for m in mounts))
    if not mounts and lustre is None and storage.get("lustre_health_check") is None:
        return Result(SKIP, f"no network filesystem mounted on {node.host} (types: {types})")
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
        return Result(FAIL, "; ".join(problems), "; ".join(advice))
    healthy = "Lustre health_check healthy" if storage.get("lustre_health_check") else ""
    if not mounts:
        return Result(PASS, f"{healthy} (no network filesystem mounted)")
    shown = ", ".join(f"{m['fstype']} {m['mountpoint']}" for m in mounts[:5])
    more = f" and {len(mounts) - 5} more" if len(mounts) > 5 else ""
    healthy = f", {healthy}" if healthy else ""
    return Result(PASS, f"{len(mounts)} network mounts answer ({shown}{more}){healthy}")
