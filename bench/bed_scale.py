"""The health suite live on a test bed of N SSH nodes, and collect.yml on it, measured.

bench/scale.py times offline judging of synthetic facts; this times what users run against a
fleet, over real SSH, on the bed of selftest/testbed (one network namespace, overlay root and
sshd per node; root only). The fleet reuses fleet.py's roles and provisioning: most nodes
play n1 (a healthy 8x H100 with the whole stand-in stack: driver 570, DCGM, NCCL, GPUd,
nccl-tests), n2 and dgx-gpu3 keep their faults, one more node plays n2, n4 is stopped
(unreachable). Then it

1. runs the suite as users do (`pytest --hosts=ansible://all?ansible_inventory=... -n W`, every
   report on) for each W of --workers, from cold (ssh masters closed); then once with the
   masters the last run left open and once with ControlPath=none (no multiplexing), plus
   `ssh NODE true` both ways: what the bed's ssh_config ControlPath changes;
2. runs playbooks/collect.yml with each of --forks, then judges the documents offline
   (`pytest --facts DIR --inventory ...`): the two-step recipe for fleets beyond one controller;
3. holds every run to the right outcome (healthy nodes pass, faulty ones fail exactly
   test_e2e's EXPECTED_FAILURES, n4 UNREACHABLE, one command per live node in each node's sshd
   log, the same verdicts in every run, offline included), so no row times a broken run, and
   prints one table and the size of the probe command against Linux's MAX_ARG_STRLEN.

    .venv/bin/python bench/bed_scale.py                     # 32 nodes (make bench)
    .venv/bin/python bench/bed_scale.py --nodes 64 --repeat 3 --workers 2,4 --forks 32

Reports of every run stay in reports/bed-scale/. Wall times on a shared machine are noisy
(the CPU time other jobs took during each step is in the table); CPU seconds are less so.
On the bed the nodes share the controller's CPUs: a real fleet's controller spends only the
"ctl" column, its nodes the "nodes" one, each node its own share.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpuhealth import registry  # noqa: E402
from selftest.suite import SuiteRun, run_suite  # noqa: E402
from selftest.testbed import bedlib, fleet, roles_bed  # noqa: E402
from selftest.testbed.test_e2e import EXPECTED_FAILURES, expected_failures  # noqa: E402

REPORTS = REPO / "reports" / "bed-scale"
MAX_ARG_STRLEN = 32 * 4096  # Linux: one argv string, NUL included (binfmts.h)
HEALTHY, STOPPED = "n1", "n4"


# ---------------------------------------------------------------- the fleet


def fleet_roles(count: int) -> dict[str, str]:
    """Node name -> the fleet.ROLES entry it plays: fleet.py's four, then healthy n5..nN, the
    last of them (from 8 nodes on) a second n2, so faults are not special to one name."""
    if count < len(fleet.ROLES):
        raise SystemExit(f"--nodes must be at least {len(fleet.ROLES)} (fleet.py's roles)")
    plays = {name: name for name in fleet.ROLES}
    plays.update({f"n{i}": HEALTHY for i in range(len(fleet.ROLES) + 1, count + 1)})
    if count >= 8:
        plays[f"n{count}"] = "n2"
    return plays


def expected(host: str, plays: str, facts: dict[str, Any]) -> set[str]:
    """The tests `host` must fail: test_e2e's for the role it plays, renamed to it."""
    return {
        name.replace(f"[{plays}", f"[{host}", 1)
        for name in (expected_failures(plays, facts) if plays in EXPECTED_FAILURES else set())
    }


# ---------------------------------------------------------------- measuring


@dataclass
class Row:
    """One line of the table: a step, run once or --repeat times."""

    step: str
    hosts: int  # the s/host divisor: the hosts the step addresses
    walls: list[float] = field(default_factory=list)
    cpu: dict[str, list[float]] = field(default_factory=dict)  # CPU s: controller, nodes, ...
    probes: list[dict[str, int]] = field(default_factory=list)  # sshd commands per live node
    problems: list[str] = field(default_factory=list)
    masters: tuple[int, int] = (0, 0)  # ssh control sockets open before and after the step

    @property
    def wall(self) -> float:
        return statistics.median(self.walls)

    def median(self, what: str) -> float:
        return statistics.median(self.cpu[what])

    def say(self) -> None:
        """One progress line, as soon as a run is done."""
        state = "ok" if not self.problems else "WRONG: " + self.problems[-1][:300]
        print(f"  {self.step}: {self.walls[-1]:.1f}s {state}", flush=True)


