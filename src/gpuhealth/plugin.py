"""The pytest plugin behind the health suite (tests/, installed as `gpuhealth.suite`).

It turns `--hosts` (or `--facts DIR`) plus the inventory into per-node and per-GPU test ids,
probes each host once per run (a session-scoped fixture per host; every test of a host runs on
one xdist worker), turns check findings into pytest outcomes with Allure labels, and writes the
per-node verdicts.

Installed as a pytest plugin (entry point `gpuhealth.plugin`), it stays inert unless the run is
a gpuhealth run: the suite is collected, a gpuhealth option is given, or the ini says so.
"""

from __future__ import annotations

import _json
import fcntl
import gc
import json
import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

import pytest

from gpuhealth import registry
from gpuhealth import report as reporting
from gpuhealth.active import LEVELS, level_allows
from gpuhealth.active.collect import saved_run
from gpuhealth.active.runner import ActiveContext, Outcome, Run, run_on
from gpuhealth.allure_results import AllureResults
from gpuhealth.checks import NodeView, evaluate
from gpuhealth.config import ConfigError, Platform, ProfileSet, resolve_limits
from gpuhealth.documents import FactsError, load_facts
from gpuhealth.facts import NODE_STATES
from gpuhealth.families.gpu.scope import gpu_record, none_expected
from gpuhealth.families.history.schema import HISTORY_SECTION
from gpuhealth.history.run import (
    DEFAULT_STORE,
    POLICIES,
    History,
    measured,
    measured_load,
    store_usage_error,
)
from gpuhealth.junit_results import JUnitResults
from gpuhealth.reporter import Reporter
from gpuhealth.results import Status
from gpuhealth.shards import Shard
from gpuhealth.sinks import Record
from gpuhealth.sinks import registered as registered_sinks
from gpuhealth.targets import Target, gpu_param, live_targets, offline_targets
from gpuhealth.transport import ProbeError, run_probe

_STATE = pytest.StashKey["RunState"]()
# Options only the health suite has: giving one makes the run a gpuhealth run.
_OWN_OPTIONS = (
    "facts",
    "inventory",
    "profile",
    "profile_dir",
    "expected_gpus",
    "probe_timeout",
    "nvml_call_timeout",
    "node_state",
    "verdicts",
    "save_facts",
    "history",
    "no_history",
    "regressions",
    "prometheus_textfile_dir",
)
SUITE_DIR = Path(__file__).resolve().parent.parent.parent / "tests"
# Garbage collection in a suite process (pytest the program, or an xdist worker): pytest
# keeps every test and report to the end (~1 MB a node), and at Python's default thresholds
# (700, 10, 10) each full collection walks all of it, ~12% of a 256-node run's CPU; a young
# generation of 10,000 objects makes full collections rare (1 instead of 13 at 256 nodes)
# and costs no memory worth counting (cycles live a little longer before they are freed).
GC_THRESHOLDS = (10_000, 10, 100)
SUITE_INI = SUITE_DIR.parent / "pytest.ini"


