"""`gpuhealth`: the commands that need no pytest run.

- `gpuhealth triage FILE...`: judge saved evidence (a log in a ticket) with the suite's checks.
- `gpuhealth probe`: print this machine's facts document (what the suite would judge).
- `gpuhealth profiles`: list the SKU profiles and their limits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from gpuhealth import checks
from gpuhealth import report as reporting
from gpuhealth.checks import nccl as nccl_checks
from gpuhealth.config import ConfigError, Expectations, ProfileSet, resolve_limits
from gpuhealth.evidence import EvidenceError, facts_from_files


def _gpu_slots(view: checks.NodeView) -> int:
    if view.expected_gpus is not None:
        return view.expected_gpus
    reported = view.facts.get("gpu_count")
    return max(reported or 0, len(view.facts.get("gpus") or []))


def triage_findings(view: checks.NodeView) -> list[reporting.Finding]:
    """Every check on one node's facts; GPU checks for each expected (or reported) GPU."""
    findings = []
    for name in checks.names("node"):
        result = checks.evaluate(name, view)
        findings.append(
            reporting.Finding(name, result.status, view.host, None, result.message, result.action)
        )
    for index in range(_gpu_slots(view)):
        for name in checks.names("gpu"):
            result = checks.evaluate(name, view, index)
            findings.append(
                reporting.Finding(
                    name, result.status, view.host, index, result.message, result.action
                )
            )
    return findings


def _triage(args: argparse.Namespace) -> int:
    try:
        profiles = ProfileSet(args.profile_dir)
        if args.profile:
            profiles.get(args.profile)
    except ConfigError as exc:
        print(f"gpuhealth triage: {exc}", file=sys.stderr)
        return 2
    book = reporting.VerdictBook()
    all_findings: list[reporting.Finding] = []
    headers = []
    groups = [(args.node, args.files)] if args.node else [(p.stem, [p]) for p in args.files]
    for host, paths in groups:
        try:
            kinds, facts = facts_from_files(paths, host)
        except EvidenceError as exc:
            print(f"gpuhealth triage: {exc}", file=sys.stderr)
            return 2
        nccl_checks.set_node_count(facts, args.nodes)
        expect = Expectations(args.profile, args.expected_gpus, {})
        first = next((g.get("name") for g in facts["gpus"] or [] if g.get("name")), None)
        limits = resolve_limits(expect, profiles, first)
        view = checks.NodeView(host, facts, limits)
        findings = triage_findings(view)
        for finding in findings:
            book.add(finding)
        all_findings.extend(findings)
        driver = (facts.get("driver") or {}).get("version") or "unknown"
        read = ", ".join(f"{p} ({k.name})" for p, k in zip(paths, kinds, strict=True))
        headers.append(f"{host}: {read}; driver {driver}, profile {limits.name}")
        for error in facts.get("errors") or []:
            headers.append(f"  note: {error.get('error')}")
    verdict = reporting.overall(book.finish())
    if args.json:
        doc = {
            "verdict": verdict,
            "findings": [
                {
                    "check": f.check,
                    "status": f.status,
                    "host": f.host,
                    "gpu": f.gpu,
                    "message": f.message,
                    **({"action": f.action} if f.action else {}),
                }
                for f in all_findings
            ],
        }
        print(json.dumps(doc, indent=2))
    else:
        for line in headers:
            print(line)
        shown = [f for f in all_findings if args.verbose or f.status != "PASS"]
        for f in shown:
            print(f"{f.status:<5} {f.check:<16} {f.message}")
        passed = sum(f.status == "PASS" for f in all_findings)
        if not args.verbose and passed:
            print(f"({passed} checks passed; -v lists them)")
        print(f"verdict: {verdict}")
    return 1 if verdict == "FAIL" else 0


def _probe(args: argparse.Namespace) -> int:
    from gpuhealth.probe.main import collect

    doc = collect({"root": args.root, "nvml_call_timeout_s": args.nvml_call_timeout})
    print(json.dumps(doc, indent=2, sort_keys=True))
    return 0


def _profiles(args: argparse.Namespace) -> int:
    try:
        profiles = ProfileSet(args.profile_dir)
    except ConfigError as exc:
        print(f"gpuhealth profiles: {exc}", file=sys.stderr)
        return 2
    if args.name:
        try:
            limits: dict[str, Any] = profiles.get(args.name).limits
        except ConfigError as exc:
            print(f"gpuhealth profiles: {exc}", file=sys.stderr)
            return 2
        print(yaml.safe_dump(limits, sort_keys=False), end="")
        return 0
    for name in profiles.names:
        print(f"{name:<16} {profiles.get(name)['description']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the `gpuhealth` command."""
    parser = argparse.ArgumentParser(prog="gpuhealth", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    triage = sub.add_parser("triage", help="judge saved evidence (nvidia-smi -q / -q -x output)")
    triage.add_argument("files", nargs="+", type=Path, metavar="FILE")
    triage.add_argument(
        "--node",
        metavar="NAME",
        help="all FILEs come from this one node (default: a node per file)",
    )
    triage.add_argument("--profile", help="profile to judge by (default: matched by GPU name)")
    triage.add_argument("--profile-dir", type=Path, help="extra profiles (*.yml)")
    triage.add_argument("--expected-gpus", type=int, help="GPUs the node should have")
    triage.add_argument(
        "--nodes", type=int, help="nodes an nccl-tests log spans when it lists no rank lines"
    )
    triage.add_argument("--json", action="store_true", help="machine-readable findings")
    triage.add_argument("-v", "--verbose", action="store_true", help="list passed checks too")
    triage.set_defaults(func=_triage)

    probe = sub.add_parser("probe", help="print this machine's facts document")
    probe.add_argument("--root", default="/", help="read /proc and /sys under this prefix")
    probe.add_argument("--nvml-call-timeout", type=float, default=5.0)
    probe.set_defaults(func=_probe)

    profiles = sub.add_parser("profiles", help="list profiles, or show one's limits")
    profiles.add_argument("name", nargs="?")
    profiles.add_argument("--profile-dir", type=Path)
    profiles.set_defaults(func=_profiles)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `gpuhealth` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "expected_gpus", None) is not None and args.expected_gpus < 0:
        parser.error("--expected-gpus must be >= 0")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
