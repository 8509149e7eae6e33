"""`gpuhealth node-check`: judge this node where it stands, for the programs that ask a node
about itself: Slurm's HealthCheckProgram (`--slurm`: drain or resume this node), a
node-problem-detector custom plugin (`--npd`), a cron job writing Prometheus textfiles.

No SSH and no pytest: the shipped probe as a child process with a deadline, then the quick
checks in this process (gpuhealth.local), well inside Slurm's and NPD's 60 s.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpuhealth import report as reporting
from gpuhealth.checks import NodeView
from gpuhealth.config import ConfigError
from gpuhealth.facts import AUTO, IDLE, IN_USE
from gpuhealth.integrations import kubelet
from gpuhealth.local import DEFAULT_TIMEOUT_S, LocalVerdict, Selection, judge_here
from gpuhealth.sinks import Record, RunInfo, Sink, Sinks, entry

# Exit codes: as `gpuhealth triage` (0 healthy, 1 FAIL or nothing vouches for the node, 2 the
# command was used wrongly); node-problem-detector reads 0 OK, 1 problem, anything else unknown.
EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
NPD_OK, NPD_PROBLEM, NPD_UNKNOWN = 0, 1, 2
# NPD keeps a plugin's message to its max_output_length (80 by default in its examples).
NPD_MESSAGE_MAX = 80
NODE_STATE_CHOICES = (IDLE, IN_USE, AUTO)


def add_selection(parser: argparse.ArgumentParser, node_state: str) -> None:
    """The options that say which host this is, what it should be (as the suite's) and which
    node state it is judged in (default `node_state`)."""
    parser.add_argument("--host", help="this host's inventory name (default: its hostname)")
    parser.add_argument("--inventory", help="Ansible inventory with this host's vars")
    parser.add_argument("--profile", help="profile to judge by (default: the inventory's)")
    parser.add_argument("--profile-dir", type=Path, help="extra profiles (*.yml)")
    parser.add_argument("--expected-gpus", type=int, help="GPUs this node should have")
    parser.add_argument("--root", default="/", help="read /proc and /sys under this prefix")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds the probe may take (default {DEFAULT_TIMEOUT_S:g})",
    )
    # Not the inventory's node_state: that is the suite's (a nightly run's idle). Where this
    # command runs (slurmd, NPD, ft_launcher) the state is the command's to know.
    parser.add_argument(
        "--node-state",
        choices=NODE_STATE_CHOICES,
        default=node_state,
        help="idle: every rule; in-use: a job owns the GPUs, fault rules only; auto: Slurm's "
        "view of this node, the kubelet's pods, else compute processes on the GPUs decide "
        f"(default {node_state}; the inventory's node_state is the suite's, not this one's)",
    )
    parser.add_argument(
        "--kubelet-socket",
        default=kubelet.SOCKET,
        metavar="PATH",
        help="with --node-state auto: the kubelet's pod-resources socket, asked which pods "
        f"hold GPUs (default {kubelet.SOCKET}; none there: not on Kubernetes)",
    )


def selection(args: argparse.Namespace) -> Selection:
    """The Selection the options describe (ConfigError on a bad value)."""
    if args.expected_gpus is not None and args.expected_gpus < 0:
        raise ConfigError("--expected-gpus must be >= 0")
    if not 0 < args.timeout <= 3600:
        raise ConfigError("--timeout must be between 0 and 3600 seconds")
    return Selection(
        host=args.host,
        inventory=args.inventory,
        profile=args.profile,
        expected_gpus=args.expected_gpus,
        profile_dir=args.profile_dir,
        root=args.root,
        timeout_s=args.timeout,
        node_state=args.node_state,
        slurm_node=getattr(args, "slurm_node", None) or os.environ.get("SLURMD_NODENAME"),
        kubelet_socket=args.kubelet_socket,
    )


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`gpuhealth node-check` and its options."""
    parser = sub.add_parser(
        "node-check",
        help="judge this node (Slurm HealthCheckProgram, NPD plugin, textfile exporter)",
        description=__doc__.splitlines()[0],
    )
    add_selection(parser, AUTO)
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the verdict as one JSON document")
    out.add_argument(
        "--npd",
        action="store_true",
        help="node-problem-detector plugin: one line, exit 0 OK, 1 problem, 2 unknown",
    )
    parser.add_argument(
        "--slurm",
        action="store_true",
        help="drain this node in Slurm on FAIL, resume it on PASS if gpuhealth drained it",
    )
    parser.add_argument(
        "--slurm-node",
        help="this node's Slurm name (default: inventory var "
        "slurm_node_name, else the inventory name or hostname)",
    )
    parser.add_argument(
        "--apply",
        action="store_true",
        help="with --slurm: do it (default: print what would be done)",
    )
    parser.add_argument(
        "--prometheus-textfile-dir",
        type=Path,
        metavar="DIR",
        help="also write DIR/gpuhealth.prom for node_exporter's textfile collector",
    )
    parser.set_defaults(func=run)


def npd_line(text: str) -> str:
    """`text` as NPD keeps it: one line of at most NPD_MESSAGE_MAX characters."""
    return reporting.one_line(text, NPD_MESSAGE_MAX)


def run(args: argparse.Namespace) -> int:
    """Judge this node; its outputs (the answer, the textfile, Slurm) are the node-check
    sinks (gpuhealth.sinks.ENTRY_POINTS); the exit code."""
    try:
        chosen = selection(args)
        target = chosen.target()
    except ConfigError as exc:
        if args.npd:
            print(npd_line(f"gpuhealth cannot check this node: {exc}"))
            return NPD_UNKNOWN
        print(f"gpuhealth node-check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    result = judge_here(chosen, target)
    if args.slurm and not args.slurm_node:
        from gpuhealth.integrations import slurm

        # slurmd tells a HealthCheckProgram the node's Slurm name.
        args.slurm_node = os.environ.get("SLURMD_NODENAME") or slurm.node_name(
            result.host, target.host_vars
        )
    sinks = deliver(result, args)
    if sinks.reader_left:
        raise BrokenPipeError("standard output was closed")  # cli.main: as a shell says it
    verdict = result.verdict.verdict
    if args.npd:
        # NPD's line not written (sinks.failed_run): a healthy verdict is unknown to NPD.
        return (
            NPD_UNKNOWN
            if verdict == "NOT_CHECKED" or sinks.failed_run and healthy(verdict)
            else (NPD_OK if healthy(verdict) else NPD_PROBLEM)
        )
    # Fail closed: an output that was not written (the textfile, Slurm's drain) fails too.
    return EXIT_OK if healthy(verdict) and not sinks.problems else EXIT_FAIL


def healthy(verdict: str) -> bool:
    """Whether a verdict lets the node take work (PASS, WARN)."""
    return verdict in reporting.HEALTHY


def deliver(
    result: LocalVerdict, args: argparse.Namespace, kinds: tuple[type[Sink], ...] | None = None
) -> Sinks:
    """One judgement through node-check's sinks (`kinds` alone where given): this host (what
    it measured, where an open sink takes it), every finding, the verdict; `args` are the
    sinks' options. Each output that failed is said on stderr (stdout is the answer's)."""
    run = RunInfo(
        hosts=[result.host],
        level="quick",
        verdicts=None,
        options=args,
        history=None,
        command="gpuhealth node-check",
        inventory=getattr(args, "inventory", None),
        started_at=result.checked_at,
        textfile_dir=getattr(args, "prometheus_textfile_dir", None),
        entry="node-check",
    )
    finished_at = result.checked_at + result.duration_s
    sinks = entry.deliver(
        run,
        lambda: measured(result),
        result.outcomes,
        [result.verdict],
        finished_at,
        kinds,
        result.duration_s,
    )
    for problem in sinks.problems:
        print(f"gpuhealth node-check: {problem}", file=sys.stderr)
    return sinks


def measured(result: LocalVerdict) -> list[Record]:
    """What this host measured, as a suite's first test of it records it (its identity, rows
    and readings); nothing where the probe failed."""
    if result.facts is None or result.limits is None:
        return []
    from gpuhealth.history.run import measured as kept_of
    from gpuhealth.integrations.prometheus import readings

    view = NodeView(result.host, result.facts, result.limits)
    found = Record(result.host, readings=readings(view))
    found.keep(kept_of(view))
    return [found]