class GpuHealthWarning(UserWarning):
    """A soft limit was crossed: the node gets WARN, the run does not fail."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuhealth")
    group.addoption("--facts", metavar="DIR", help="judge saved facts documents, no connection")
    group.addoption(
        "--inventory", metavar="PATH", help="Ansible inventory for hosts given as ssh:// etc."
    )
    group.addoption("--profile", metavar="NAME", help="profile for hosts that name none")
    group.addoption("--profile-dir", metavar="DIR", help="extra profiles (*.yml)")
    group.addoption(
        "--expected-gpus", metavar="N", type=int, help="GPUs every host must have (overrides)"
    )
    group.addoption(
        "--probe-timeout",
        metavar="S",
        type=float,
        help="per-host probe timeout (overrides probe_timeout_s, default 120)",
    )
    group.addoption(
        "--nvml-call-timeout",
        metavar="S",
        type=float,
        help="per NVML call timeout (overrides nvml_call_timeout_s, default 5)",
    )
    group.addoption(
        "--node-state",
        choices=("idle", "in-use", "auto"),
        help="judge the nodes idle (every rule; default), in-use (a job owns the GPUs: fault "
        "rules only) or auto (Slurm, else compute processes decide); overrides node_state",
    )
    group.addoption(
        "--probe-root",
        metavar="PATH",
        default="/",
        help="read the nodes' /proc, /sys and /var/log under PATH (the suite in a container "
        "with the host's filesystem mounted there, e.g. /host)",
    )
    group.addoption(
        "--verdicts", metavar="PATH", help="per-node verdict JSON (default reports/verdicts.json)"
    )
    group.addoption(
        "--save-facts", metavar="DIR", help="write each host's facts (default reports/facts)"
    )
    group.addoption(
        "--level",
        choices=LEVELS,
        default="quick",
        help="quick: passive probe only (default); standard: + DCGM diag and single-node NCCL; "
        "full: + DCGM diag level 3 and multi-node NCCL with bisection",
    )
    group.addoption(
        "--nccl-log",
        metavar="FILE",
        action="append",
        help="at --level full, judge this log of a multi-node nccl-tests run (one node group, "
        "launched by srun or mpirun across an allocation) instead of launching one; repeatable",
    )
    group.addoption(
        "--history",
        metavar="PATH|URL",
        help=f"run store: an SQLite file (default {DEFAULT_STORE}) or postgresql://...",
    )
    group.addoption(
        "--history-create",
        action="store_true",
        help="start a new run store where --history names none (else that is a usage error)",
    )
    group.addoption(
        "--history-read-only",
        action="store_true",
        help="judge against the run store but record nothing (re-judging saved facts)",
    )
    group.addoption(
        "--no-history", action="store_true", help="keep no history; regression checks skip"
    )
    group.addoption(
        "--regressions",
        choices=POLICIES,
        help="a regression against a node's own history fails the run (fail, default) or "
        "warns (warn)",
    )
    group.addoption(
        "--prometheus-textfile-dir",
        metavar="DIR",
        help="also write DIR/gpuhealth.prom (every host of the run) for node_exporter's "
        "textfile collector",
    )
    group.addoption(
        "--shard",
        metavar="K/N",
        help="judge only shard K of N of the hosts (by a hash of each name: every host is in "
        "one shard); `gpuhealth merge` makes the shards' reports one",
    )
    for sink in registered_sinks():  # an output's own option (see gpuhealth.sinks)
        if sink.option:
            group.addoption(sink.option, metavar=sink.option_metavar, help=sink.option_help)
    parser.addini("gpuhealth", "this is the gpuhealth suite (its pytest.ini)", type="bool")


# ---------------------------------------------------------------- the run's state


def safe_name(host: str) -> str:
    """A host name as a file name: no path separators, no `..`, no control characters (an
    inventory name like `../../x` must not write outside the reports folder)."""
    name = re.sub(r"[^A-Za-z0-9._@+=-]", "_", host)
    return name if name.strip(".") else f"_{name}"


@dataclass
class RunState:
    """What one gpuhealth run knows: its hosts, profiles and report folders. The public
    interface of the plugin for the load tests (gpuhealth.active) and the fleet test."""

    config: pytest.Config
    targets: dict[str, Target]
    profiles: ProfileSet
    verdicts: Path
    facts_dir: Path
    history: History = field(default_factory=lambda: History(None, Path.cwd()))
    allure: AllureResults | None = None
    junit: JUnitResults | None = None
    textfile_dir: Path | None = None  # --prometheus-textfile-dir (None on a collect-only run)
    records: dict[str, Record] = field(default_factory=dict)  # by test id; see record()
    levels: dict[Any, str | None] = field(default_factory=dict)  # test function -> its level
    _host: HostState | None = None
    book: reporting.VerdictBook = field(default_factory=reporting.VerdictBook)

    def host(self, name: str) -> HostState:
        """The host's state: probed, or its saved facts loaded, when its first test starts.
        Only the latest host is kept (the tests come grouped by host), so a fleet's facts are
        never all in memory at once."""
        if self._host is None or self._host.target.name != name:
            self._host = None
            self._host = _collect(self, self.targets[name])
        return self._host

    @property
    def keeps_measured(self) -> bool:
        """Whether the run keeps what each host measured: for the run store or the textfile."""
        return self.history.spec is not None or self.textfile_dir is not None

    @property
    def level(self) -> str:
        """The run's level (quick, standard, full)."""
        return str(self.config.option.level)

    @property
    def evidence_dir(self) -> Path:
        """reports/evidence: the raw output of every load test, per host."""
        return self.verdicts.parent / "evidence"

    def keep(self, host: str, name: str, outcome: Outcome) -> Path:
        """Write a load test's raw output to reports/evidence/<host>/<name>.log (0600)."""
        path = self.evidence_dir / safe_name(host) / f"{safe_name(name)}.log"
        reporting.write_private(path, redact(outcome.log))
        return path

    @contextmanager
    def load_lock(self, exclusive: bool) -> Iterator[None]:
        """Load tests never overlap: per-node runs share the lock, the fleet run holds it."""
        path = self.verdicts.with_name(".gpuhealth-active.lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def launch(
        self, target: Target, name: str, command: str, timeout_s: float, locked: bool = False
    ) -> Outcome:
        """Run a load test on a host (under the shared load lock, unless the caller holds the
        exclusive one: `locked`) and keep its output."""
        if locked:
            outcome = run_on(target.host, command, timeout_s)
        else:
            with self.load_lock(exclusive=False):
                outcome = run_on(target.host, command, timeout_s)
        self.keep(target.name, name, outcome)
        return outcome

    def attach(self, item: pytest.Item, name: str, body: str, kind: str) -> dict[str, str] | None:
        """Attach evidence to a test's Allure result (written now, listed when the test ends);
        the reference, to list the same file on other tests, or None without --alluredir."""
        if self.allure is None:
            return None
        ref = self.allure.attach(body, name, kind)
        record(item).attach([ref])
        return ref