TICK = os.sysconf("SC_CLK_TCK")


def machine_cpu() -> float:
    """CPU seconds every CPU has been busy since boot (/proc/stat); steal counts as busy: it
    is time other guests of the host took."""
    ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / TICK  # but idle, iowait


def tree_cpu(pids: list[int], children: bool) -> float:
    """CPU seconds of these processes (with `children`, plus their waited-for descendants')."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(t) for t in stat[11 : 15 if children else 13])  # utime...cstime
    return total / TICK


def bed_cpu(bed: bedlib.Bed) -> tuple[float, float]:
    """(nodes, ssh masters) CPU seconds so far. The nodes: every process in their network
    namespaces with what it reaped (sshd reaps the probes), so exited probes count too. The
    masters: ssh clients ControlPersist detached (adopted, not reaped, by this process)."""
    pids = []
    for node in bed.nodes:
        out = subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True, text=True)
        pids += [int(p) for p in out.stdout.split()]
    masters = []
    for pid in bedlib.bed_processes(bed.run_dir):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "ssh":
                masters.append(pid)
    return tree_cpu(pids, children=True), tree_cpu(masters, children=False)


def busy_share(seconds: float = 2.0) -> float:
    """How busy the machine's CPUs are (0-1) over a few seconds: other jobs, before we start."""
    start = machine_cpu()
    time.sleep(seconds)
    return (machine_cpu() - start) / seconds / (os.cpu_count() or 1)


@contextlib.contextmanager
def measured(row: Row, bed: bedlib.Bed) -> Iterator[None]:
    """Wall time and where the CPU went: this machine's processes the step started (pytest
    and its xdist workers, ssh clients and masters, ansible-playbook and its forks), the nodes,
    and the rest of the machine (other jobs: the noise)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    nodes, masters = bed_cpu(bed)
    machine = machine_cpu()
    start = time.monotonic()
    yield
    row.walls.append(time.monotonic() - start)
    spent = {"all": machine_cpu() - machine}
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    nodes2, masters2 = bed_cpu(bed)
    spent["nodes"] = nodes2 - nodes
    spent["ctl"] = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    spent["ctl"] += masters2 - masters
    spent["other"] = spent["all"] - spent["nodes"] - spent["ctl"]
    for what, seconds in spent.items():
        row.cpu.setdefault(what, []).append(seconds)


def control_sockets(bed: bedlib.Bed, which: str) -> list[Path]:
    """The ssh masters' sockets of the bed's ssh_config (`cm`) or of Ansible (`cp`)."""
    return list(bed.run_dir.glob("cm-*" if which == "cm" else "cp/*"))


def close_masters(bed: bedlib.Bed) -> None:
    """Close every multiplexed ssh connection, so the next step pays its own handshakes."""
    bedlib.close_masters(bed.run_dir)
    for _ in range(50):
        if not bedlib.control_sockets(bed.run_dir):
            break
        time.sleep(0.1)


def counted(bed: bedlib.Bed, live: list[str], step: Callable[[], Any]) -> tuple[Any, dict]:
    """Run `step`; how many commands each live node's sshd started meanwhile."""
    before = {name: bed.sessions(name) for name in live}
    result = step()
    return result, {name: bed.sessions(name) - before[name] for name in live}


# ---------------------------------------------------------------- checking


def verdict_key(v: dict[str, Any]) -> tuple:
    """What must agree between two runs of the same fleet: verdict, failures, counts."""
    return v["verdict"], sorted((f["check"], str(f["gpu"])) for f in v["failed"]), v["counts"]


