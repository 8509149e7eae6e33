"""NVLink fabric checks: each GPU registered with its NVLink fabric and healthy there, and on
multi-node NVLink platforms (GB200/GB300 NVL) every GPU of the node in one NVLink domain.

They judge each GPU record's `fabric` (families/gpu/parse_fabric.py: NVML's GPU fabric info or
nvidia-smi's `Fabric` block). Real faults often show in one part only (`State: Completed` with
`Status: Insufficient Resources`, or `Health > Summary: Unhealthy`), so registration and health
are judged apart, and no part that was not reported counts as healthy.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuhealth.checks import (
    CheckSet,
    NodeView,
    StopCheck,
    detail,
    missing,
    need,
    null_rank,
)
from gpuhealth.facts import reason
from gpuhealth.families.gpu.checks import require_nvidia
from gpuhealth.families.gpu.limits import GpuLimits
from gpuhealth.families.gpu.parse_fabric import HEALTH_KEYS, ZERO_UUID, faults
from gpuhealth.families.gpu.schema import NVLINK_COUNTER_SOURCES
from gpuhealth.families.gpu.scope import GPU
from gpuhealth.families.nvfabric.limits import NvFabricLimits
from gpuhealth.limits import SharedLimits
from gpuhealth.results import Action, Result, Shared, failed, passed, skipped, warned

CHECKS = CheckSet("nvfabric", section="gpus")

# Architectures whose drivers report no fabric health (every Health field N/A on an H100): an
# unknown summary is normal there. On Blackwell and later it is not.
_NO_HEALTH = {"Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada Lovelace", "Hopper"}
_FM = (
    "the fabric manager (nvidia-fabricmanager on HGX boards; on GB200/GB300 the NVLink switch "
    "trays' NMX fabric manager)"
)
_OLD_FACTS = (
    "not evaluated: these facts predate the GPU fabric record (probe again with this gpuhealth)"
)
# A health condition -> what to do about it.
_CONDITIONS = {
    "bandwidth": (
        Action.INSPECT,
        "NVLink bandwidth is degraded, links are down: check `nvidia-smi nvlink -s`, then reseat "
        "or replace the NVLink cables, cartridges or the tray",
    ),
    "route_recovery_in_progress": (
        Action.DRAIN,
        "the fabric is rerouting around a fault: keep jobs off the node, read the fabric manager "
        "log, re-run once the recovery has ended",
    ),
    "route_unhealthy": (
        Action.INSPECT,
        "an NVLink route of this GPU is unhealthy: read the fabric manager log for it and check "
        "the NVLink switch trays and cabling",
    ),
    "access_timeout_recovery": (
        Action.RESET_GPU,
        "the GPU is recovering from NVLink access timeouts: drain its jobs and reset the GPU; "
        "inspect its links if it recurs",
    ),
    "incorrect_configuration": (
        Action.FIX_CONFIG,
        "the fabric finds the tray misconfigured (the value says what: SysGUID, chassis serial, "
        "partition, NVLinks, GPU firmware, location): correct it in the rack's fabric manager, "
        "then reset the GPU",
    ),
}
_SUMMARY_ONLY = (
    Action.INSPECT,
    "read `nvidia-smi -q` (Fabric > Health) and the fabric manager log for this GPU",
)


def _multinode(node: NodeView) -> bool:
    return node.limits.get(NvFabricLimits).nvlink_multinode


def _fabric(node: NodeView, gpu: dict[str, Any]) -> dict[str, Any]:
    """The GPU's fabric record, or stop: no fabric is a skip, except where the profile says
    the GPUs are in a multi-node NVLink domain."""
    if "fabric" not in gpu:
        raise StopCheck(skipped(_OLD_FACTS))
    fabric = gpu["fabric"]
    if fabric is None:
        why = reason(gpu, "fabric")
        if why["kind"] == "not_supported" and _multinode(node):
            raise StopCheck(
                failed(
                    f"no NVLink fabric info ({why['detail']}), but the profile says multi-node "
                    "NVLink (nvlink_multinode: true)",
                    Action.FIX_CONFIG,
                    "update the driver until `nvidia-smi -q` shows a Fabric block with State "
                    "Completed; if the node is in no multi-node NVLink rack, set "
                    "nvlink_multinode: false",
                )
            )
        raise StopCheck(missing(gpu, "fabric", "NVLink fabric info"))
    if not isinstance(fabric, dict):
        raise StopCheck(
            failed(
                f"the GPU's fabric record is not an object ({type(fabric).__name__})",
                Action.RERUN,
                "re-collect the facts with this gpuhealth",
            )
        )
    return fabric


@CHECKS.per(GPU, "nvlink_fabric_state", "nvlink", in_use=True)
def nvlink_fabric_state(node: NodeView, gpu: dict[str, Any]) -> Result:
    """The GPU registered with its NVLink fabric: state Completed and status Success."""
    fabric = _fabric(node, gpu)
    # Multi-node NVLink needs the registration: unknown there is a failure, as no fabric is.
    state = need(fabric, "state", "NVLink fabric state", required=_multinode(node))
    if state == "Not Started":
        return failed(
            "NVLink fabric state Not Started, expected Completed",
            Action.FIX_CONFIG,
            f"start {_FM} and read its log (/var/log/fabricmanager.log on HGX), then reset the "
            "GPU or reboot the node",
        )
    if state == "In Progress":
        return failed(
            "NVLink fabric state In Progress, expected Completed",
            Action.RERUN,
            "the GPU is still registering with the fabric (after a driver load or GPU reset): "
            f"re-run in a few minutes; if it stays In Progress, check {_FM}",
        )
    if state != "Completed":
        return failed(
            f"NVLink fabric state {state!r}, expected Completed",
            Action.INSPECT,
            f"read the Fabric block of `nvidia-smi -q` and the log of {_FM}",
        )
    status = need(fabric, "status", "NVLink fabric status", required=_multinode(node))
    if status != "Success":
        return failed(
            f"NVLink fabric state Completed but status {status}, expected Success",
            Action.RESET_GPU,
            "the GPU's registration with the fabric failed: read the fabric manager log for this "
            "GPU, reset it (nvidia-smi -r) or reboot so it registers again; if it fails again, "
            "inspect the NVLink trays and cabling",
        )
    return passed("NVLink fabric state Completed, status Success")


def _unread(record: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """The keys of `record` whose value could not be read (not merely unsupported)."""
    return [
        key
        for key in keys
        if record.get(key) is None and reason(record, key)["kind"] in ("error", "timeout")
    ]


@CHECKS.per(GPU, "nvlink_fabric_health", "nvlink", in_use=True)
def nvlink_fabric_health(node: NodeView, gpu: dict[str, Any]) -> Result:
    """Fabric health Healthy, and none of its conditions: degraded bandwidth, route recovery,
    unhealthy route, access-timeout recovery, incorrect configuration."""
    fabric = _fabric(node, gpu)
    health = fabric.get("health")
    if health is not None and not isinstance(health, dict):
        return failed(
            f"the fabric health record is not an object ({type(health).__name__})",
            Action.RERUN,
            "re-collect the facts with this gpuhealth",
        )
    found = faults(health)
    summary = (health or {}).get("summary")
    if found or summary not in (None, "Healthy"):
        what = ", ".join(text for _, text in found)
        causes = [_CONDITIONS[key] for key, _ in found] or [_SUMMARY_ONLY]
        action = min((code for code, _ in causes), key=lambda code: code.rank)
        advice = "; ".join(dict.fromkeys(text for _, text in causes))
        shown = summary or "summary not reported"
        return failed(
            f"NVLink fabric health {shown}{': ' + what if what else ''}, expected Healthy with "
            "no condition",
            action,
            advice,
        )
    unread = _unread(health, HEALTH_KEYS) if health else _unread(fabric, ("health",))
    if unread:
        where, key = (health, unread[0]) if health else (fabric, "health")
        return failed(
            f"could not read the NVLink fabric health ({', '.join(unread)}): "
            f"{reason(where, key)['detail']}",
            Action.RERUN,
            "re-run; if it persists, check the driver (`nvidia-smi -q`, Fabric > Health)",
        )
    if summary == "Healthy":
        unknown = [key for key in HEALTH_KEYS[1:] if health is not None and health.get(key) is None]
        note = f" ({', '.join(unknown)} not reported)" if unknown else ""
        return passed(f"NVLink fabric health Healthy, no condition{note}")
    why = reason(health, "summary") if health else reason(fabric, "health")
    arch = gpu.get("architecture")
    if arch in _NO_HEALTH:
        return passed(
            f"{arch} GPUs report no fabric health ({why['detail']}); their registration is "
            "judged by nvlink_fabric_state"
        )
    if why["kind"] == "absent" and node.from_evidence:
        return skipped(f"not evaluated: the evidence holds no fabric health ({why['detail']})")
    known = [key for key in HEALTH_KEYS[1:] if (health or {}).get(key) is not None]
    seen = "the conditions reported are clear" if known else "no condition reported either"
    return warned(
        f"NVLink fabric health summary not reported on a {arch or 'unknown architecture'} GPU "
        f"({why['detail']}); {seen}",
        Action.FIX_CONFIG,
        "Blackwell drivers report the fabric health (`nvidia-smi -q`: Fabric > Health > "
        "Summary): update the driver, then re-run",
    )


def _names(indices: list[int]) -> str:
    return ", ".join(f"gpu{index}" for index in indices)


@CHECKS.node("nvlink_clique", "nvlink", in_use=True)
def nvlink_clique(node: NodeView) -> Result:
    """On multi-node NVLink (GB200/GB300 NVL, nvlink_multinode) all GPUs of the node are in one
    NVLink domain: the same non-zero clique id and cluster UUID."""
    require_nvidia(node)
    gpus = [g for g in node.facts.get("gpus") or [] if isinstance(g, dict)]
    if any("fabric" not in g for g in gpus):
        return skipped(_OLD_FACTS)
    domains: dict[tuple[int, str], list[Any]] = {}
    unknown: list[tuple[dict[str, Any], str, str]] = []  # (record, key, which GPU)
    for gpu in gpus:
        fabric = gpu["fabric"]
        if not isinstance(fabric, dict):
            unknown.append((gpu, "fabric", f"gpu{gpu.get('index')}"))
            continue
        clique, cluster = fabric.get("clique_id"), fabric.get("cluster_uuid")
        for key, value, kind in (("clique_id", clique, int), ("cluster_uuid", cluster, str)):
            if not isinstance(value, kind):  # null (with its reason), or not what facts hold
                unknown.append((fabric, key, f"gpu{gpu.get('index')}"))
        if isinstance(clique, int) and isinstance(cluster, str):
            domains.setdefault((clique, cluster), []).append(gpu.get("index"))
    shown = "; ".join(
        f"{_names(indices)}: clique {clique}, cluster {cluster}"
        for (clique, cluster), indices in domains.items()
    )
    if not _multinode(node):
        if not domains:  # nothing reported: nothing vouches for the node's NVLink domain
            return skipped(
                "single-node NVLink (nvlink_multinode: false) and no GPU reported a clique "
                "and cluster UUID: nothing to compare"
            )
        return passed(
            "single-node NVLink (nvlink_multinode: false), where clique 0 and a zero cluster "
            f"UUID are normal: {shown}"
        )
    if not gpus:
        return skipped("no GPU records to judge (see gpu_count)")
    outside = [
        index
        for (clique, cluster), indices in domains.items()
        if clique == 0 or cluster == ZERO_UUID
        for index in indices
    ]
    unread = "; ".join(
        f"{which} {key.replace('_', ' ')} unknown ({reason(record, key)['detail']})"
        for record, key, which in unknown
    )
    if outside:
        return failed(
            f"not in an NVLink domain: {shown}"
            + (f"; {unread}" if unread else "")
            + "; expected one non-zero clique and cluster UUID (nvlink_multinode: true)",
            Action.FIX_CONFIG,
            "assign the tray to its rack's NVLink partition in the NVLink switch trays' fabric "
            "manager (NMX), check IMEX, then reset the GPUs (or reboot); see also "
            "nvlink_fabric_state",
        )
    if len(domains) > 1:
        return failed(
            f"GPUs of one node in different NVLink domains: {shown}"
            + (f"; {unread}" if unread else "")
            + "; expected one clique and cluster UUID for all",
            Action.RESET_GPU,
            "a GPU keeps its old clique until it is reset after a partition change: reset the "
            "GPUs (or reboot); if they still differ, check the tray's partition in the fabric "
            "manager",
        )
    if unknown:
        record, key, which = min(unknown, key=lambda item: null_rank(item[0], item[1]))
        return missing(record, key, f"the NVLink {key.replace('_', ' ')} of {which}", required=True)
    ((clique, cluster),) = domains
    text = f"all {len(gpus)} GPUs in NVLink clique {clique} of cluster {cluster}"
    domain = node.limits.get(SharedLimits).nvlink_domain
    if domain is None:
        return passed(text)
    shared = Shared(
        "nvlink_domain",
        "nvlink_domain",
        domain,
        "NVLink domain",
        f"clique {clique} of cluster {cluster}",
        "the inventory's nvlink_domain and the fabric disagree: if the node is in another rack, "
        "correct the inventory; else put the tray in its rack's NVLink partition (NMX fabric "
        "manager), check IMEX, and reset the GPUs",
    )
    return replace(passed(f"{text}; nvlink_domain {domain}"), details=(shared,))


# NVLink error counters, judged as DCGM's NVLink health watch does (NVIDIA/DCGM@72fa3fea,
# modules/health/DcgmHealthWatch.cpp). The legacy counters (MonitorNVLink4Fields): any replay or
# recovery is a failure; CRC and data-ECC errors warn, and fail from 100 per second on. The
# NVLink5 field values of Blackwell (MonitorNVLink5Fields): any growth of any of them fails
# (DCGM_LIMIT_MAX_NVLINK_ERROR is 1), including link recovery events "irrespective of the
# result" (DCGM_FI_DEV_NVLINK_RECOVERY_EVENT_TOTAL); and, as read (MonitorNVLinkErrorFields),
# any failed link recovery fails and any successful one warns.
_SOURCES = {
    source: tuple(name for name, _, _ in counters)
    for source, counters in NVLINK_COUNTER_SOURCES.items()
}
_RATE_JUDGED = ("crc_flit", "crc_data", "ecc_data")
_COUNTER_WORDS = {
    "replay": "replay errors",
    "recovery": "recovery errors",
    "crc_flit": "flow-control CRC errors",
    "crc_data": "data CRC errors",
    "ecc_data": "data ECC errors",
    "malformed_packet": "malformed packets",
    "buffer_overrun": "receive buffer overruns",
    "rcv": "receive errors",
    "rcv_remote": "remote receive errors",
    "rcv_general": "general receive errors",
    "local_link_integrity": "local link integrity errors",
    "recovery_successful": "successful link recoveries",
    "recovery_failed": "failed link recoveries",
    "link_recovery": "link recovery events",
    "effective": "effective errors",
    "symbol": "symbol errors",
}
_EXPECTED = {
    "error_counter": "expected no replay or recovery and under {rate:g} CRC/ECC errors per second",
    "field_values": "expected no NVLink5 error counter to grow and no failed link recovery",
}
_LINK_ADVICE = (
    "the link is erroring now: read `nvidia-smi nvlink -e -i {index}` and the kernel log (XIDs "
    "74, 144-150), reseat or replace the NVLink cable, cartridge or tray of the link(s) named, "
    "then reset the GPU and re-run; if it recurs, run `dcgmi diag -r 3` and RMA"
)
_RECOVERED_ADVICE = (
    "the link(s) named went through recovery since the counters were last reset (driver load "
    "or GPU reset) and came back up: watch them (`nvidia-smi nvlink -e -i {index}`, the kernel "
    "log); reseat the cable, cartridge or tray if it recurs"
)


def _counter_rows(
    record: dict[str, Any], names: tuple[str, ...]
) -> tuple[list[tuple[int, str, int, int]], list[tuple[str, str, str]]]:
    """(link, counter, first, second) of every counter read twice, and (counter, kind, what)
    of every one that could not be compared."""
    rows: list[tuple[int, str, int, int]] = []
    unread: list[tuple[str, str, str]] = []
    for entry in record.get("links") or []:
        if not isinstance(entry, dict):
            unread.append(("link", "error", f"a link record that is not an object: {entry!r:.60}"))
            continue
        link: Any = entry.get("link")
        for name in names:
            counter = entry.get(name)
            if counter is None:
                why = reason(entry, name)
                unread.append((name, why["kind"], f"link {link} {name}: {why['detail']}"))
                continue
            if not isinstance(counter, dict):
                unread.append((name, "error", f"link {link} {name}: {counter!r:.60}, no reads"))
                continue
            first, second = counter.get("first"), counter.get("second")
            if second is None:
                why = reason(counter, "second")
                text = f"link {link} {name} second read: {why['detail']}"
                unread.append((name, why["kind"], text))
            elif not isinstance(first, int) or not isinstance(second, int) or second < first:
                text = f"link {link} {name} went from {first!r} to {second!r} (reset?)"
                unread.append((name, "error", text))
            else:
                rows.append((link, name, first, second))
    return rows, unread


def _shown(items: list[tuple[int, str, int]], sign: str = "+") -> str:
    """ "link 7 symbol errors +3; ..." (sign "" for a count rather than a growth)."""
    return "; ".join(f"link {link} {_COUNTER_WORDS[name]} {sign}{n}" for link, name, n in items)


@CHECKS.per(GPU, "nvlink_errors", "nvlink", in_use=True)
def nvlink_errors(node: NodeView, gpu: dict[str, Any]) -> Result:
    """No NVLink error counter of an active link grew while the probe watched it
    (nvlink_error_window_s). Legacy counters: replay or recovery growth fails; CRC or data-ECC
    growth warns, and fails at nvlink_crc_errors_fail_per_s. NVLink5 field values (Blackwell):
    any growth fails, and so does any failed link recovery; an earlier successful one warns."""
    if "nvlink_errors" not in gpu:
        return skipped(
            "not evaluated: these facts predate the NVLink error counters (probe again with "
            "this gpuhealth)"
        )
    if node.limits.get(GpuLimits).nvlink_links_expected == 0:
        return skipped("no NVLink on this GPU (nvlink_links_expected: 0)")
    record = gpu["nvlink_errors"]
    if record is None:
        return missing(gpu, "nvlink_errors", "NVLink error counters")
    source = record.get("source", "error_counter") if isinstance(record, dict) else None
    if source not in _SOURCES or not isinstance(record.get("links"), list):
        return failed(
            "the GPU's NVLink error counter record is not an object with links from a known "
            f"source (source {source!r})",
            Action.RERUN,
            "re-collect the facts with this gpuhealth",
        )
    window = record.get("window_s")
    if window is None:
        return skipped(
            f"NVLink error counters read once, growth not judged ({detail(record, 'window_s')})"
        )
    if isinstance(window, bool) or not isinstance(window, int | float) or not window > 0:
        return failed(
            f"the NVLink error counters' window is {window!r}, not a time over which they could "
            "grow",
            Action.RERUN,
            "re-collect the facts with this gpuhealth",
        )
    rate_limit = node.limits.get(NvFabricLimits).nvlink_crc_errors_fail_per_s
    names = _SOURCES[source]
    rows, unread = _counter_rows(record, names)
    grew = [(link, name, second - first) for link, name, first, second in rows if second > first]
    failing = [
        (link, name, delta)
        for link, name, delta in grew
        if name not in _RATE_JUDGED or delta / max(window, 1e-3) >= rate_limit
    ]
    down = [  # links declared down earlier, since the counters were reset (growth is above)
        (link, name, second)
        for link, name, first, second in rows
        if name == "recovery_failed" and second == first > 0
    ]
    expected = _EXPECTED[source].format(rate=rate_limit)
    advice = _LINK_ADVICE.format(index=gpu.get("index"))
    if failing or down:
        parts = [f"grew during the {window:g} s window: {_shown(grew)}"] if failing else []
        if down:
            parts.append(f"since the counters were reset: {_shown(down, '')}")
        return failed(f"NVLink errors {'; '.join(parts)}; {expected}", Action.INSPECT, advice)
    broken = [text for _, kind, text in unread if kind != "not_supported"]
    if broken:
        return failed(
            f"could not read {len(broken)} NVLink error counter(s): {'; '.join(broken[:3])}"
            + (f" (+{len(broken) - 3} more)" if len(broken) > 3 else ""),
            Action.RERUN,
            "re-run; if it persists, check the driver (`nvidia-smi nvlink -e`, dmesg)",
        )
    if grew:
        return warned(
            f"NVLink CRC/ECC errors grew during the {window:g} s window: {_shown(grew)}; below "
            f"{rate_limit:g} per second, {expected.replace('expected ', 'where ')} fails",
            Action.INSPECT,
            advice,
        )
    recovered = [
        (link, name, second)
        for link, name, _, second in rows
        if name == "recovery_successful" and second > 0
    ]
    if recovered:
        return warned(
            f"NVLink links recovered before the {window:g} s window: {_shown(recovered, '')}; "
            "none during it",
            Action.INSPECT,
            _RECOVERED_ADVICE.format(index=gpu.get("index")),
        )
    if not rows:
        shown_unread = "; ".join(text for _, _, text in unread[:3])
        return skipped(f"no NVLink error counter was read twice: {shown_unread}")
    links = len({link for link, _, _, _ in rows})
    read = [name for name in names if any(row[1] == name for row in rows)]
    gaps = [name for name in names if any(row[0] == name for row in unread)]
    note = f" ({', '.join(gaps)} not supported)" if gaps else ""
    how = "NVLink5 field values: " if source == "field_values" else ""
    return passed(
        f"no NVLink error counter grew on {links} active link(s) over {window:g} s "
        f"({how}{', '.join(read)}){note}"
    )