def record(item: pytest.Item) -> Record:
    """What a test tells the controller's Reporter (gpuhealth.sinks.Record): host, GPU, the
    finding, attachments, what its host measured.

    It travels on the test's teardown report as `report.gpuhealth` (xdist carries report
    attributes to the controller), not as user properties: those are copied into every
    JUnit test case, which at fleet scale costs more than judging the test.
    """
    records = run_state(item.config).records
    found = records.get(item.nodeid)
    if found is None:
        found = records[item.nodeid] = Record()
    return found


class RecordCarrier:
    """Puts each test's record on its teardown report, before xdist sends the report to the
    controller or the Reporter reads it, and forgets it (pytest keeps every report and item
    to the end of the run). A plain hook: a makereport wrapper costs more per test. On an
    xdist worker the record goes as plain values (Record.wire), serialised once; in one
    process the Reporter takes the record itself."""

    def __init__(self, records: dict[str, Record], worker: bool) -> None:
        self.records = records
        self.worker = worker

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "teardown":
            found = self.records.pop(report.nodeid, None)
            if found is not None:  # an extra field: xdist carries it
                report.__dict__["gpuhealth"] = found.wire() if self.worker else found


def redact(text: str) -> str:
    """Launcher arguments may carry secrets (`-x TOKEN=...`): keep the names, hide the values."""
    return re.sub(r"(-x\s+|--export[= ])([A-Za-z_][A-Za-z0-9_]*)=\S+", r"\1\2=***", text)


def run_state(config: pytest.Config) -> RunState:
    """The state of a gpuhealth run (UsageError when this pytest run is not one)."""
    state = config.stash.get(_STATE, None)
    if state is None:
        raise pytest.UsageError("gpuhealth: the health suite runs with its pytest.ini")
    return state


# ---------------------------------------------------------------- configuration


def _is_gpuhealth_run(config: pytest.Config) -> bool:
    if config.getini("gpuhealth"):
        return True
    if any(getattr(config.option, name, None) not in (None, False) for name in _OWN_OPTIONS):
        return True
    for arg in config.invocation_params.args:
        text = str(arg)
        if text == "gpuhealth.suite" or SUITE_DIR.as_posix() in str(Path(text).resolve()):
            return True
    return False