def check_live(suite: SuiteRun, plays: dict[str, str], live: list[str]) -> list[str]:
    """Every node judged as its role says; empty when the run is right."""
    problems = []
    if suite.rc != 1:
        return [f"exit status {suite.rc}, not 1 (faults found):\n{suite.output[-2000:]}"]
    verdicts, outcomes = suite.verdicts, suite.outcomes()
    if verdicts["hosts"] != sorted(plays):
        problems.append(f"verdicts for {verdicts['hosts']}")
    per_host = len(registry.names("node")) + 8 * len(registry.names("gpu"))
    for host, role in plays.items():
        tests = {
            name: status
            for name, status in outcomes.items()
            if name.endswith(f"[{host}]") or f"[{host}-gpu" in name
        }
        verdict = verdicts["nodes"][host]["verdict"]
        if role == STOPPED:
            if verdict != "UNREACHABLE" or set(tests.values()) != {"error", "skipped"}:
                problems.append(f"{host}: {verdict}, {sorted(set(tests.values()))}")
            continue
        saved = suite.reports / "facts" / f"{host}.json"
        if not saved.is_file():
            reasons = verdicts["nodes"][host]["reasons"]
            problems.append(f"{host}: no facts document; {verdict}: {reasons[:1]}"[:400])
            continue
        want = expected(host, role, json.loads(saved.read_text()))
        failed = {name for name, status in tests.items() if status == "failed"}
        if len(tests) != per_host or not set(tests.values()) <= {"passed", "skipped", "failed"}:
            problems.append(f"{host}: {len(tests)} tests, {sorted(set(tests.values()))}")
        if failed != want:
            problems.append(f"{host}: failed {sorted(failed ^ want)} unexpectedly (or not)")
        if verdict != ("FAIL" if want else "PASS"):
            problems.append(f"{host}: verdict {verdict}")
    facts_files = sorted(p.stem for p in (suite.reports / "facts").glob("*.json"))
    if facts_files != sorted(live):
        problems.append(f"facts documents of {facts_files}")
    return problems


def check_probes(probes: dict[str, int]) -> list[str]:
    """Exactly one command per live node: the probe (the suite's, or collect.yml's task)."""
    bad = {n: c for n, c in probes.items() if c != 1}
    return [f"sshd commands per node: {bad}"] if bad else []


# ---------------------------------------------------------------- the probe command


@dataclass
class ProbeSize:
    host: str  # the host of the longest command
    node: int  # what the node's sshd hands to `sh -c`: one argument
    controller: int  # what testinfra hands to the controller's `/bin/sh -c` (ssh + quoted)
    stdin: int  # the compressed modules and config, written on the command's stdin
    ssh_argv: str  # the ssh command line testinfra builds (options included)


def probe_size(bed: bedlib.Bed) -> ProbeSize:
    """The longest probe command the suite sends to a node of the bed, built by the suite's
    own code (targets, limits, transport) and testinfra's ssh backend."""
    from gpuhealth.config import ProfileSet, resolve_limits
    from gpuhealth.targets import live_targets
    from gpuhealth.transport import probe_call

    os.environ.update(bed.ansible_env())
    profiles = ProfileSet()
    sizes = []
    for target in live_targets(
        [f"ansible://all?ansible_inventory={bed.inventory}"], {}, profiles, {}
    ):
        limits = resolve_limits(target.expectations, profiles, None)
        config = {"root": "/", "expect": limits.values}
        call = probe_call(config, target.python, float(limits.values["probe_timeout_s"]))
        command = call.command
        ssh = target.host.backend.ansible_runner.get_host(target.name).backend
        cmd, args = ssh._build_ssh_command(command)
        sizes.append(
            ProbeSize(
                target.name,
                len(command.encode()),
                len(ssh.quote(" ".join(cmd), *args).encode()),
                len(call.stdin.encode()),
                ssh.quote(" ".join(cmd), *args[:-1], "PROBE"),
            )
        )
    return max(sizes, key=lambda size: size.controller)


# ---------------------------------------------------------------- the benchmark


