"""The pytest plugin behind the health suite in tests/.

It turns `--hosts` (or `--facts DIR`) plus the inventory into per-node and per-GPU test ids,
probes each host once per run (tests of one host share an xdist group, hence one worker), turns
check results into pytest outcomes with Allure labels, and writes the per-node verdicts.
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import allure
import pytest

from gpuhealth import checks
from gpuhealth import report as reporting
from gpuhealth.active import LEVELS, level_allows
from gpuhealth.config import ConfigError, ProfileSet, resolve_limits
from gpuhealth.targets import FactsFileError, Target, live_targets, load_facts, offline_targets
from gpuhealth.transport import ProbeError, run_probe

_KEY = pytest.StashKey[dict[str, Any]]()


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
        "--probe-timeout", metavar="S", type=float, default=120.0, help="per-host probe timeout"
    )
    group.addoption(
        "--nvml-call-timeout", metavar="S", type=float, default=5.0, help="per NVML call timeout"
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


def _build_targets(config: pytest.Config, profiles: ProfileSet) -> list[Target]:
    opt = config.option
    cli = {"profile": opt.profile, "expected_gpus": opt.expected_gpus, "inventory": opt.inventory}
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
    if not hasattr(config.option, "hosts"):
        raise pytest.UsageError("gpuhealth needs pytest-testinfra (pip install pytest-testinfra)")
    try:
        extra = config.option.profile_dir
        profiles = ProfileSet(Path(extra) if extra else None)
        targets = _build_targets(config, profiles)
    except ConfigError as exc:
        raise pytest.UsageError(f"gpuhealth: {exc}") from exc
    for marker in (
        "level(name): an active check, run only at --level name or above",
        "nccl: NCCL bandwidth checks (nccl-tests)",
        "dcgm: DCGM diagnostic and health checks",
        "gpud: GPUd health checks",
    ):
        config.addinivalue_line("markers", marker)
    root = config.rootpath
    config.stash[_KEY] = {
        "targets": {t.name: t for t in targets},
        "profiles": profiles,
        "facts": {},
        "book": reporting.VerdictBook(),
        "verdicts": Path(config.option.verdicts or root / "reports" / "verdicts.json"),
        "save_facts": Path(config.option.save_facts or root / "reports" / "facts"),
    }
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Reporter(config), "gpuhealth-reporter")
        if config.pluginmanager.hasplugin("xdist"):
            config.pluginmanager.register(XdistHostScheduling(), "gpuhealth-xdist")


def host_of(nodeid: str) -> str:
    """The host a test id belongs to: `test_x[n17-gpu3]` and `test_y[n17]` give `n17`."""
    params = nodeid.rpartition("[")[2].rstrip("]")
    match = re.fullmatch(r"(.+)-gpu\d+", params)
    return match.group(1) if match else params


class XdistHostScheduling:
    """Keep every test of a host on one xdist worker: one connection and one probe per host.

    (xdist's own loadgroup marks stopped taking effect with pytest 9.2, pytest-xdist#1386;
    scheduling by scope is xdist's documented extension point and does not depend on them.)
    """

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Any) -> Any:
        from xdist.scheduler import LoadScopeScheduling

        class HostScheduling(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                return host_of(nodeid)

        return HostScheduling(config, log)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    state = metafunc.config.stash[_KEY]
    targets: dict[str, Target] = state["targets"]
    if "gpu" in metafunc.fixturenames:
        params = [
            pytest.param((t.name, i), id=f"{t.name}-gpu{i}", marks=pytest.mark.xdist_group(t.name))
            for t in targets.values()
            for i in range(t.gpu_slots)
        ]
        metafunc.parametrize("gpu", params, indirect=True)
    elif "node" in metafunc.fixturenames:
        params = [pytest.param(t.name, id=t.name) for t in targets.values()]
        metafunc.parametrize("node", params, indirect=True)


def _facts_for(config: pytest.Config, item: pytest.Item, name: str) -> dict[str, Any]:
    """The host's facts document, probed (or loaded) at most once per process."""
    state = config.stash[_KEY]
    cache: dict[str, Any] = state["facts"]
    if name not in cache:
        target: Target = state["targets"][name]
        try:
            if target.facts_file is not None:
                cache[name] = load_facts(target.facts_file)
            else:
                expect = resolve_limits(target.expectations, state["profiles"], None)
                cache[name] = run_probe(
                    target.host,
                    {
                        "nvml_call_timeout_s": config.option.nvml_call_timeout,
                        "root": config.option.probe_root,
                        "expect": expect.limits,
                    },
                    python=target.python,
                    timeout_s=config.option.probe_timeout,
                )
                _save_facts(state["save_facts"], name, cache[name])
            allure.attach(
                json.dumps(cache[name], indent=2),
                name=f"facts {name}.json",
                attachment_type=allure.attachment_type.JSON,
            )
        except (ProbeError, FactsFileError) as exc:
            cache[name] = exc
    facts = cache[name]
    if isinstance(facts, Exception):
        unreachable = isinstance(facts, ProbeError) and facts.unreachable
        item.user_properties.append(
            ("gpuhealth.unreachable" if unreachable else "gpuhealth.error", str(facts))
        )
        # A fresh, short exception per test: the probe's traceback helps nobody 100 times over.
        if isinstance(facts, ProbeError):
            raise ProbeError(str(facts), facts.unreachable) from None
        raise FactsFileError(str(facts)) from None
    return facts


def _save_facts(folder: Path, name: str, facts: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(facts, indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class Subject:
    """What a check test judges: a node, or one GPU slot of it, and the test item."""

    view: checks.NodeView
    index: int | None
    item: pytest.Item


def _view(request: pytest.FixtureRequest, name: str) -> checks.NodeView:
    state = request.config.stash[_KEY]
    facts = _facts_for(request.config, request.node, name)
    target: Target = state["targets"][name]
    first_name = next((g.get("name") for g in facts.get("gpus") or [] if g.get("name")), None)
    limits = resolve_limits(target.expectations, state["profiles"], first_name)
    view = checks.NodeView(name, facts, limits)
    if view.no_nvidia and not view.expected_gpus:
        request.node.user_properties.append(
            ("gpuhealth.note", f"no NVIDIA GPU/driver on {name}; none expected, GPU checks skipped")
        )
    return view


@pytest.fixture
def node(request: pytest.FixtureRequest) -> Subject:
    """The node under test: its facts and resolved limits."""
    return Subject(_view(request, request.param), None, request.node)


@pytest.fixture
def gpu(request: pytest.FixtureRequest) -> Subject:
    """One expected GPU slot of a node."""
    name, index = request.param
    return Subject(_view(request, name), index, request.node)


@pytest.fixture(autouse=True)
def _gpuhealth_labels(request: pytest.FixtureRequest) -> None:
    """Label every test with its host (and GPU) before anything can fail."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is None:
        return
    if "gpu" in callspec.params:
        name, index = callspec.params["gpu"]
        request.node.user_properties.append(("gpuhealth.gpu", index))
        allure.dynamic.label("gpu", str(index))
        allure.dynamic.sub_suite(f"gpu{index}")
    elif "node" in callspec.params:
        name = callspec.params["node"]
    else:
        return
    request.node.user_properties.append(("gpuhealth.host", name))
    allure.dynamic.label("host", name)
    allure.dynamic.parent_suite(name)
    # Group by family even when the test skips before judging (load tests below their level).
    chk = checks.REGISTRY.get(request.node.originalname.removeprefix("test_"))
    if chk is not None:
        allure.dynamic.suite(chk.family)


@pytest.fixture(autouse=True)
def _gpuhealth_level(request: pytest.FixtureRequest, _gpuhealth_labels: None) -> None:
    """Skip an active check (marked `level`) below its level, before its host is probed."""
    marker = request.node.get_closest_marker("level")
    current = request.config.option.level
    if marker is not None and not level_allows(current, marker.args[0]):
        pytest.skip(f"not run at level {current} (use --level {marker.args[0]})")


def judge(name: str, subject: Subject) -> None:
    """Run check `name` on a node or GPU and turn its Result into a pytest outcome."""
    view, index = subject.view, subject.index
    chk = checks.REGISTRY[name]
    result = checks.evaluate(name, view, index)
    allure.dynamic.suite(chk.family)
    allure.dynamic.label("check", name)
    allure.dynamic.severity(getattr(allure.severity_level, chk.severity.upper()))
    allure.dynamic.label("profile", view.limits.name)
    if index is not None:
        record = view.gpu(index) or {}
        for key in ("uuid", "serial"):
            if record.get(key):
                allure.dynamic.label(key, str(record[key]))
    subject.item.user_properties.extend(
        [
            ("gpuhealth.check", name),
            ("gpuhealth.status", result.status),
            ("gpuhealth.message", result.message),
            ("gpuhealth.action", result.action or ""),
        ]
    )
    if result.status == checks.FAIL:
        pytest.fail(result.message, pytrace=False)
    if result.status == checks.SKIP:
        pytest.skip(result.message)
    if result.status == checks.WARN:
        warnings.warn(GpuHealthWarning(result.message), stacklevel=2)


class Reporter:
    """Controller-side collector of outcomes; writes verdicts even when the run is cut short."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.state = config.stash[_KEY]
        self.book: reporting.VerdictBook = self.state["book"]
        self.verdicts: list[reporting.NodeVerdict] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = {k: v for k, v in report.user_properties if k.startswith("gpuhealth.")}
        if report.when == "call" and "gpuhealth.fleet" in props:
            self._fleet(json.loads(props["gpuhealth.fleet"]))
        host = props.get("gpuhealth.host")
        if host is None:
            return
        self.book.node(host)
        if "gpuhealth.note" in props:
            self.book.note(host, props["gpuhealth.note"])
        check = props.get("gpuhealth.check") or report.nodeid.split("::")[-1].split("[")[0]
        gpu = props.get("gpuhealth.gpu")
        if "gpuhealth.unreachable" in props:
            self.book.unreachable(host, props["gpuhealth.unreachable"])
            return
        if report.failed and "gpuhealth.status" not in props:
            message = props.get("gpuhealth.error") or _first_line(report)
            self.book.error(host, check, gpu, message)
            return
        if report.when == "setup" and report.skipped:  # e.g. a load test below its level
            self.book.add(reporting.Finding(check, "SKIP", host, gpu, _first_line(report)))
            return
        if report.when == "call" and "gpuhealth.status" in props:
            self.book.add(
                reporting.Finding(
                    check=check,
                    status=props["gpuhealth.status"],
                    host=host,
                    gpu=gpu,
                    message=props.get("gpuhealth.message", ""),
                    action=props.get("gpuhealth.action") or None,
                )
            )

    def _fleet(self, findings: list[dict[str, Any]]) -> None:
        """A test of the whole host set (multi-node NCCL) gives each node its own part."""
        for entry in findings:
            if entry["status"] == "NOTE":
                self.book.note(entry["host"], entry["message"])
                continue
            self.book.add(
                reporting.Finding(
                    entry["check"],
                    entry["status"],
                    entry["host"],
                    None,
                    entry["message"],
                    entry["action"],
                )
            )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        for name in self.state["targets"]:
            self.book.node(name)
        self.verdicts = self.book.finish()
        reporting.write_json(
            self.verdicts,
            self.state["verdicts"],
            {"hosts": sorted(self.state["targets"]), "source": "pytest"},
        )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        terminalreporter.section("gpuhealth verdicts")
        for line in reporting.table(self.verdicts, terminalreporter._tw.fullwidth):
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"verdicts written to {self.state['verdicts']}")


def _first_line(report: pytest.TestReport) -> str:
    text = str(report.longrepr or "").strip().splitlines()
    return text[-1][:500] if text else "test error"