def _restart_with_the_suite_ini(config: pytest.Config) -> None:
    """Run again with the suite's pytest.ini, or stop with a usage error that names it.

    pytest looks for its ini file above the paths on the command line, option values
    included: `pytest --facts /var/lib/facts` finds none there and would collect whatever lies
    in the current directory, without the suite's report options. From a command line the
    same command is run again with `-c` and `--rootdir` naming the suite (pytest cannot change
    its ini file once started); a programmatic pytest.main(), or a run that names another ini
    with -c, gets the error instead.
    """
    args = list(config.invocation_params.args)
    named = any(a == "-c" or a.startswith(("--config-file", "--rootdir")) for a in args)
    if _from_command_line(config) and SUITE_INI.is_file() and not named and not _is_worker(config):
        sys.stdout.flush()
        sys.stderr.flush()
        argv = ["-m", "pytest", "-c", str(SUITE_INI), "--rootdir", str(SUITE_INI.parent), *args]
        os.execv(sys.executable, [sys.executable, *argv])
    found = f"read {config.inipath}" if config.inipath else "found no ini file"
    raise pytest.UsageError(
        f"gpuhealth: pytest {found} (rootdir {config.rootpath}), not the suite's pytest.ini; "
        f"name it: pytest -c {SUITE_INI} ..."
    )


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _build_targets(config: pytest.Config, profiles: ProfileSet) -> list[Target]:
    opt = config.option
    overrides = {}
    if opt.probe_timeout is not None:
        overrides["probe_timeout_s"] = opt.probe_timeout
    if opt.nvml_call_timeout is not None:
        overrides["nvml_call_timeout_s"] = opt.nvml_call_timeout
    if opt.node_state is not None:
        overrides["node_state"] = opt.node_state
    cli = {
        "profile": opt.profile,
        "expected_gpus": opt.expected_gpus,
        "inventory": opt.inventory,
        "overrides": overrides,
    }
    if opt.profile:
        profiles.get(opt.profile)
    if opt.facts:
        if opt.hosts:
            raise ConfigError("--facts and --hosts exclude each other")
        return offline_targets(Path(opt.facts), profiles, cli)
    specs = [s.strip() for s in (opt.hosts or "local://").split(",") if s.strip()]
    connection = {
        "connection": opt.connection,
        "ssh_config": opt.ssh_config,
        "ssh_identity_file": opt.ssh_identity_file,
        # testinfra's own plugin drops --ssh-extra-args; pass it on.
        "ssh_extra_args": opt.ssh_extra_args,
        "sudo": opt.sudo,
        "sudo_user": opt.sudo_user,
        "ansible_inventory": opt.ansible_inventory,
        "force_ansible": opt.force_ansible,
    }
    return live_targets(specs, connection, profiles, cli)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not _is_gpuhealth_run(config):
        return
    if not hasattr(config.option, "hosts"):
        raise pytest.UsageError("gpuhealth needs pytest-testinfra (pip install pytest-testinfra)")
    if not config.getini("gpuhealth"):
        _restart_with_the_suite_ini(config)
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        # No test paths given: the suite, wherever pytest was started (pytest itself uses
        # `testpaths` only when started in the rootdir, else collects the current directory).
        config.args[:] = [str(SUITE_DIR)]
    try:
        extra = config.option.profile_dir
        profiles = ProfileSet(Path(extra) if extra else None)
        targets = _build_targets(config, profiles)
        if config.option.shard:
            targets = Shard.parse(config.option.shard).select(targets, lambda t: t.name)
    except ConfigError as exc:
        raise pytest.UsageError(f"gpuhealth: {exc}") from exc
    config.addinivalue_line(
        "markers", "level(name): an active check, run only at --level name or above"
    )
    for name, text in registry.markers().items():
        config.addinivalue_line("markers", f"{name}: {text}")
    here = config.invocation_params.dir
    reports = here / "reports"
    opt = config.option
    history = History(
        None if opt.no_history or opt.collectonly else (opt.history or DEFAULT_STORE),
        here,
        opt.regressions or "fail",
        read_only=opt.history_read_only,
    )
    if not _is_worker(config):
        problem = store_usage_error(history.spec, here, opt.history_create, opt.history_read_only)
        if problem:
            raise pytest.UsageError(f"gpuhealth: {problem}")
        history.store()  # the schema migrated once, before any worker reads the store
    textfile = None
    if opt.prometheus_textfile_dir and not opt.collectonly:
        textfile = here / os.path.expanduser(opt.prometheus_textfile_dir)
        if not textfile.is_dir() and not _is_worker(config):
            raise pytest.UsageError(
                f"gpuhealth: --prometheus-textfile-dir {textfile} is not a directory "
                "(node_exporter's --collector.textfile.directory)"
            )
    for log in opt.nccl_log or ():
        _must_read(here / os.path.expanduser(log), "--nccl-log")
    config.stash[_STATE] = RunState(
        config=config,
        targets={t.name: t for t in targets},
        profiles=profiles,
        verdicts=Path(config.option.verdicts or reports / "verdicts.json"),
        facts_dir=Path(config.option.save_facts or reports / "facts"),
        history=history,
        allure=_take_over_allure(config),
        junit=_take_over_junit(config),
        textfile_dir=textfile,
    )
    _collect_garbage_less(config)
    carrier = RecordCarrier(config.stash[_STATE].records, _is_worker(config))
    config.pluginmanager.register(carrier, "gpuhealth-records")
    if not _is_worker(config):
        config.pluginmanager.register(Reporter(config.stash[_STATE]), "gpuhealth-reporter")
        if config.pluginmanager.hasplugin("xdist"):
            groups = host_groups(targets)
            config.pluginmanager.register(XdistHostScheduling(groups), "gpuhealth-xdist")


def _must_read(path: Path, option: str) -> None:
    """A file the run reads at its end must be there at its start: a usage error now, not
    an error of the test that would read it after every other has run."""
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise pytest.UsageError(
            f"gpuhealth: {option} {path}: cannot read: {exc.strerror or exc}"
        ) from None