def setup(count: int, install_forks: int) -> tuple[bedlib.Bed, dict[str, str], dict]:
    """The bed, what each node plays, and the seconds each setup step took."""
    timings: dict[str, float] = {}
    start = time.monotonic()
    bedlib.ensure_rootfs()
    timings["rootfs (cached; cold build recorded below)"] = time.monotonic() - start
    plays = fleet_roles(count)
    roles = {name: fleet.ROLES[role] for name, role in plays.items()}
    start = time.monotonic()
    bed = fleet.up(roles)
    timings[f"bed up, {count} nodes"] = time.monotonic() - start
    # fleet.install runs ansible-playbook with bed.ansible_env(), a copy of ours.
    os.environ["ANSIBLE_FORKS"] = str(install_forks)
    try:
        steps = fleet.provision(bed, roles)
    finally:
        del os.environ["ANSIBLE_FORKS"]
    timings.update(
        {f"{k} (forks {install_forks})" if "install" in k else k: v for k, v in steps.items()}
    )
    return bed, plays, timings


def live_run(
    bed: bedlib.Bed,
    plays: dict[str, str],
    live: list[str],
    row: Row,
    workers: int,
    ssh: str = "cold",
) -> SuiteRun:
    """The suite against every node as users run it (every report on), with `workers` xdist
    workers. `ssh`: "cold" (masters closed first: each probe's ssh starts one, as the bed's
    ssh_config has a ControlPath), "warm" (the masters the previous run left) or "none"
    (ControlPath=none, as for users whose ssh config sets none: no multiplexing at all)."""
    env = bed.ansible_env()
    if ssh != "warm":
        close_masters(bed)
    if ssh == "none":  # testinfra reads it over the inventory's ansible_ssh_common_args
        env["ANSIBLE_SSH_COMMON_ARGS"] = f"-F {bed.ssh_config} -o ControlPath=none"
    before = len(control_sockets(bed, "cm"))
    reports = REPORTS / f"live-n{workers}-{ssh}-{len(row.walls) + 1}"
    hosts = f"--hosts=ansible://all?ansible_inventory={bed.inventory}"
    with measured(row, bed):
        suite, probes = counted(
            bed,
            live,
            lambda: run_suite(reports, hosts, "-n", str(workers), env=env, timeout=3600),
        )
    row.probes.append(probes)
    row.masters = (before, len(control_sockets(bed, "cm")))
    row.problems += check_live(suite, plays, live) + check_probes(probes)
    # The row must have run as it says: over open masters, or with none opened.
    if ssh == "warm" and before < len(live):
        row.problems.append(f"{before} of {len(live)} ssh masters open before a 'warm' run")
    if ssh == "none" and row.masters[1]:
        row.problems.append(f"{row.masters[1]} ssh masters opened with ControlPath=none")
    return suite


def round_trips(bed: bedlib.Bed, live: list[str], row: Row, *options: str) -> None:
    """`ssh NODE true` to every live node in turn: one handshake (or mux session) each."""
    argv = ["ssh", "-F", str(bed.ssh_config), *options]
    before = len(control_sockets(bed, "cm"))

    def each() -> None:
        for name in live:
            subprocess.run([*argv, name, "true"], check=True, capture_output=True, timeout=60)

    with measured(row, bed):
        _, probes = counted(bed, live, each)
    row.probes.append(probes)
    row.masters = (before, len(control_sockets(bed, "cm")))
    row.problems += check_probes(probes)


def collect(bed: bedlib.Bed, plays: dict[str, str], live: list[str], row: Row, forks: int) -> Path:
    """playbooks/collect.yml with `forks`, from cold: one facts document per live node."""
    close_masters(bed)
    folder = REPORTS / f"collected-f{forks}-{len(row.walls) + 1}"
    args = ("-f", str(forks), "-e", f"gpuhealth_facts_dir={folder}")
    with measured(row, bed):
        run, probes = counted(
            bed, live, lambda: roles_bed.playbook(bed, "playbooks/collect.yml", *args, timeout=3600)
        )
    row.probes.append(probes)
    row.masters = (0, len(control_sockets(bed, "cp")))
    (folder.parent / f"{folder.name}.log").write_text(run.output)
    recap = run.recap
    if run.rc != 4:  # 4: some host unreachable (n4), the others collected
        row.problems.append(f"ansible-playbook exit status {run.rc}:\n{run.output[-2000:]}")
    bad = {
        h: r
        for h, r in recap.items()
        if (r["unreachable"] == 1) != (plays[h] == STOPPED) or r["failed"]
    }
    if bad or sorted(recap) != sorted(plays):
        row.problems.append(f"PLAY RECAP: {bad or sorted(recap)}")
    if sorted(p.stem for p in folder.glob("*.json")) != sorted(live):
        row.problems.append(f"documents: {sorted(p.name for p in folder.iterdir())}")
    row.problems += check_probes(probes)
    return folder


