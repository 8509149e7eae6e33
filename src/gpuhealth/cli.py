"""`gpuhealth`: the commands that need no pytest run.

- `gpuhealth triage FILE...`: judge saved evidence (a log in a ticket) with the suite's checks.
- `gpuhealth probe`: print this machine's facts document (what the suite would judge).
- `gpuhealth profiles`: list the SKU profiles, show one's limits, or every profile key.
- `gpuhealth history`: measured values over time from the run store, as tables or a plot.
- `gpuhealth node-check`: judge this node (Slurm HealthCheckProgram, NPD plugin, textfiles).
- `gpuhealth act`: act on a run's verdicts (Slurm drain/resume, Kubernetes labels/taints).
- `gpuhealth bundle`: this node's raw outputs, facts and verdict in one archive for a ticket.
- `gpuhealth merge`: one fleet's report from its shards' reports (`pytest --shard K/N`).
- `gpuhealth run --jobs N -- PYTEST ARGS`: the suite as N shards at once on this machine, merged
  (`-n N`'s controller stops scaling at ~1.4x; shards scale with the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import yaml

from gpuhealth import bundle as bundles
from gpuhealth import jobs, registry, shards
from gpuhealth import report as reporting
from gpuhealth.checks import NodeView, judged
from gpuhealth.config import (
    ConfigError,
    Expectations,
    Platform,
    ProfileSet,
    key_table,
    resolve_limits,
)
from gpuhealth.evidence import STDIN, EvidenceError, described, facts_from_files, section_sources
from gpuhealth.facts import IDLE, IN_USE
from gpuhealth.families.gpu.scope import GPU
from gpuhealth.families.nccl.checks import set_domain_count, set_node_count
from gpuhealth.history import show
from gpuhealth.integrations import act, nodecheck, serve
from gpuhealth.sinks import Record, RunInfo, entry

# Exit codes of `gpuhealth triage`: a FAIL verdict is 1; bad input is 2; a bug is 3, never 1.
EXIT_PASS, EXIT_FAIL, EXIT_USAGE, EXIT_BUG = 0, 1, 2, 3
EXIT_PIPE = 128 + 13  # as a shell reports a command killed by SIGPIPE


def triage_outcomes(view: NodeView) -> list[reporting.Outcome]:
    """Every check on one node's facts; GPU checks for each expected (or reported) GPU."""
    checks = list(registry.checks().values())
    slots = GPU.slots(view)
    return [reporting.Outcome.of(f) for f in judged(checks, view, slots)]


def _triage(args: argparse.Namespace) -> int:
    try:
        profiles = ProfileSet(args.profile_dir)
        if args.profile:
            profiles.get(args.profile)
    except ConfigError as exc:
        print(f"gpuhealth triage: {exc}", file=sys.stderr)
        return EXIT_USAGE
    book = reporting.VerdictBook()
    hosts: list[Record] = []  # what each node's evidence was
    found: list[Record] = []  # every finding, with the ticket part it came from
    if args.files.count(STDIN) > 1:
        print("gpuhealth triage: - (standard input) can be read once", file=sys.stderr)
        return EXIT_USAGE
    started = time.time()
    groups = [(args.node, args.files)] if args.node else [(_host(p), [p]) for p in args.files]
    for host, paths in groups:
        try:
            bundle = bundles.opened(paths, args.node)
            if bundle:
                host, kinds, facts = bundle.host, [bundles.KIND], bundle.facts
            else:
                kinds, facts = facts_from_files(paths, host)
        except EvidenceError as exc:
            print(f"gpuhealth triage: {exc}", file=sys.stderr)
            return EXIT_USAGE
        set_node_count(facts, args.nodes)
        set_domain_count(facts, args.nvlink_domains)
        expect = Expectations(args.profile, args.expected_gpus, {})
        limits = resolve_limits(expect, profiles, Platform.of(facts))
        view = NodeView(host, facts, limits, state=args.node_state)
        book.state(host, view.node_state, view.node_state_source)
        parts = section_sources(facts)
        for outcome in triage_outcomes(view) + (bundle.outcomes if bundle else []):
            book.add(outcome)
            found.append(entry.record(outcome))
            found[-1].evidence = _part(parts, outcome)
        driver = (facts.get("driver") or {}).get("version") or "unknown"
        read = (
            ", ".join(f"{p} ({k.name})" for p, k in zip(paths, kinds, strict=True))
            if bundle
            else described(facts)
        )
        notes = _busy_note(view) + ([limits.note] if limits.note else [])
        notes += (bundle.notes if bundle else []) + [
            e.get("error") for e in facts.get("errors") or []
        ]
        hosts.append(
            Record(
                host,
                profile=limits.chosen,
                node_state=view.node_state,
                evidence=f"{read}; driver {driver}",
                remarks=notes,
            )
        )
    verdicts = book.finish()
    run = RunInfo(
        hosts=[str(h.host) for h in hosts],
        level="full",
        verdicts=None,
        options=args,
        history=None,
        command="gpuhealth triage",
        source="evidence",
        started_at=started,
        entry="triage",
    )
    sinks = entry.deliver(run, lambda: hosts, found, verdicts, time.time())
    for problem in sinks.problems:
        print(f"gpuhealth triage: {problem}", file=sys.stderr)
    if sinks.reader_left:
        raise BrokenPipeError("standard output was closed")  # main: as a shell says it
    if sinks.problems:  # an output not written: no verdict to act on, whatever it was
        return EXIT_BUG
    return EXIT_PASS if reporting.overall(verdicts) in reporting.HEALTHY else EXIT_FAIL