def _take_over_allure(config: pytest.Config) -> AllureResults | None:
    """The run's Allure results folder, written by gpuhealth (allure_results explains why):
    allure-pytest keeps its options (`--alluredir`, `--clean-alluredir`) but, with its report
    folder taken away before its own pytest_configure runs, registers no listener."""
    folder = getattr(config.option, "allure_report_dir", None)
    if not folder:
        return None
    config.option.allure_report_dir = None
    if config.option.collectonly:
        return None
    worker = _is_worker(config)
    clean = bool(config.option.clean_alluredir) and not worker
    path = config.invocation_params.dir / folder
    try:
        return AllureResults(path, clean, background=not worker)
    except OSError as exc:
        raise pytest.UsageError(
            f"gpuhealth: cannot write Allure results to {path}: {exc}"
        ) from None


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Every Allure file written before the process ends (a worker hands the controller
    what it could not write)."""
    state = session.config.stash.get(_STATE, None)
    if state is None:
        return
    state.history.close()
    output = getattr(session.config, "workeroutput", None)
    if state.allure is None or output is None:  # the controller's Reporter closed its own
        return
    problem = state.allure.close()
    if problem:
        output["gpuhealth_allure"] = problem


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """The run is over: what pytest kept of it (every test and report, ~1 MB a node) is left
    out of garbage collection from now on (gc.freeze), first thing: pytest's collections at
    its end (its unraisable-exception plugin's, in its own pytest_unconfigure and at its
    clean-up) and the interpreter's at exit would each walk all of it, ~10% of a 256-node run,
    for memory the process is about to give back. Only when pytest is the program (a command
    line): a program that calls pytest.main() lives on and gets its memory back as usual."""
    if config.stash.get(_STATE, None) is not None and _from_command_line(config):
        gc.freeze()


def _collect_garbage_less(config: pytest.Config) -> None:
    """GC_THRESHOLDS in a process the suite owns: pytest as the program, or an xdist worker
    (a program that calls pytest.main() keeps its own)."""
    if _from_command_line(config) or _is_worker(config):
        gc.set_threshold(*GC_THRESHOLDS)


def _from_command_line(config: pytest.Config) -> bool:
    return list(config.invocation_params.args) == sys.argv[1:]


def _take_over_junit(config: pytest.Config) -> JUnitResults | None:
    """The run's JUnit XML (`--junitxml`), streamed by gpuhealth (junit_results explains why):
    pytest's junitxml plugin, with the path taken away before its pytest_configure, stays
    off. xunit2, as the suite's pytest.ini asks."""
    path = getattr(config.option, "xmlpath", None)
    if not path:
        return None
    config.option.xmlpath = None
    if config.option.collectonly or _is_worker(config):
        return None
    where = config.invocation_params.dir / os.path.expanduser(os.path.expandvars(path))
    try:
        return JUnitResults(where, str(config.getini("junit_suite_name")))
    except OSError as exc:
        raise pytest.UsageError(f"gpuhealth: cannot write JUnit XML to {where}: {exc}") from None


# ---------------------------------------------------------------- parametrisation


def host_groups(targets: list[Target]) -> dict[str, str]:
    """Test-id parameter (`n17`, `n17-gpu3`) -> the scheduling group of its host.

    Every id is one the plugin generated, so the host is looked up, never parsed out of the
    id. Two hosts whose ids could be the same string (`a` with gpu1, and a host named
    `a-gpu1`) share a group: one worker then probes each of them once.
    """
    owners: dict[str, set[str]] = {}
    for target in targets:
        owners.setdefault(target.name, set()).add(target.name)
        for index in range(target.gpu_slots):
            owners.setdefault(gpu_param(target.name, index), set()).add(target.name)
    group = {t.name: t.name for t in targets}

    def find(name: str) -> str:
        while group[name] != name:
            name = group[name]
        return name

    for hosts in owners.values():
        first, *rest = sorted(hosts)
        for other in rest:
            group[find(other)] = find(first)
    return {param: find(sorted(hosts)[0]) for param, hosts in owners.items()}


