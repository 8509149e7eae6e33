"""Which hosts a run checks, and what the inventory expects of each.

Everything here happens before collection, from the command line and the inventory only: the
expected topology must never come from probing, or a missing GPU would shorten the test list.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuhealth.config import ConfigError, Expectations, ProfileSet, expectations_from_vars
from gpuhealth.families.gpu.scope import gpu_slots


@dataclass
class Target:
    """One host of the run: its test id, how to reach it (or its saved facts), what to expect."""

    name: str
    expectations: Expectations
    host: Any = None
    facts_file: Path | None = None
    python: str = "python3"
    host_vars: dict[str, Any] = field(default_factory=dict)

    profile_gpu_count: int | None = None

    @property
    def gpu_slots(self) -> int:
        """How many per-GPU test ids this host gets: the inventory's count, else its named
        profile's, else a fixed number of slots (never what the node happens to show)."""
        expected = self.expectations.gpu_count
        return gpu_slots(expected if expected is not None else self.profile_gpu_count)


def _interpreter(host_vars: dict[str, Any], local: bool) -> str:
    configured = host_vars.get("gpuhealth_python") or host_vars.get("ansible_python_interpreter")
    if configured and not str(configured).startswith("auto"):
        return str(configured)
    # On this machine the controller's own interpreter is the one with nvidia-ml-py.
    return sys.executable if local else "python3"


def _target(
    name: str,
    host_vars: dict[str, Any],
    profiles: ProfileSet,
    cli: dict[str, Any],
    **where: Any,
) -> Target:
    """A host with its validated expectations; `where` says how to reach it (or its facts)."""
    merged = dict(host_vars)
    if cli.get("profile") and "gpu_profile" not in merged:
        merged["gpu_profile"] = cli["profile"]
    if cli.get("expected_gpus") is not None:
        merged["gpu_count"] = cli["expected_gpus"]
    merged.update(cli.get("overrides") or {})
    expectations = expectations_from_vars(name, merged, profiles)
    profile_count = None
    if expectations.profile_name is not None:
        profile_count = profiles.get(expectations.profile_name).values["gpu_count"]
    return Target(
        name=name,
        expectations=expectations,
        profile_gpu_count=profile_count,
        host_vars=host_vars,
        **where,
    )


def ensure_ansible_on_path() -> None:
    """testinfra runs `ansible-inventory` by name: make the one next to this Python findable
    when the virtualenv was not activated (`.venv/bin/pytest ...`)."""
    if shutil.which("ansible-inventory") is None:
        here = str(Path(sys.executable).parent)
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")


def _inventory_vars(inventory: str | None) -> Any:
    if not inventory:
        return None
    from testinfra.utils.ansible_runner import AnsibleRunner

    if not Path(inventory).exists():
        raise ConfigError(f"inventory {inventory}: no such file or directory")
    ensure_ansible_on_path()
    runner = AnsibleRunner.get_runner(inventory)
    try:
        runner.get_hosts("all")
    except (AssertionError, RuntimeError) as exc:  # testinfra: "No inventory was parsed"
        raise ConfigError(f"inventory {inventory}: ansible-inventory failed: {exc}") from exc
    return runner


def live_targets(
    specs: list[str], connection_kwargs: dict[str, Any], profiles: ProfileSet, cli: dict[str, Any]
) -> list[Target]:
    """Targets for `--hosts` (testinfra syntax), with inventory vars where there are any."""
    import testinfra

    runner = _inventory_vars(cli.get("inventory"))
    ensure_ansible_on_path()
    try:
        hosts = testinfra.get_hosts(specs, **connection_kwargs)
    except Exception as exc:
        raise ConfigError(f"--hosts {','.join(specs)}: {exc}") from exc
    targets = []
    for host in hosts:
        backend = host.backend
        local = backend.get_connection_type() == "local"
        name = socket.gethostname() if local else backend.get_hostname()
        if backend.get_connection_type() == "ansible":
            host_vars = backend.get_variables()
        elif runner is not None and name in runner.get_hosts("all"):
            host_vars = runner.get_variables(name)
        else:
            host_vars = {}
        targets.append(
            _target(
                name, host_vars, profiles, cli, host=host, python=_interpreter(host_vars, local)
            )
        )
    names = [t.name for t in targets]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"--hosts names the same host twice: {', '.join(duplicates)}")
    return sorted(targets, key=lambda t: t.name)


def offline_targets(folder: Path, profiles: ProfileSet, cli: dict[str, Any]) -> list[Target]:
    """Targets for `--facts DIR`: one per saved facts document, named after the file."""
    if not folder.is_dir():
        raise ConfigError(f"--facts {folder}: not a directory")
    files = sorted(folder.glob("*.json"))
    if not files:
        raise ConfigError(f"--facts {folder}: no *.json facts documents in it")
    found = host_vars_of(cli.get("inventory"), [path.stem for path in files])
    return [
        _target(path.stem, found.get(path.stem, {}), profiles, cli, facts_file=path)
        for path in files
    ]


def host_vars_of(inventory: str | None, hosts: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The inventory vars of each of `hosts` the inventory lists (none without an inventory)."""
    runner = _inventory_vars(inventory)
    if runner is None:
        return {}
    known = set(runner.get_hosts("all"))
    return {h: runner.get_variables(h) for h in hosts if h in known}


def inventory_target(name: str, profiles: ProfileSet, cli: dict[str, Any]) -> Target:
    """The machine this runs on as the inventory (if any) describes it: `node-check` and
    `serve` judge their own node by the same vars the suite would. A host the given inventory
    does not list (by its name or its short name) is an error, never "no expectations"."""
    runner = _inventory_vars(cli.get("inventory"))
    host_vars: dict[str, Any] = {}
    if runner is not None:
        known = set(runner.get_hosts("all"))
        found = next((n for n in (name, name.split(".")[0]) if n in known), None)
        if found is None:
            raise ConfigError(
                f"inventory {cli['inventory']} does not list this host ({name}); "
                "pass --host NAME as the inventory names it"
            )
        name, host_vars = found, runner.get_variables(found)
    return _target(name, host_vars, profiles, cli, python=_interpreter(host_vars, True))


def gpu_param(host: str, index: int) -> str:
    """The test-id parameter of a host's GPU slot: `node17-gpu3` (a node test's is the host)."""
    return f"{host}-gpu{index}"


def slot_params(targets: Iterable[Target]) -> dict[str, tuple[str, int | None]]:
    """Test-id parameter -> (host, GPU index or None) for every slot of the run: where a test
    that never reported its own record (its worker crashed, the run ended first) belongs."""
    found: dict[str, tuple[str, int | None]] = {}
    for target in targets:
        found.setdefault(target.name, (target.name, None))
        for index in range(target.gpu_slots):
            found.setdefault(gpu_param(target.name, index), (target.name, index))
    return found
