"""IMEX checks: the nvidia-imex service, and the IMEX domain as `nvidia-imex-ctl -N` shows it.

IMEX makes the GPUs of a multi-node NVLink domain (a GB200 or GB300 NVL72 rack) one memory
domain; where it is broken, multi-node jobs cannot share GPU memory over NVLink. Live facts are
judged on nodes whose limits set `imex_required`; a saved `nvidia-imex-ctl -N` output
(`gpuhealth triage`) is judged wherever it comes from. Every node of the domain must be READY on
one version, every connection of the table `C`, the domain UP and, where `imex_expected_nodes`
says so, the domain as big as expected. The daemon answers for the whole domain, so each node
of a rack sees a peer's fault too: where the probe knows which row is this node (its own
addresses) and every fault lies with a minority of peers, the node warns, naming them, and
only they fail (their own view shows the fault at them), so one broken tray does not drain
its whole rack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuhealth.checks import CheckSet, NodeView, StopCheck, detail, section
from gpuhealth.facts import reason
from gpuhealth.families.imex.limits import ImexLimits
from gpuhealth.families.imex.parse_imex_ctl import CONNECTED, CONNECTION_CODES, READY, UP
from gpuhealth.results import Action, Result, failed, passed, skipped, warned

CHECKS = CheckSet("imex")

Record = dict[str, Any]
# How many nodes or connections a message names before it counts the rest.
SHOWN = 6

_SERVICE_ADVICE = (
    "systemctl enable --now nvidia-imex, then read `journalctl -u nvidia-imex` (IMEX aborts when "
    "the loaded driver is not the version it was built for); the nvidia_driver role installs "
    "and configures it where the profile says imex_required"
)
_CTL_ADVICE = (
    "run `nvidia-imex-ctl -N` on the node: the nvidia-imex service must run with its command "
    "service on (IMEX_CMD_ENABLED=1 and IMEX_CMD_PORT in /etc/nvidia-imex/config.cfg); read "
    "`journalctl -u nvidia-imex`"
)
_NODE_ADVICE = (
    "on each named node: `systemctl status nvidia-imex` and `journalctl -u nvidia-imex`, then "
    "`systemctl restart nvidia-imex`"
)
_NETWORK_ADVICE = (
    "check the network between the named nodes and their IMEX daemons: every pair must reach "
    "each other on IMEX's SERVER_PORT (50000 by default)"
)
_VERSION_ADVICE = (
    "install one driver and IMEX version on every node of the domain (role nvidia_driver), then "
    "restart nvidia-imex on each"
)
_MAP_ADVICE = (
    "give every node of the domain the same /etc/nvidia-imex/nodes_config.cfg listing all of "
    "its nodes (role nvidia_driver, from the inventory's NVLink domain), then restart "
    "nvidia-imex on each"
)


@dataclass(frozen=True)
class Fault:
    """One thing wrong with an IMEX domain: what was seen, and what to do about it."""

    text: str
    action: Action
    advice: str


def _imex(node: NodeView) -> Record:
    """The `imex` section, or stop: SKIP where IMEX is not required, FAIL where it is but the
    probe did not read it."""
    required = node.limits.get(ImexLimits).imex_required
    if not required and not node.from_evidence:
        raise StopCheck(
            skipped(
                f"IMEX not required here (imex_required: false, from profile {node.limits.name} "
                "and inventory vars; set it true on the nodes of a multi-node NVLink domain)"
            )
        )
    record = node.facts["imex"]
    if required and isinstance(record, dict) and record.get("skipped"):
        raise StopCheck(
            failed(
                f"the probe did not read IMEX ({record['skipped']}), yet imex_required is true",
                Action.FIX_CONFIG,
                "install nvidia-imex matching the driver (role nvidia_driver); or set "
                "imex_required: false for nodes outside a multi-node NVLink domain",
            )
        )
    return section(node, "imex")


def _label(record: Record) -> str:
    address = record.get("address")
    return f"#{record['index']} ({address})" if address else f"#{record['index']}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _listed(items: list[str]) -> str:
    more = f" (+{len(items) - SHOWN} more)" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more


def _node_faults(nodes: list[Record]) -> list[Fault]:
    """Nodes that are not READY; a state the tool did not print is not READY either."""
    down = [n for n in nodes if n.get("state") != READY]
    if not down:
        return []
    states = [f"{_label(n)} {n.get('state') or 'state not reported'}" for n in down]
    text = f"{len(down)} of {len(nodes)} nodes not {READY}: {_listed(states)}"
    return [Fault(text, Action.INSPECT, _NODE_ADVICE)]


def _version_faults(nodes: list[Record]) -> list[Fault]:
    """More than one version in the domain, or a node whose version is missing where the
    others print one (a release that prints none is judged on the rest)."""
    versions: dict[str, list[Record]] = {}
    for record in nodes:
        if record.get("version"):
            versions.setdefault(record["version"], []).append(record)
    unknown = [
        _label(n)
        for n in nodes
        if not n.get("version") and reason(n, "version")["kind"] != "not_supported"
    ]
    found = []
    if len(versions) > 1:
        groups = sorted(versions.items(), key=lambda item: -len(item[1]))
        shown = [
            f"{version} on {len(group)} nodes"
            if len(group) > 3
            else f"{version} on {', '.join(_label(n) for n in group)}"
            for version, group in groups
        ]
        found.append(
            Fault(f"IMEX versions differ: {'; '.join(shown)}", Action.FIX_CONFIG, _VERSION_ADVICE)
        )
    if unknown:
        text = f"no version reported for {_listed(unknown)}"
        found.append(Fault(text, Action.FIX_CONFIG, _VERSION_ADVICE))
    return found


def _cells(nodes: list[Record], cells: list[tuple[int, int, str]], what: str) -> str:
    """`N of M connections <what>[, all to or from #k]: #0->#5 I, ... (I: meaning)`."""
    shared = set.intersection(*({i, j} for i, j, _ in cells))
    where = f", all to or from {_label(nodes[min(shared)])}" if len(shared) == 1 else ""
    shown = [f"#{nodes[i]['index']}->#{nodes[j]['index']} {code}" for i, j, code in cells]
    codes = sorted({code for _, _, code in cells})
    meanings = "; ".join(f"{c}: {CONNECTION_CODES.get(c, 'not in the legend')}" for c in codes)
    total = len(nodes) ** 2
    return f"{len(cells)} of {total} connections {what}{where}: {_listed(shown)} ({meanings})"


def _connection_faults(nodes: list[Record], connections: list[list[str]]) -> list[Fault]:
    """Every cell of the table that is not C, as version or node-map mismatches (the domain's
    configuration) and the rest (reachability)."""
    bad = [
        (i, j, code)
        for i, row in enumerate(connections)
        for j, code in enumerate(row)
        if code != CONNECTED
    ]
    kinds = (
        ("!V!", "with a version mismatch", Action.FIX_CONFIG, _VERSION_ADVICE),
        ("!M!", "with a node map mismatch", Action.FIX_CONFIG, _MAP_ADVICE),
    )
    found = []
    for code, what, action, advice in kinds:
        cells = [cell for cell in bad if cell[2] == code]
        if cells:
            found.append(Fault(_cells(nodes, cells, what), action, advice))
    rest = [cell for cell in bad if cell[2] not in ("!V!", "!M!")]
    if rest:
        text = _cells(nodes, rest, f"not {CONNECTED}")
        found.append(Fault(text, Action.INSPECT, _NETWORK_ADVICE))
    return found


def faults(domain: Record, expected_nodes: int | None) -> list[Fault]:
    """Everything wrong with an IMEX domain (`imex.domain` of the facts), most basic first."""
    nodes = domain["nodes"]
    found = []
    if expected_nodes is not None and len(nodes) != expected_nodes:
        text = f"the domain lists {len(nodes)} nodes, expected {expected_nodes}"
        found.append(Fault(text, Action.FIX_CONFIG, _MAP_ADVICE))
    found += _node_faults(nodes)
    found += _version_faults(nodes)
    found += _connection_faults(nodes, domain["connections"])
    state = domain.get("domain_state")
    if state != UP:
        shown = state or f"not reported ({detail(domain, 'domain_state')})"
        found.append(Fault(f"domain state {shown}, expected {UP}", Action.INSPECT, _NODE_ADVICE))
    return found


@CHECKS.node("imex_service", "nvlink", section="imex", in_use=True)
def imex_service(node: NodeView) -> Result:
    """The nvidia-imex service is active on a node of a multi-node NVLink domain."""
    record = _imex(node)
    state = record.get("service")
    if state is None:
        why = reason(record, "service")
        if why["kind"] == "absent":
            return skipped("not evaluated: the evidence holds no nvidia-imex service state")
        if why["kind"] == "not_supported":
            return skipped(
                f"nvidia-imex service state not readable here ({why['detail']}); imex_domain "
                "judges the daemon itself"
            )
        return failed(
            f"could not read the nvidia-imex service state: {why['detail']}",
            Action.INSPECT,
            "check that systemd answers (`systemctl is-system-running`, dbus); reboot if it hangs",
        )
    if state != "active":
        return failed(
            f"nvidia-imex is {state}, expected active", Action.FIX_CONFIG, _SERVICE_ADVICE
        )
    return passed("nvidia-imex active")


def _unread(record: Record) -> Result:
    """The verdict when the probe has no domain from nvidia-imex-ctl."""
    why = reason(record, "domain")
    if why["kind"] == "absent":
        return skipped(f"not evaluated: the evidence holds no IMEX domain status ({why['detail']})")
    if why["kind"] == "not_supported":
        return failed(
            f"nvidia-imex-ctl is not installed ({why['detail']}), yet imex_required is true",
            Action.FIX_CONFIG,
            "install nvidia-imex matching the driver (role nvidia_driver), or set "
            "imex_required: false for nodes outside a multi-node NVLink domain",
        )
    if why["kind"] == "timeout":
        return failed(
            f"nvidia-imex-ctl -N did not answer: {why['detail']}",
            Action.INSPECT,
            "the IMEX daemon's command service hangs: `systemctl restart nvidia-imex`, then "
            "read `journalctl -u nvidia-imex`",
        )
    return failed(
        f"could not read the IMEX domain: {why['detail']}", Action.FIX_CONFIG, _CTL_ADVICE
    )


def _this_node(nodes: list[Record], addresses: Any, hostname: Any) -> Record | None:
    """The domain's row for the node the facts come from: the one whose address is one of
    its own (or its host name); None when the probe did not say, or no row or several match."""
    own = {a for a in addresses if isinstance(a, str)} if isinstance(addresses, list) else set()
    if isinstance(hostname, str) and hostname:
        own |= {hostname, hostname.split(".")[0]}
    found = [n for n in nodes if n.get("address") in own]
    return found[0] if len(found) == 1 else None


def _at_fault(domain: Record) -> set[int] | None:
    """Positions of the nodes a domain's reachability faults lie with: those not READY, and
    those in at least half of the cells that are not C; None when a cell between two other
    nodes is bad too (the fault is not theirs alone)."""
    nodes = domain["nodes"]
    down = {i for i, n in enumerate(nodes) if n.get("state") != READY}
    bad = [
        (i, j)
        for i, row in enumerate(domain["connections"])
        for j, code in enumerate(row)
        if code != CONNECTED
    ]
    touching = {k: sum(k in cell for cell in bad) for k in range(len(nodes))}
    blamed = down | {k for k, count in touching.items() if bad and 2 * count >= len(bad)}
    if any(i not in blamed and j not in blamed for i, j in bad):
        return None
    return blamed


def _peer_fault(domain: Record, me: Record, found: list[Fault]) -> Result | None:
    """A WARN for a node whose domain is broken only at a minority of its peers."""
    if any(f.action is not Action.INSPECT for f in found):  # versions, node map, size: all
        return None
    nodes = domain["nodes"]
    blamed = _at_fault(domain)
    mine = nodes.index(me)
    if not blamed or mine in blamed or 2 * len(blamed) >= len(nodes):
        return None
    peers = _listed([_label(nodes[i]) for i in sorted(blamed)])
    return warned(
        f"IMEX domain broken at {peers}: {'; '.join(f.text for f in found)}; this node is "
        f"{_label(me)}, {READY}, and every fault involves {peers}: they fail their own check",
        Action.INSPECT,
        f"{_NODE_ADVICE}; multi-node NVLink jobs that span {peers} fail until then",
    )


def _malformed(domain: Any) -> str:
    """What makes a domain record (parse_imex_ctl's shape) unjudgeable, or "": the parser
    never writes one without nodes or with a table that is not one cell per pair of them,
    but a saved facts document reaches the check unchecked."""
    if not isinstance(domain, dict):
        return f"{type(domain).__name__}, not an object"
    nodes, table = domain.get("nodes"), domain.get("connections")
    if not isinstance(nodes, list) or not nodes:
        return "no nodes"
    if not all(isinstance(n, dict) and isinstance(n.get("index"), int) for n in nodes):
        return "a node without its index"
    size = len(nodes)
    if not isinstance(table, list) or len(table) != size:
        return f"the connection table is not {size} rows"
    if not all(
        isinstance(r, list) and len(r) == size and all(isinstance(c, str) for c in r) for r in table
    ):
        return f"a connection row is not {size} cells"
    return ""


@CHECKS.node("imex_domain", "nvlink", section="imex", in_use=True)
def imex_domain(node: NodeView) -> Result:
    """Every node of the IMEX domain READY on one version, all connected, the domain UP."""
    record = _imex(node)
    domain = record.get("domain")
    if domain is None:
        return _unread(record)
    malformed = _malformed(domain)
    if malformed:
        return failed(
            f"the IMEX domain record is malformed: {malformed}",
            Action.RERUN,
            "re-collect the facts with this gpuhealth (a facts document edited by hand?)",
        )
    expected = node.limits.get(ImexLimits).imex_expected_nodes
    found = faults(domain, expected)
    hostname = (node.facts.get("host") or {}).get("hostname")
    me = _this_node(domain["nodes"], record.get("addresses"), hostname)
    if found:
        peer = _peer_fault(domain, me, found) if me is not None else None
        if peer is not None:
            return peer
        action = min((f.action for f in found), key=lambda a: a.rank)
        advice = list(dict.fromkeys(f.advice for f in found))
        text = f"IMEX domain: {'; '.join(f.text for f in found)}"
        if me is not None:
            text += f"; this node is {_label(me)}"
        return failed(text, action, "; ".join(advice))
    nodes = domain["nodes"]
    versions = sorted({n["version"] for n in nodes if n.get("version")})
    on = f" on version {versions[0]}" if versions else " (this nvidia-imex-ctl prints no versions)"
    listed = _count(len(nodes), "node" if expected is None else f"of {expected} expected node")
    return passed(
        f"IMEX domain {UP}: {listed} {READY}{on}, all {_count(len(nodes) ** 2, 'connection')} "
        f"{CONNECTED}"
    )