class XdistHostScheduling:
    """Keep every test of a host on one xdist worker: one connection and one probe per host.

    (xdist's own loadgroup marks stopped taking effect with pytest 9.2, pytest-xdist#1386;
    scheduling by scope is xdist's documented extension point and does not depend on them.)
    """

    def __init__(self, groups: dict[str, str]) -> None:
        self.groups = groups

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        from xdist.scheduler import LoadScopeScheduling

        groups = self.groups

        class HostScheduling(LoadScopeScheduling):
            """xdist's scheduling by scope, a host a scope, at a flat cost per test: xdist
            finds each test of a unit it hands out by searching the whole collection, and at
            each finished test counts what a worker has pending over every unit it was ever
            given; both grow with the fleet (a 256-node fleet's 47,000 tests: 60 s of the
            controller's time, where this takes well under one)."""

            positions: dict[str, int] | None = None  # test id -> its index in the collection

            def _split_scope(self, nodeid: str) -> str:
                param = nodeid.rpartition("[")[2][:-1] if nodeid.endswith("]") else ""
                return groups.get(param, nodeid)

            def _assign_work_unit(self, node: Any) -> None:
                # Every worker collected the same tests (xdist checks it before scheduling).
                if self.positions is None:
                    self.positions = {n: i for i, n in enumerate(self.collection or ())}
                scope, unit = self.workqueue.popitem(last=False)
                self.assigned_work.setdefault(node, {})[scope] = unit
                where = self.positions
                node.send_runtest_some([where[n] for n, done in unit.items() if not done])

            def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
                nodeid = self.registered_collections[node][item_index]
                units = self.assigned_work[node]
                scope = self._split_scope(nodeid)
                units[scope][nodeid] = True
                if False not in units[scope].values():  # the host is done: nothing to count
                    del units[scope]
                self._reschedule(node)

        return HostScheduling(config, log)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`node` and `gpu` are parameters, not fixtures: one Slot per host (and GPU slot the
    host should have). The host's facts are resolved by the setup hook, which costs a dict
    lookup per test where a fixture costs pytest's fixture machinery (most of a trivial
    test's setup time, at ~135,000 tests per 1,024 nodes)."""
    state = metafunc.config.stash.get(_STATE, None)
    if state is None:
        return
    names = list(state.targets)
    if "gpu" in metafunc.fixturenames:
        pairs = [(h, i) for h in names for i in range(state.targets[h].gpu_slots)]
        slots = [Slot(h, i) for h, i in pairs]
        metafunc.parametrize("gpu", slots, ids=[gpu_param(h, i) for h, i in pairs])
    elif "node" in metafunc.fixturenames:
        metafunc.parametrize("node", [Slot(h, None) for h in names], ids=names)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run each host's tests together (so each host is probed once, then its facts freed:
    last, after any plugin that reorders tests)."""
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    order = {name: i for i, name in enumerate(state.targets)}
    items.sort(key=lambda item: order.get(getattr(_slot_of(item), "host", ""), len(order)))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Label the test with its host (and GPU) before anything can fail; skip an active
    check (marked `level`) below its level, before its host is probed; then resolve the
    test's host: probed, or its saved facts loaded, once per run. (A test that never gets
    here is placed by its id: Reporter.)"""
    state = item.config.stash.get(_STATE, None)
    if state is None:
        return
    slot = _slot_of(item)
    if slot is not None:
        found = record(item)
        found.host, found.gpu = slot.host, slot.index
    function = getattr(item, "function", None)
    if function not in state.levels:  # the same for every test of a function: look once
        marker = item.get_closest_marker("level")
        state.levels[function] = None if marker is None else str(marker.args[0])
    needed = state.levels[function]
    current = state.level
    if needed is not None and not level_allows(current, needed):
        pytest.skip(f"not run at level {current} (use --level {needed})")
    RUNNING.subject = None
    if slot is not None:
        host = state.host(slot.host)
        RUNNING.subject = _subject(item, host, slot.index)
        if not host.measured and state.keeps_measured:
            host.measured = True  # what the run store or textfile keeps, on the host's first test
            keep_measured(item, measured(host.view()))
            if state.textfile_dir is not None:
                from gpuhealth.integrations.prometheus import readings

                record(item).readings = readings(host.view())


# ---------------------------------------------------------------- fixtures


@dataclass
class HostState:
    """One host of the run as its tests see it: its facts (or why there are none) and the
    load tests already run on it, kept by RunState.host while the host's tests run."""

    target: Target
    facts: dict[str, Any] | None
    failure: ProbeError | FactsError | None
    state: RunState
    active: dict[str, Run] = field(default_factory=dict)
    evidence: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    attached: bool = False
    measured: bool = False
    _view: NodeView | None = None

    def view(self) -> NodeView:
        """The host's facts with its limits, as every check of the host sees them."""
        if self._view is None:
            facts = self.facts or {}
            # The profile the host is identified as when the inventory names none.
            platform = Platform.of(facts)
            limits = resolve_limits(self.target.expectations, self.state.profiles, platform)
            past = self.state.history.section(self.target.name, limits, facts)
            # Saved facts keep the state they were collected in, unless --node-state says.
            given = self.state.config.option.node_state
            state = given if given in NODE_STATES and self.target.facts_file else None
            self._view = NodeView(self.target.name, {**facts, HISTORY_SECTION: past}, limits, state)
        return self._view