def judge(bed: bedlib.Bed, folder: Path, live: list[str], reference: SuiteRun) -> Row:
    """`pytest --facts DIR --inventory INV` on the collected documents, as the README says;
    its verdicts must be the live run's."""
    row = Row("offline judge (--facts)", len(live))
    judge_args = ("--facts", str(folder), "--inventory", str(bed.inventory))
    with measured(row, bed):
        suite = run_suite(REPORTS / "offline", *judge_args, env=bed.ansible_env(), timeout=3600)
    if suite.rc != 1:
        row.problems.append(f"exit status {suite.rc}:\n{suite.output[-2000:]}")
        return row
    row.problems += same_verdicts(suite, reference, live)
    return row


def same_verdicts(suite: SuiteRun, reference: SuiteRun, live: list[str]) -> list[str]:
    """Problems unless `suite` gave every live node the reference run's verdict."""
    found, want = suite.verdicts["nodes"], reference.verdicts["nodes"]
    differ = [h for h in live if h not in found or verdict_key(found[h]) != verdict_key(want[h])]
    return [f"verdicts differ from {reference.reports.name}'s on {differ}"] if differ else []


def print_table(rows: list[Row]) -> None:
    """The figures, one row per step (wall: the median when repeated)."""
    cols = (
        f"{'step':30} {'wall s':>7} {'range':>11} {'s/host':>6} {'sshd cmds/host':>14} "
        f"{'CPU s: ctl':>10} {'nodes':>6} {'other':>6} {'masters':>7}  check"
    )
    print(cols)
    print("-" * len(cols))
    for row in rows:
        counts = sorted({c for probes in row.probes for c in probes.values()})
        cmds = "-" if not counts else str(counts[0])
        if counts and counts[-1] != counts[0]:
            cmds += f"-{counts[-1]}"
        if row.probes:
            cmds += f" x{len(row.probes[0])}"
        spread = f"{min(row.walls):.1f}-{max(row.walls):.1f}" if len(row.walls) > 1 else ""
        print(
            f"{row.step:30} {row.wall:>7.1f} {spread:>11} {row.wall / row.hosts:>6.2f} "
            f"{cmds:>14} {row.median('ctl'):>10.1f} {row.median('nodes'):>6.1f} "
            f"{row.median('other'):>6.1f} "
            f"{'{}>{}'.format(*row.masters):>7}  "
            f"{'ok' if not row.problems else 'WRONG'}"
        )


