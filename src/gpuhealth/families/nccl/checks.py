"""NCCL checks: all_reduce bus bandwidth and data integrity of one nccl-tests run.

The `nccl` section is one run: the active runner writes it (all local GPUs of the node, over
NVLink/NVSwitch), `gpuhealth triage` builds it from a saved log, which may span nodes. The
threshold depends on that topology: the profile's single-node value for one node, its
inter-node value (what the node's network should carry) for more. Bandwidth is judged at the
largest message sizes, never on the sweep's `Avg bus bandwidth`, which small sizes drag down
(a healthy 2-node sweep from 8 B averages 139 GB/s while peaking at 469).

Section layout: `{"nodes": int | None, "hosts": [...], "command", "rc", "error", "action",
"exit_note", "duration_s", "run": <parse_nccl_tests.parse result> | None}`, or
`{"skipped": reason}` when there is nothing to run on (docs/facts-schema.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuhealth.checks import CheckSet, NodeView, load_test_output, section
from gpuhealth.families.fabric.limits import FabricLimits
from gpuhealth.families.nccl.limits import NcclLimits
from gpuhealth.limits import SharedLimits
from gpuhealth.results import Action, Result, failed, passed, skipped

if TYPE_CHECKING:
    from gpuhealth.config import Profile

CHECKS = CheckSet("nccl", ranks={"nccl": 2})
SINGLE_KEY = "nccl_allreduce_min_busbw_gbps"
INTER_KEY = "nccl_internode_min_busbw_gbps"
DOMAINS_KEY = "nccl_nvlink_domains_min_busbw_gbps"

_SINGLE_ACTION = (
    "check NVLink and NVSwitch (`nvidia-smi nvlink -s`, nvidia-fabricmanager running, "
    "`nvidia-smi topo -m`), clocks and throttling of every GPU; re-run, and drain the node if "
    "the bandwidth stays low"
)
_INTER_ACTION = (
    "run `--level full` so bisection names the slow node; then check that node's NICs (link "
    "rate and errors), GPUDirect RDMA (nvidia-peermem), NCCL_IB_HCA / NCCL_SOCKET_IFNAME and "
    "its switch ports"
)
_CORRUPTION_ACTION = (
    "drain the node: results are wrong, not just slow; run `dcgmi diag -r 3`, look for Xid "
    "48/63/64/74/79 in dmesg and RMA the GPU (or the NVLink/NVSwitch path) that corrupts data"
)


def size_text(size: int) -> str:
    """Bytes as nccl-tests users say them: 1 GiB, 128 MiB, 8 B."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def network_text(limits: Profile) -> str:
    """What the node's network should be, from the fabric keys ("" when none is configured)."""
    lim, fabric = limits.get(FabricLimits), limits.get(SharedLimits).fabric
    if fabric == "efa":
        count = lim.efa_devices_expected
        return f"EFA ({count} devices)" if count else "EFA"
    if fabric == "infiniband":
        ports, rate = lim.ib_ports_expected, lim.ib_min_rate_gbps
        parts = [f"{ports} ports" if ports else "", f">= {rate:g} Gb/s" if rate else ""]
        detail = ", ".join(p for p in parts if p)
        return f"InfiniBand ({detail})" if detail else "InfiniBand"
    return ""


def _run(node: NodeView) -> dict[str, Any]:
    """The parsed run, or stop: SKIP when it does not apply, FAIL when it produced nothing."""
    return load_test_output(node, "nccl", "run", "nccl-tests did not produce results", "log")


def best_busbw(rows: list[dict[str, Any]], reference: int) -> tuple[float, int, str] | None:
    """The highest busbw at sizes >= `reference`: (GB/s, size, "out-of-place"/"in-place")."""
    best = None
    for row in (r for r in rows if r["size"] >= reference):
        for place in ("out_of_place", "in_place"):
            value = (row.get(place) or {}).get("busbw_gbps")
            if value is not None and (best is None or value > best[0]):
                best = (value, row["size"], place.replace("_", "-"))
    return best


def _listed_count(floors: dict[int, float], count: int) -> int | None:
    """The listed count whose floor judges a run of `count` (nodes or NVLink domains):
    bandwidth falls as a run spans more, so a count between two measured ones takes the larger
    one's floor, and a count beyond every measured one has none."""
    listed = sorted(listed for listed in floors if listed >= count)
    return listed[0] if listed else None


def internode_floor(limits: Profile, nodes: int) -> tuple[str, float | None, str]:
    """(key, floor, why no floor) of an all_reduce across `nodes` nodes over the network:
    nccl_internode_min_busbw_gbps is one floor for any count, or floors by node count, since
    two nodes measure more than many (NCCL's tree crosses the network less on two)."""
    floors = limits.get(NcclLimits).nccl_internode_min_busbw_gbps
    if not isinstance(floors, dict):
        return INTER_KEY, floors, ""
    listed = _listed_count(floors, nodes)
    if listed is None:
        return (
            INTER_KEY,
            None,
            f"no floor for {nodes} nodes ({INTER_KEY} lists up to {max(floors)})",
        )
    return f"{INTER_KEY}[{listed}]", floors[listed], ""