def _collect(state: RunState, target: Target) -> HostState:
    try:
        if target.facts_file is not None:
            facts = load_facts(target.facts_file)
        else:
            limits = resolve_limits(target.expectations, state.profiles, None)
            config = {"root": state.config.option.probe_root, "expect": limits.values}
            if target.host_vars.get("slurm_node_name"):
                config["slurm_node"] = str(target.host_vars["slurm_node_name"])
            timeout = float(limits.values["probe_timeout_s"])
            facts = run_probe(target.host, config, python=target.python, timeout_s=timeout)
            path = state.facts_dir / f"{safe_name(target.name)}.json"
            reporting.write_private(path, json.dumps(facts, indent=2, sort_keys=True) + "\n")
    except (ProbeError, FactsError) as exc:
        return HostState(target, None, exc, state)
    return HostState(target, facts, None, state)


@dataclass
class Running:
    """The test this process is running, resolved: pytest runs one test at a time per
    process, and a check test's argument (a Slot) is shared by every check of its host."""

    subject: Subject | None = None


RUNNING = Running()


@dataclass(frozen=True)
class Slot:
    """What a check test is parametrized with (its `node` or `gpu` argument): a host, and a
    GPU index for per-GPU tests. judge() and with_active() take it to the test's Subject."""

    host: str
    index: int | None

    @property
    def view(self) -> NodeView:
        """The running test's facts and limits (e.g. to attach what a check will judge)."""
        return subject_of(self).view


@dataclass(frozen=True)
class Subject:
    """What a check test judges: a node, or one GPU slot of it, and the test item."""

    view: NodeView
    index: int | None
    item: pytest.Item
    host: HostState


def _subject(item: pytest.Item, host: HostState, index: int | None) -> Subject:
    if host.failure is not None:
        failure = host.failure
        unreachable = isinstance(failure, ProbeError) and failure.unreachable
        if unreachable:
            record(item).unreachable = str(failure)
        else:
            record(item).error = str(failure)
        # A fresh, short exception per test: the probe's traceback helps nobody 100 times over.
        if isinstance(failure, ProbeError):
            raise ProbeError(str(failure), failure.unreachable) from None
        raise FactsError(str(failure)) from None
    view = host.view()
    if none_expected(view):
        note = f"no NVIDIA GPU/driver on {view.host}; none expected, GPU checks skipped"
        record(item).note = note
    elif view.limits.note:  # mixed GPUs, a tie, a refused match, a named profile of other GPUs
        record(item).note = view.limits.note
    return Subject(view, index, item, host)


def subject_of(slot: Slot | Subject) -> Subject:
    """The Subject of the running test (its Slot resolved by the setup hook)."""
    if isinstance(slot, Subject):
        return slot
    found = RUNNING.subject
    if found is None or found.host.target.name != slot.host or found.index != slot.index:
        raise RuntimeError(f"{slot} is not the slot of the running test")
    return found