def benchmark(args: argparse.Namespace, started: float) -> tuple[list[Row], ProbeSize]:
    """Set up the bed, run every step, hold each to its outcome; the bed is down after."""
    workers = [int(w) for w in args.workers.split(",")]
    forks = [int(f) for f in args.forks.split(",")]
    with bedlib.exclusive(), contextlib.ExitStack() as stack:
        stack.callback(_down, time.monotonic)
        bed, plays, timings = setup(args.nodes, args.install_forks)
        live = sorted(name for name, role in plays.items() if role != STOPPED)
        faulty = sorted(name for name, role in plays.items() if role not in (HEALTHY, STOPPED))
        print(
            f"nodes: {len(live)} live ({', '.join(faulty)} faulty, the rest healthy H100x8), "
            f"{len(plays) - len(live)} stopped ({STOPPED})"
        )
        cold = bedlib.rootfs_build_seconds()
        print(f"  {'rootfs cold build (recorded when built)':56} {cold or float('nan'):7.1f}s")
        for what, secs in timings.items():
            print(f"  {what:56} {secs:7.1f}s")
        print(f"  {'setup total':56} {time.monotonic() - started:7.1f}s", flush=True)
        size = probe_size(bed)

        rows = [Row(f"live -n{w}", len(plays)) for w in workers]
        reference: SuiteRun | None = None
        for _ in range(args.repeat):  # interleaved, so drift in the machine's load spreads
            for row, count in zip(rows, workers, strict=True):
                suite = live_run(bed, plays, live, row, count)
                reference = reference or suite
                row.problems += same_verdicts(suite, reference, live)
                row.say()
        # Multiplexing: the masters the last run left (ControlPersist 60s), then none at all;
        # and what one connection costs either way.
        for ssh, step in (("warm", "masters open"), ("none", "ControlPath=none")):
            rows.append(Row(f"live -n{workers[-1]}, {step}", len(plays)))
            suite = live_run(bed, plays, live, rows[-1], workers[-1], ssh)
            rows[-1].problems += same_verdicts(suite, reference or suite, live)
            rows[-1].say()
            if ssh == "warm":
                rows.append(Row("ssh true, via open masters", len(live)))
                round_trips(bed, live, rows[-1])
        rows.append(Row("ssh true, ControlPath=none", len(live)))
        round_trips(bed, live, rows[-1], "-o", "ControlPath=none")

        collects = [Row(f"collect.yml -f {f}", len(plays)) for f in forks]
        folder = None
        for _ in range(args.repeat):
            for row, count in zip(collects, forks, strict=True):
                folder = collect(bed, plays, live, row, count)
                row.say()
        rows += collects
        if folder is not None and reference is not None:
            rows.append(judge(bed, folder, live, reference))
            rows[-1].say()
    return rows, size


def _down(clock: Callable[[], float]) -> None:
    start = clock()
    bedlib.down()
    print(f"  bed down: {clock() - start:.1f}s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=32, help="bed size (default 32, max 200)")
    parser.add_argument("--workers", default="1,2,4", help="xdist workers of the live runs")
    parser.add_argument("--forks", default="5,32", help="Ansible forks of the collect.yml runs")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each live/collect step")
    parser.add_argument("--install-forks", type=int, default=32, help="forks to provision with")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/bed_scale.py needs root (the bed: namespaces, mounts)", file=sys.stderr)
        return 2
    os.chdir(REPO)  # the repository's ansible.cfg (pipelining), as roles_bed.playbook runs it
    bedlib.become_subreaper()
    shutil.rmtree(REPORTS, ignore_errors=True)
    REPORTS.mkdir(parents=True)
    started = time.monotonic()
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    print(
        f"gpuhealth on a test bed of {args.nodes} SSH nodes; {os.cpu_count()} CPUs, "
        f"{memory:.0f} GiB, Python {platform.python_version()}, Linux {platform.release()}, "
        f"{100 * busy_share():.0f}% of the CPUs busy at start",
        flush=True,
    )
    rows, size = benchmark(args, started)
    print(f"\nwhole benchmark {time.monotonic() - started:.0f}s\n")
    print_table(rows)
    print(
        "\nwall: median of --repeat runs (range: min-max). s/host: wall / hosts the step "
        f"addresses ({args.nodes}, the stopped one included; ssh true and the offline judge: "
        "the live ones). sshd cmds/host: commands each live node's sshd started during the "
        "step, the suite's one being the probe. ctl CPU: user+sys of this machine's processes "
        "the step started (ssh masters included). nodes: the bed's nodes' processes (probes, "
        "sshd). other: the rest of the machine's busy CPU time meanwhile (other jobs: noise; "
        f"{os.cpu_count()} CPUs give {os.cpu_count()} CPU s per wall s). masters: ssh control "
        "sockets open before>after the step (the suite's: the bed's cm-*; Ansible's: cp/*)."
    )
    print(
        f"probe command (the longest, {size.host}'s): {size.node} bytes as the node's "
        f"`sh -c` argument, {size.controller} as the controller's `/bin/sh -c` argument "
        f"(testinfra runs ssh through a shell), its stdin {size.stdin}; Linux "
        f"MAX_ARG_STRLEN {MAX_ARG_STRLEN} ({100 * size.controller / MAX_ARG_STRLEN:.0f}% used)"
    )
    print(f"testinfra's ssh command: {size.ssh_argv}")
    problems = [(row.step, p) for row in rows for p in row.problems]
    for step, problem in problems:
        print(f"WRONG {step}: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