def _host(path: Path) -> str:
    """The node a file is judged as: the file's name, `stdin` for standard input."""
    return "stdin" if path == STDIN else path.stem


def _part(parts: dict[str, str], outcome: reporting.Outcome) -> str | None:
    """The ticket part a finding's evidence came from (None for a file read whole)."""
    check = registry.checks().get(outcome.check)
    return parts.get(check.section) if check else None


def _busy_note(view: NodeView) -> list[str]:
    """A job's processes in evidence judged idle: said, since idle rules then fail on them."""
    busy = [
        f"gpu{gpu.get('index')}"
        for gpu in view.facts.get("gpus") or []
        if isinstance(gpu, dict) and gpu.get("processes")
    ]
    if view.in_use or not busy:
        return []
    return [
        f"compute processes on {', '.join(busy)}: judged idle; if a job was running, "
        "--node-state in-use judges its faults only"
    ]


def probe_config(profile: str | None, root: str) -> dict[str, Any]:
    """The probe's configuration for this machine: a profile's limits (default: `default`)."""
    limits = resolve_limits(Expectations(profile, None, {}), ProfileSet(), None)
    return {"root": root, "expect": limits.values}


def _probe(args: argparse.Namespace) -> int:
    from gpuhealth.active.collect import on_this_node
    from gpuhealth.local import Selection
    from gpuhealth.probe.main import collect

    try:
        config = probe_config(args.profile, args.root)
        # --level: this host's load tests, run here after the probe (an srun task per node)
        loads = args.level != "quick"
        target = Selection(args.host, args.inventory, args.profile).target() if loads else None
    except ConfigError as exc:
        print(f"gpuhealth probe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    doc = collect(config)
    if target is not None:
        limits = resolve_limits(target.expectations, ProfileSet(), Platform.of(doc))
        doc.update(on_this_node(doc, limits, args.level))
    print(json.dumps(doc, indent=2, sort_keys=True))
    return 0


def _profiles(args: argparse.Namespace) -> int:
    try:
        profiles = ProfileSet(args.profile_dir)
        if args.keys:
            print(keys_markdown() if args.markdown else keys_text())
            return 0
        if args.table:
            print(profiles_markdown(profiles))
            return 0
        if args.name:
            values = profiles.get(args.name).model.model_dump()  # int keys stay ints
            print(yaml.safe_dump(values, sort_keys=False), end="")
            return 0
    except ConfigError as exc:
        print(f"gpuhealth profiles: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for name in profiles.names:
        print(f"{name:<20} {profiles.description(name)}")
    return 0


def keys_text() -> str:
    """Every profile key, its family, default and meaning: one aligned line each."""
    return "\n".join(
        f"{family:<8} {key:<40} {json.dumps(default):<22} {meaning}"
        for family, key, default, meaning in key_table()
    )


def keys_markdown() -> str:
    """The same as a Markdown table: the README's table of profile keys is this output."""
    rows = ["| key | family | default | meaning |", "|---|---|---|---|"]
    rows += [
        f"| `{key}` | {family} | `{json.dumps(default)}` | {meaning.replace('|', '/')} |"
        for family, key, default, meaning in key_table()
    ]
    return "\n".join(rows)


def _floors(values: dict[str, Any]) -> str:
    """A profile's all_reduce busbw floors, as the profile table shows them."""
    parts = []
    if values["nccl_allreduce_min_busbw_gbps"] is not None:
        parts.append(f"1 node {values['nccl_allreduce_min_busbw_gbps']:g}")
    internode = values["nccl_internode_min_busbw_gbps"]
    if isinstance(internode, dict):
        counts = ", ".join(f"{count}: {floor:g}" for count, floor in sorted(internode.items()))
        parts.append(f"by nodes {counts}")
    elif internode is not None:
        parts.append(f"nodes {internode:g}")
    domains = values["nccl_nvlink_domains_min_busbw_gbps"]
    if domains:
        spans = ", ".join(f"{count}: {floor:g}" for count, floor in sorted(domains.items()))
        parts.append(f"by NVLink domains {spans}")
    return "; ".join(parts) or "-"


def profiles_markdown(profiles: ProfileSet) -> str:
    """The packaged profiles side by side, a Markdown table: the README's profile table is
    this output (`gpuhealth profiles --table --markdown`)."""
    rows = [
        "| profile | matched by | GPUs | power limit >= W | PCIe | NVLink links | fabric manager "
        "| IMEX, multi-node NVLink | GPU-NIC | all_reduce busbw floor GB/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in profiles.names:
        v = profiles.get(name).model.model_dump()
        pcie = f"gen {v['pcie_gen_expected']}" if v["pcie_gen_expected"] else "-"
        if v["pcie_width_expected"]:
            pcie += f" x{v['pcie_width_expected']}"
        links = v["nvlink_links_expected"]
        nvl = "yes" if v["imex_required"] or v["nvlink_multinode"] else "-"
        cells = [
            f"`{name}`",
            profiles.identified_by(name).replace("|", "/")
            or ("none fits: the fallback" if name == "default" else "named only (gpu_profile)"),
            str(v["gpu_count"]) if v["gpu_count"] is not None else "any",
            f"{v['min_power_limit_w']:g}" if v["min_power_limit_w"] is not None else "-",
            pcie,
            "all" if links is None else str(links),
            "yes" if v["requires_fabric_manager"] else "-",
            nvl,
            v["gpu_nic_max_distance"] or "-",
            _floors(v),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `gpuhealth` command."""
    parser = argparse.ArgumentParser(prog="gpuhealth", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    triage = sub.add_parser("triage", help="judge saved evidence (nvidia-smi, dmesg, ...)")
    triage.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="evidence files, - for standard input; one file may hold several outputs",
    )
    triage.add_argument(
        "--node",
        metavar="NAME",
        help="all FILEs come from this one node (default: a node per file)",
    )
    triage.add_argument(
        "--profile", help="profile to judge by (default: the one the GPUs are identified as)"
    )
    triage.add_argument("--profile-dir", type=Path, help="extra profiles (*.yml)")
    triage.add_argument("--expected-gpus", type=int, help="GPUs the node should have")
    triage.add_argument(
        "--nodes", type=int, help="nodes an nccl-tests log spans when it lists no rank lines"
    )
    triage.add_argument(
        "--nvlink-domains",
        type=int,
        help="NVLink domains (NVL72 racks) an nccl-tests log's run spans",
    )
    triage.add_argument(
        "--node-state",
        choices=(IDLE, IN_USE),
        default=IDLE,
        help="idle: every rule (default); in-use: a job owned the GPUs when the evidence was "
        "taken, so only fault rules apply",
    )
    triage.add_argument("--json", action="store_true", help="machine-readable findings")
    triage.add_argument("-v", "--verbose", action="store_true", help="list passed checks too")
    triage.set_defaults(func=_triage)

    probe = sub.add_parser("probe", help="print this machine's facts document")
    probe.add_argument("--root", default="/", help="read /proc and /sys under this prefix")
    probe.add_argument("--profile", help="profile whose limits the probe uses (default: default)")
    probe.add_argument(
        "--level",
        choices=("quick", "standard", "full"),
        default="quick",
        help="also run the load tests of this level here (nccl-tests, dcgmi diag) and carry "
        "them in the document, for `pytest --facts --level` (default quick: none)",
    )
    probe.add_argument(
        "--inventory", help="Ansible inventory whose vars for this host the load tests use"
    )
    probe.add_argument("--host", help="this host's inventory name (default: its hostname)")
    probe.set_defaults(func=_probe)

    profiles = sub.add_parser("profiles", help="list profiles, show one's limits, or the keys")
    profiles.add_argument("name", nargs="?")
    profiles.add_argument("--profile-dir", type=Path)
    profiles.add_argument("--keys", action="store_true", help="every profile key and default")
    profiles.add_argument("--markdown", action="store_true", help="--keys as a Markdown table")
    profiles.add_argument(
        "--table", action="store_true", help="the profiles side by side (a Markdown table)"
    )
    profiles.set_defaults(func=_profiles)
    show.add_parser(sub)
    nodecheck.add_parser(sub)
    serve.add_parser(sub)
    act.add_parser(sub)
    bundles.add_parser(sub)
    shards.add_parser(sub)
    jobs.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `gpuhealth` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for name, least in (("expected_gpus", 0), ("nodes", 0), ("nvlink_domains", 1)):
        value = getattr(args, name, None)
        if value is not None and value < least:
            parser.error(f"--{name.replace('_', '-')} must be >= {least}")
    try:
        return int(args.func(args))
    except BrokenPipeError:  # `gpuhealth ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE
    except Exception:  # a bug, not a verdict: say so, with its own exit code
        traceback.print_exc()
        print(
            f"gpuhealth {args.command}: internal error (a bug in gpuhealth, not a verdict on "
            "the evidence); please report it with the traceback above",
            file=sys.stderr,
        )
        return EXIT_BUG


if __name__ == "__main__":
    sys.exit(main())