def _slot_of(item: pytest.Item) -> Slot | None:
    """The Slot a suite test is parametrized with, if it is one."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return None
    found = callspec.params.get("gpu", callspec.params.get("node"))
    return found if isinstance(found, Slot) else None


def with_active(slot: Slot | Subject, section: str) -> Subject:
    """The subject with its host's load test (`nccl`, `dcgm`) added to its facts: run once per
    host and session (or, on saved facts, as the node ran it: gpuhealth.active.collect), judged
    by the registered checks like any other section; its raw output is kept as evidence and
    attached to every test that judges it."""
    subject = subject_of(slot)
    host = subject.host
    state = host.state
    launched = section not in host.active
    if launched and host.target.host is None:
        saved = saved_run(subject.view, section, state.level)
        if isinstance(saved, str):
            pytest.skip(saved)
        host.active[section] = saved
        for name, outcome in saved[1]:
            state.keep(host.target.name, name, outcome)
    elif launched:
        run = registry.active_run(section)
        ctx = ActiveContext(
            view=subject.view,
            level=state.level,
            launch=lambda name, command, timeout: state.launch(host.target, name, command, timeout),
        )
        host.active[section] = run.launch(ctx)
    if launched:
        for name, outcome in host.active[section][1]:
            ref = state.attach(subject.item, f"{name}.log", redact(outcome.log), "text")
            host.evidence.setdefault(section, []).extend([ref] if ref else [])
    else:
        record(subject.item).attach(host.evidence.get(section, []))
    facts = {**subject.view.facts, section: host.active[section][0]}
    view = NodeView(subject.view.host, facts, subject.view.limits, subject.view.state)
    if launched and state.keeps_measured:
        keep_measured(subject.item, measured_load(view, section))
    return Subject(view, subject.index, subject.item, host)


def keep_measured(item: pytest.Item, found: dict[str, Any]) -> None:
    """Add what a host measured (gpuhealth.history.run.measured*) to the test's record, for
    the run store and the textfile: its rows, and its identity when the host's facts were
    read."""
    record(item).keep(found)


# The C encoder, one line per value: json.dumps with `indent` runs the pure-Python encoder,
# ~15 ms per facts document of 70 KB (a fleet's 1,024 documents: 15 s), this ~2 ms.
_ONE_LINE = _json.make_encoder(
    None, json.JSONEncoder().default, encode_basestring_ascii, None, ": ", ", ", False, False, True
)


def readable_json(value: Any) -> str:
    """JSON for people to read (the facts document in the Allure report), written mostly by
    the C encoder: an object or list that holds only scalars and empty ones takes one line
    (an ECC counter group, one NVLink counter's two reads), any other one item per line,
    indented by one space a level. Four times faster than json.dumps(indent=1) and a third
    of its lines; json.loads reads it back to the same value."""
    parts: list[str] = []
    _readable(value, "\n", parts)
    return "".join(parts)


def _readable(value: Any, newline: str, parts: list[str]) -> None:
    kind = type(value)
    if kind is dict:
        entries: Any = value.items()
        values = value.values()
    elif kind is list:
        entries = values = value
    else:
        parts.append("".join(_ONE_LINE(value, 0)))
        return
    for item in values:
        if item and (type(item) is dict or type(item) is list):
            break
    else:  # nothing nested: one line
        parts.append("".join(_ONE_LINE(value, 0)))
        return
    inner = newline + " "
    opener = ("{" if kind is dict else "[") + inner
    for entry in entries:
        parts.append(opener)
        opener = "," + inner
        if kind is dict:
            key, entry = entry
            parts.append(_key(key))
        _readable(entry, inner, parts)
    parts.append(newline + ("}" if kind is dict else "]"))


def _key(key: Any) -> str:
    """An object's key as json writes it (a number, true, false or null becomes a string)."""
    if type(key) is str:
        return encode_basestring_ascii(key) + ": "
    return "".join(_ONE_LINE({key: None}, 0))[1:-5]


def attach_json(slot: Slot | Subject, name: str, value: Any) -> None:
    """Attach structured evidence (GPUd events, DCGM incidents) to the subject's test."""
    subject = subject_of(slot)
    subject.host.state.attach(subject.item, name, json.dumps(value, indent=2), "json")


def judge(name: str, slot: Slot | Subject) -> None:
    """Run check `name` on a node or GPU and turn its finding into a pytest outcome."""
    subject = subject_of(slot)
    view, index, item = subject.view, subject.index, subject.item
    chk = registry.check(name)
    if not subject.host.attached:  # the facts document, once per host (in its first test)
        subject.host.attached = True
        shown = {k: v for k, v in view.facts.items() if k != HISTORY_SECTION}  # facts, not the past
        facts = readable_json(shown)  # read by people in the report
        subject.host.state.attach(item, f"facts {view.host}.json", facts, "json")
    finding = evaluate(chk, view, index)
    result = finding.result
    found = record(item)
    found.check, found.status, found.message = finding.check, result.status.value, result.message
    found.label, found.action, found.advice = finding.label, result.action.value, result.advice
    found.profile = view.limits.name
    found.node_state, found.node_state_source = view.node_state, view.node_state_source
    if result.details:
        found.details = list(result.details)
    if index is not None:
        gpu = gpu_record(view.facts, index) or {}
        if gpu.get("uuid"):
            found.uuid = str(gpu["uuid"])
        if gpu.get("serial"):
            found.serial = str(gpu["serial"])
    if result.status is Status.FAIL:
        pytest.fail(finding.text, pytrace=False)
    if result.status is Status.SKIP:
        pytest.skip(finding.text)
    if result.status is Status.WARN:
        warnings.warn(GpuHealthWarning(finding.text), stacklevel=2)