def _domain_floor(
    floors: dict[int, float], domains: int | None, nodes: int
) -> tuple[str, float | None, str, str]:
    """(key, floor, scope, why no floor) of a multi-node NVLink run that spans `domains`
    NVLink domains: bandwidth falls as a run spans more domains (the NVLink inside one, the
    network between them), so a span between two measured ones takes the larger one's floor,
    and a span beyond every measured one is not judged."""
    if domains is None:
        return (
            DOMAINS_KEY,
            None,
            f"{nodes} nodes",
            f"the NVLink domains the run spans are unknown: set nvlink_domain for every host "
            f"in the inventory (triage: --nvlink-domains N) to judge it by {DOMAINS_KEY}",
        )
    scope = f"{nodes} nodes in {domains} NVLink domain{'s' if domains != 1 else ''}"
    listed = _listed_count(floors, domains)
    if listed is None:
        return (
            DOMAINS_KEY,
            None,
            scope,
            f"no floor for a span of {domains} NVLink domains ({DOMAINS_KEY} lists up to "
            f"{max(floors)})",
        )
    return f"{DOMAINS_KEY}[{listed}]", floors[listed], scope, ""


def _judge_bandwidth(
    run: dict[str, Any],
    nodes: int | None,
    limits: Profile,
    evidence: bool = False,
    domains: int | None = None,
) -> Result:
    """all_reduce busbw at sizes >= the reference size vs the threshold for this topology."""
    collective = run.get("collective")
    if collective != "all_reduce":
        name = f"{collective}_perf" if collective else "an unknown collective"
        return skipped(f"{name}: the profile's bandwidth thresholds are for all_reduce")
    if nodes is None:
        return skipped(
            "node count unknown: the log lists no (or not all) rank lines; pass --nodes N",
        )
    network = network_text(limits)
    scope = f"{nodes} nodes" + (f" over {network}" if network else "")
    lim = limits.get(NcclLimits)
    if nodes == 1:
        scope = "single node over NVLink"
        key, threshold, unjudged = SINGLE_KEY, lim.nccl_allreduce_min_busbw_gbps, ""
    else:  # unjudged: why no floor could be chosen for this many nodes
        key, threshold, unjudged = internode_floor(limits, nodes)
    floors = lim.nccl_nvlink_domains_min_busbw_gbps
    if nodes > 1 and floors and (domains is not None or threshold is None):
        key, threshold, scope, unjudged = _domain_floor(floors, domains, nodes)
    reference = lim.nccl_reference_size_bytes
    largest = max(row["size"] for row in run["rows"])
    big = [row for row in run["rows"] if row["size"] >= reference]
    if not big:
        text = (
            f"the run's largest message is {size_text(largest)}, below the reference size "
            f"{size_text(reference)} at which bandwidth is judged"
        )
        if evidence:
            return skipped(f"not evaluated: {text}")
        return failed(
            text, Action.FIX_CONFIG, "set nccl_sizes so the sweep reaches nccl_reference_size_bytes"
        )
    best = best_busbw(run["rows"], reference)
    if best is None:
        return failed(
            f"no valid busbw at >= {size_text(reference)} (nan or missing values)",
            Action.RERUN,
            "read the attached log; re-run",
        )
    value, size, place = best
    measured = f"all_reduce busbw {value:.1f} GB/s (best at >= {size_text(reference)}: "
    measured += f"{size_text(size)} {place})"
    if threshold is None:
        return skipped(f"{measured}, {scope}; {unjudged or f'no threshold: set {key} to judge it'}")
    avg = run.get("avg_busbw_gbps")
    sweep = f"; the sweep's average {avg:g} GB/s is not judged" if avg is not None else ""
    if value >= threshold:
        return passed(f"{measured} >= {threshold:g} GB/s, {scope}{sweep}")
    return failed(
        f"{measured} < {threshold:g} GB/s expected, {scope} (profile {limits.name}, {key}){sweep}",
        Action.DRAIN if nodes == 1 else Action.INSPECT,
        _SINGLE_ACTION if nodes == 1 else _INTER_ACTION,
    )


def nodes_of(record: dict[str, Any]) -> int | None:
    """Nodes a run spanned: what the runner launched, else the log's complete rank list."""
    if record.get("nodes") is not None:
        return int(record["nodes"])
    run = record.get("run") or {}
    if run.get("hosts_complete"):
        return len(run["hosts"])
    return None


@CHECKS.node("nccl_bandwidth", "nccl", section="nccl", level="standard", in_use=False)
def nccl_bandwidth(node: NodeView) -> Result:
    """all_reduce bus bandwidth at the reference size reaches the profile's threshold."""
    run = _run(node)
    record = section(node, "nccl")
    return _judge_bandwidth(
        run, nodes_of(record), node.limits, node.from_evidence, record.get("nvlink_domains")
    )


@CHECKS.node("nccl_data_integrity", "nccl", section="nccl", level="standard", in_use=False)
def nccl_data_integrity(node: NodeView) -> Result:
    """No wrong elements (#wrong) and no out-of-bounds values where nccl-tests validated."""
    run = _run(node)
    wrong = []
    checked = unchecked = 0
    for row in run["rows"]:
        for place in ("out_of_place", "in_place"):
            record = row.get(place)
            if record is None:
                continue
            count = record.get("wrong")
            if count is None:
                unchecked += 1
            elif count > 0:
                wrong.append(f"{count} at {size_text(row['size'])} {place.replace('_', '-')}")
            else:
                checked += 1
    oob = run.get("out_of_bounds") or {}
    problems = []
    if wrong:
        problems.append(f"#wrong {', '.join(wrong[:6])}{' ...' if len(wrong) > 6 else ''}")
    if oob.get("count") or oob.get("ok") is False:
        problems.append(f"Out of bounds values: {oob.get('count')} FAILED")
    problems += [f"the log says FAILED: {line!r}" for line in run.get("failed_lines") or []]
    if problems:
        return failed(f"data corruption: {'; '.join(problems)}", Action.DRAIN, _CORRUPTION_ACTION)
    mixed = _lone_not_validated(run["rows"])
    if mixed:  # says nothing about the GPUs, and nothing was checked there
        return failed(
            f"#wrong N/A {mixed} where the other sizes were validated: a garbled or edited log?",
            Action.RERUN,
            "read the attached log; re-run the sweep",
        )
    gap = run.get("sweep_gap")
    if run.get("rows_elided") or (gap and run.get("elided")):
        return skipped("not evaluated: the excerpt elides rows of the sweep (`...`)")
    if gap:
        before, after = gap
        where = (
            f"between {size_text(before)} and {size_text(after)}"
            if before
            else (f"before {size_text(after)}")
        )
        return failed(
            f"rows are missing from the sweep {where}: those sizes were not checked",
            Action.RERUN,
            "read the attached log (a garbled or edited file?); re-run the sweep",
        )
    if run.get("sweep_complete") is False:
        last = max(row["size"] for row in run["rows"])
        return failed(
            f"the log stops at {size_text(last)} of a sweep to "
            f"{size_text(run['sweep_end_bytes'])}: the sizes after it were not checked",
            Action.RERUN,
            "read the attached log (a run killed half-way, or a cut-off file); re-run the sweep",
        )
    if not oob:
        text = (
            "the log has no 'Out of bounds values' line: it may have been cut after its last "
            "row, and the out-of-bounds check is its verdict"
        )
        if node.from_evidence:
            return skipped(f"not evaluated: {text}")
        return failed(text, Action.RERUN, "read the attached log; re-run the sweep")
    errors = [(row.get("out_of_place") or {}).get("max_error", False) for row in run["rows"]]
    # The `error` column of before 2.10, in every row: a row of that layout among rows with
    # #wrong (pasted or inserted) does not make the others' out-of-bounds verdict its own.
    legacy = all(error is not False for error in errors)
    if not checked and legacy and oob.get("ok") is True and any(e is not None for e in errors):
        # Before 2.10 nccl-tests had no #wrong count: the out-of-bounds line is the verdict.
        checked_by = "Out of bounds values: 0 OK (nccl-tests before 2.10: no #wrong column)"
    elif not checked:
        why = (
            "it has no #wrong column, and no out-of-bounds verdict or no row it checked"
            if legacy
            else ("#wrong is N/A in every row (nccl-tests ran with -c 0)")
        )
        return skipped(f"not validated: {why}, which is not the same as 0")
    else:
        partly = f"; {unchecked} not validated (N/A)" if unchecked else ""
        checked_by = f"#wrong 0 in {checked} validated results{partly}, no out-of-bounds values"
    exit_note = section(node, "nccl").get("exit_note")
    if exit_note:
        return failed(exit_note, Action.RERUN, "read the attached log")
    return passed(checked_by)


def _lone_not_validated(rows: list[dict[str, Any]]) -> str:
    """Where #wrong is N/A in a column whose other rows have counts ("at 1 GiB in-place"):
    nccl-tests leaves a whole column unvalidated (-c 0, in-place alltoall), never one row."""
    found = []
    for place in ("out_of_place", "in_place"):
        column = [(row[place].get("wrong"), row["size"]) for row in rows if row.get(place)]
        if any(count is not None for count, _ in column):
            found += [
                f"at {size_text(size)} {place.replace('_', '-')}"
                for count, size in column
                if count is None
            ]
    return ", ".join(found[:4])


def set_domain_count(facts: dict[str, Any], domains: int | None) -> None:
    """`gpuhealth triage --nvlink-domains N`: the NVLink domains a saved log's run spanned
    (a log does not say; the suite counts the hosts' inventory nvlink_domain)."""
    record = facts.get("nccl")
    if domains is not None and record:
        record["nvlink_domains"] = domains


def set_node_count(facts: dict[str, Any], nodes: int | None) -> None:
    """`gpuhealth triage --nodes N`: the node count of a saved log that lists no (or not all)
    rank lines; complete rank lines win."""
    record = facts.get("nccl")
    if nodes is None or not record or (record.get("run") or {}).get("hosts_complete"):
        return
    record["nodes"] = nodes
