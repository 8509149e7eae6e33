"""The roles (roles/, site.yml, playbooks/): how they are written, and what they do on the bed.

Without the bed: every role variable is prefixed, defaulted, validated and documented, the
variables the roles share with the health suite have the suite's meaning and defaults, and the
driver role's IMEX domain checks and nodes_config.cfg run on localhost (they read the inventory
only).

On the bed (marked `bed`, root): site.yml brings the fleet of fleet.py up from its mirror, as
`ansible-playbook -i <inventory> site.yml -e gpu_mirror_url=<mirror>` does on an air-gapped
cluster (roles_bed.py says what the bed lacks and which variables say so):

- `--check` on a fresh node reports the changes it would make and writes nothing;
- `nvidia_driver_branch: "560"` fails before any node runs a command, naming the variable;
- the first run installs the stand-ins from the mirror, a second run changes nothing;
- one inventory variable, nvidia_driver_branch, moves both the role and the health suite;
- the GB200 tray gets IMEX, its nodes_config.cfg listing its NVLink domain's addresses;
- the health suite on the role-installed nodes reaches the verdicts test_e2e.py asserts on
  the nodes the bed helper installs;
- playbooks/collect.yml gathers one facts document per node and `pytest --facts` on them
  reaches the same verdicts as the live run.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from gpuhealth.config import expectations_from_vars, key_table, limits_model
from gpuhealth.transport import ProbeError, node_profile_keys
from selftest.facts import PROFILES
from selftest.suite import REPO, SuiteRun, run_suite

ROLES = REPO / "roles"
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if (p / "tasks" / "main.yml").is_file())
ANSIBLE_PLAYBOOK = str(Path(sys.executable).with_name("ansible-playbook"))
REPORTS = REPO / "reports" / "roles-bed"  # kept after the run
TIMINGS: dict[str, float] = {}


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _options(role: str) -> dict[str, dict[str, Any]]:
    return _yaml(ROLES / role / "meta" / "argument_specs.yml")["argument_specs"]["main"]["options"]


# ---------------------------------------------------------------- how the roles are written


def test_the_roles_are_the_components_of_a_gpu_node():
    assert ROLE_NAMES == [
        "dcgm",
        "efa",
        "gpud",
        "gpuhealth_agent",
        "nccl_tests",
        "numactl",
        "nvidia_driver",
        "nvidia_repo",
    ]


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_every_role_variable_is_prefixed_validated_and_documented(role):
    defaults = _yaml(ROLES / role / "defaults" / "main.yml") or {}
    options = _options(role)
    readme = (ROLES / role / "README.md").read_text()
    assert all(name.startswith(f"{role}_") for name in defaults), sorted(defaults)
    assert set(defaults) <= set(options), sorted(set(defaults) - set(options))
    for name, spec in options.items():
        assert spec.get("description"), f"{role}: {name} has no description"
        assert f"`{name}`" in readme, f"{role}/README.md does not document {name}"
        if "default" in spec:  # the documented default is the one the role uses
            assert defaults.get(name) == spec["default"], name
        if name.startswith(f"{role}_") and name not in defaults:
            # no default of the role's own: per OS (vars/), required, or derived from others
            assert spec.get("required") or "efault" in str(spec["description"]), name


def test_every_template_is_laid_out_like_its_target_path():
    templates = sorted(ROLES.glob("*/templates/**/*.j2"))
    assert templates
    used = "\n".join(p.read_text() for p in ROLES.glob("*/tasks/*.yml"))
    for path in templates:
        target = path.parts[path.parts.index("templates") + 1 :]
        assert target[0] in ("etc", "usr", "opt"), path
        assert f"src: {'/'.join(target)}" in used, f"{path} is not used by a task"


def test_the_driver_branch_is_the_health_suite_s_driver_gate():
    profiles = PROFILES
    default = _yaml(ROLES / "nvidia_driver" / "defaults" / "main.yml")["nvidia_driver_branch"]
    assert default == profiles.get("default").values["min_driver_version"]
    branches = _options("nvidia_driver")["nvidia_driver_branch"]["choices"]
    assert min(int(b) for b in branches) == 570  # 560 and older are refused
    expect = expectations_from_vars("n1", {"nvidia_driver_branch": "575"}, profiles)
    assert expect.overrides["min_driver_version"] == "575"


def test_the_fabric_manager_goes_where_the_profiles_require_it():
    profiles = PROFILES
    nvswitch = sorted(
        n for n in profiles.names if profiles.get(n).values["requires_fabric_manager"]
    )
    defaults = _yaml(ROLES / "nvidia_driver" / "defaults" / "main.yml")
    assert sorted(defaults["nvidia_driver_nvswitch_profiles"]) == nvswitch


def test_imex_goes_where_the_profiles_require_it():
    profiles = PROFILES
    imex = sorted(n for n in profiles.names if profiles.get(n).values["imex_required"])
    defaults = _yaml(ROLES / "nvidia_driver" / "defaults" / "main.yml")
    assert sorted(defaults["nvidia_driver_imex_profiles"]) == imex == ["gb200", "gb300"]


# Trays of three NVLink domains and one without, for the role's own IMEX domain tasks (they
# read the inventory only): rack1 is right; rack2 has a host name for an address and two trays
# on one address; rack3 is bigger than its nvidia_driver_imex_max_nodes.
IMEX_INVENTORY = """\
all:
  vars:
    ansible_connection: local
    gpu_profile: gb200
    nvidia_driver_package_scheme: branch
  hosts:
    tray2: {ansible_host: 10.0.0.2, nvlink_domain: rack1}
    tray1: {ansible_host: 10.0.0.1, nvlink_domain: rack1}
    tray3: {ansible_host: tray3.example, nvlink_domain: rack1, nvidia_driver_imex_address: 10.0.1.3,
            nvidia_driver_branch: "580"}
    b1: {ansible_host: 10.0.2.1, nvlink_domain: rack2}
    b2: {ansible_host: 10.0.2.1, nvlink_domain: rack2}
    b3: {ansible_host: b3.example, nvlink_domain: rack2}
    c1: {nvlink_domain: rack3, nvidia_driver_imex_max_nodes: 2, ansible_host: 10.0.3.1}
    c2: {nvlink_domain: rack3, nvidia_driver_imex_max_nodes: 2, ansible_host: 10.0.3.2}
    c3: {nvlink_domain: rack3, nvidia_driver_imex_max_nodes: 2, ansible_host: 10.0.3.3}
    alone: {ansible_host: 10.0.9.9}
    h100: {gpu_profile: h100-sxm}
"""
IMEX_PLAY = """\
- name: The role's IMEX domain tasks, then the file they lead to
  hosts: all
  gather_facts: false
  tasks:
    - name: What the role installs
      ansible.builtin.import_role:
        name: nvidia_driver
        tasks_from: imex_domain
      when: nvidia_driver_imex | bool
    - name: Report
      ansible.builtin.debug:
        msg:
          imex: "{{ nvidia_driver_imex | bool }}"
          packages: "{{ __nvidia_driver_packages }}"
          nodes_config: "{{ lookup('ansible.builtin.template', '%s') }}"
"""


def test_the_imex_domain_is_the_inventory_s_nvlink_domain(tmp_path):
    """The role's checks before any change, and nodes_config.cfg, on localhost (no change)."""
    (tmp_path / "hosts.yml").write_text(IMEX_INVENTORY)
    template = ROLES / "nvidia_driver" / "templates" / "etc" / "nvidia-imex" / "nodes_config.cfg.j2"
    (tmp_path / "play.yml").write_text(IMEX_PLAY % template)
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(ROLES),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default",
    }
    env["ANSIBLE_PYTHON_INTERPRETER"] = sys.executable
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", "hosts.yml", "play.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    out = proc.stdout + proc.stderr
    reports = {
        host: json.loads(found)["msg"]
        for host, found in re.findall(r"^ok: \[(\S+)\] => (\{.*?^\})$", out, re.M | re.S)
    }
    failures = dict(re.findall(r"^fatal: \[(\S+)\]: FAILED! => .*\"msg\": \"([^\"]*)\"", out, re.M))
    # rack1: one file for the three trays, by inventory name; 570 names IMEX by its branch, 580 not
    rack1 = "10.0.0.1\n10.0.0.2\n10.0.1.3\n"
    assert {h: reports[h]["nodes_config"] for h in ("tray1", "tray2", "tray3")} == dict.fromkeys(
        ("tray1", "tray2", "tray3"), rack1
    ), out[-3000:]
    assert reports["tray1"]["packages"] == [
        "nvidia-driver-570-open",
        "nvidia-imex-570",
    ]
    assert reports["tray3"]["packages"] == ["nvidia-driver-580-open", "nvidia-imex"]
    assert reports["h100"]["imex"] is False
    assert "nvidia-imex-570" not in reports["h100"]["packages"]
    assert failures["alone"] == (
        "alone needs IMEX (nvidia_driver_imex is true: gpu_profile gb200, imex_required unset) "
        "but has no nvlink_domain: set nvlink_domain (e.g. rack07) on every host of its NVLink "
        "domain (an NVL72 rack), or imex_required: false on hosts outside a multi-node NVLink "
        "domain"
    )
    rack2 = (
        "NVLink domain rack2 (3 hosts): not an IP address: b3 (b3.example); set "
        "nvidia_driver_imex_address (or ansible_host) on those hosts; hosts share an address: "
        "b1 (10.0.2.1), b2 (10.0.2.1); each host of the domain needs its own "
        "nvidia_driver_imex_address"
    )
    rack3 = (
        "NVLink domain rack3 (3 hosts): more hosts than one IMEX domain takes "
        "(nvidia_driver_imex_max_nodes: 2): c1, c2, c3; check their nvlink_domain"
    )
    assert failures == {
        "alone": failures["alone"],
        **dict.fromkeys(("b1", "b2", "b3"), rack2),
        **dict.fromkeys(("c1", "c2", "c3"), rack3),
    }


def test_shared_variables_default_to_what_the_health_suite_expects():
    profile = PROFILES.get("default").values
    nccl = _yaml(ROLES / "nccl_tests" / "defaults" / "main.yml")
    built = nccl["nccl_tests_dir"].replace(
        "{{ nccl_tests_install_dir }}", nccl["nccl_tests_install_dir"]
    )
    assert built == profile["nccl_tests_dir"]
    gpud = _yaml(ROLES / "gpud" / "defaults" / "main.yml")
    assert gpud["gpud_address"] == profile["gpud_address"]


def test_the_agent_carries_every_inventory_var_the_suite_reads():
    """node-check and serve judge a node by its /etc/gpuhealth/inventory.yml: the role's list
    of the vars it copies there must be the suite's keys (and the names it maps)."""
    listed = _yaml(ROLES / "gpuhealth_agent" / "vars" / "main.yml")["__gpuhealth_agent_host_keys"]
    keys = [key for _, key, _, _ in key_table()]
    names = ["gpu_profile", "nvidia_driver_branch", "slurm_node_name", "kubernetes_node_name"]
    assert listed == names + keys


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_role_variables_in_the_inventory_pass_the_health_suite_s_checks(role):
    """The suite refuses inventory vars one typo away from its keys; no role variable may be
    one, and a role variable that is a suite key must have a type the suite accepts."""
    samples = {"str": "x", "bool": True, "int": 1, "list": []}
    values = {
        name: spec.get("default", spec.get("choices", [samples[spec["type"]]])[0])
        for name, spec in _options(role).items()
    }
    values["gpu_profile"] = "h100-sxm"
    keys = limits_model().model_fields
    shared = {n: v for n, v in values.items() if n in keys and v is not None}
    others = {n: v for n, v in values.items() if n not in keys}
    expectations_from_vars("node", {**others, **shared}, PROFILES)


def test_playbooks_parse_with_the_example_inventories():
    for inventory in ("inventory/h100-ib", "inventory/p5-efa"):
        for playbook in ("site.yml", "playbooks/collect.yml"):
            proc = subprocess.run(
                [ANSIBLE_PLAYBOOK, "-i", inventory, playbook, "--syntax-check"],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stdout + proc.stderr


def test_collect_probes_with_the_limits_the_inventory_resolves_to():
    """playbooks/filter_plugins/gpuhealth_probe.py: the argv collect.yml runs on each node."""
    spec = importlib.util.spec_from_file_location(
        "collect_filters", REPO / "playbooks" / "filter_plugins" / "gpuhealth_probe.py"
    )
    filters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filters)
    hostvars = {
        "inventory_hostname": "node7",
        "gpu_profile": "h100-sxm",
        "gpu_count": 7,
        "nvidia_driver_branch": "575",
        "ansible_host": "10.0.0.7",
        "probe_timeout_s": 60,
        "reclaim_wait_s": 7,
    }
    argv = filters.probe_argv(hostvars, python="/usr/bin/python3")
    assert argv[:5] == ["timeout", "-k", "5", "60", "/usr/bin/python3"]
    assert len(" ".join(argv)) < 4096  # the probe itself is what collect.yml writes on stdin
    stdin = filters.probe_stdin(hostvars)
    config = json.loads(zlib.decompress(base64.b64decode(stdin)))["config"]
    assert config["deadline_s"] == 60
    expect = config["expect"]
    assert expect["reclaim_wait_s"] == 7  # a key the node reads, as the inventory sets it
    assert expect["nvidia_smi_timeout_s"] == 60  # from the profiles
    # what only the checks read (gpu_count, the driver branch, NVLink links) stays here
    assert set(expect) <= node_profile_keys()
    assert not {"gpu_count", "min_driver_version", "nvlink_links_expected"} & set(expect)
    with pytest.raises(ProbeError):
        filters.facts_document("no document here")


# ---------------------------------------------------------------- on the bed

LIVE = ("n1", "n2", "dgx-gpu3", "gb1")


def on_the_bed(test):
    """Mark a test as a bed test: root only, on the worker that holds the bed."""
    for mark in (
        pytest.mark.bed,
        pytest.mark.xdist_group("bed"),  # one bed per machine: keep these on one worker
        pytest.mark.skipif(
            os.geteuid() != 0, reason="the test bed needs root (network namespaces, mounts)"
        ),
    ):
        test = mark(test)
    return test


@dataclass
class RolesRun:
    """Everything the bed run did, in order; the tests read it."""

    bed: Any
    check: Any  # roles_bed.PlaybookRun of site.yml --check on the fresh n1
    check_writes: dict[str, Any]  # what n1 wrote meanwhile (path -> (before, after))
    bad_branch: Any  # site.yml with nvidia_driver_branch=560
    bad_branch_sessions: dict[str, int]  # commands each node ran meanwhile
    first: Any
    second: Any
    new_flags: Any  # site.yml --tags nccl_tests on n1 with one more make argument
    gpud: dict[str, str]  # node -> the ExecStart the test started GPUd with
    live: SuiteRun
    standard: SuiteRun  # --level standard on n1, n2: DCGM and nccl-tests the roles installed
    collect: Any
    offline: SuiteRun
    branch_575: Any  # site.yml --check --tags nvidia_driver with n1 on branch 575
    offline_575: SuiteRun


@pytest.fixture(scope="module")
def roles_run():
    from selftest.testbed import bedlib, fleet, roles_bed

    bedlib.become_subreaper()  # reap detached bed processes even if PID 1 does not
    bedlib.ensure_rootfs()
    shutil.rmtree(REPORTS, ignore_errors=True)
    REPORTS.mkdir(parents=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(bedlib.exclusive())
        stack.callback(_down)
        start = time.monotonic()
        bed = fleet.up(roles_bed.fleet_roles())
        TIMINGS["bed up, 5 nodes"] = time.monotonic() - start
        TIMINGS.update(roles_bed.provision(bed))
        mirror = roles_bed.mirror_args(bed)

        def site(*args: str, name: str) -> roles_bed.PlaybookRun:
            run = roles_bed.playbook(bed, "site.yml", *mirror, *args)
            (REPORTS / f"{name}.log").write_text(run.output)
            TIMINGS[name] = run.seconds
            return run

        before = roles_bed.upper_state(bed, "n1")
        check = site("--check", "--limit", "n1", name="site.yml --check, fresh n1")
        after = roles_bed.upper_state(bed, "n1")
        writes = {p: (before.get(p), after.get(p)) for p in set(before) | set(after)}
        writes = {p: pair for p, pair in writes.items() if pair[0] != pair[1]}
        (REPORTS / "check-mode-writes.json").write_text(json.dumps(writes, indent=1))

        sessions = {n: bed.sessions(n) for n in LIVE}
        bad = site("-e", "nvidia_driver_branch=560", name="site.yml, branch 560 (refused)")
        bad_sessions = {n: bed.sessions(n) - sessions[n] for n in LIVE}

        limit = ("--limit", ",".join(LIVE))  # n4 is down
        first = site(*limit, name="site.yml, first run (n1, n2, dgx-gpu3, gb1)")
        second = site(*limit, name="site.yml, second run (n1, n2, dgx-gpu3, gb1)")
        new_flags = site(
            "--limit",
            "n1",
            "--tags",
            "nccl_tests",
            "-e",
            '{"nccl_tests_make_args": ["VERBOSE=1"]}',
            name="site.yml --tags nccl_tests, new make flags (n1)",
        )

        gpud = {n: roles_bed.start_gpud(bed, n) for n in ("n1", "n2")}  # gpud_installed
        start = time.monotonic()
        inventory = f"--hosts=ansible://all?ansible_inventory={bed.inventory}"
        live = run_suite(REPORTS / "live", inventory, "-n", "3", env=bed.ansible_env())
        TIMINGS["health suite, 5 hosts, -n 3"] = time.monotonic() - start
        start = time.monotonic()
        hosts = ",".join(f"ansible://{h}?ansible_inventory={bed.inventory}" for h in ("n1", "n2"))
        level = ("--level", "standard", "-m", "dcgm or nccl or gpud", "-n", "2")
        standard = run_suite(
            REPORTS / "standard", f"--hosts={hosts}", *level, env=bed.ansible_env()
        )
        TIMINGS["health suite --level standard, n1 + n2"] = time.monotonic() - start

        facts = REPORTS / "collected"
        collect = roles_bed.playbook(
            bed, "playbooks/collect.yml", "-e", f"gpuhealth_facts_dir={facts}"
        )
        (REPORTS / "collect.log").write_text(collect.output)
        TIMINGS["playbooks/collect.yml, 5 hosts"] = collect.seconds
        start = time.monotonic()
        judge = ("--facts", str(facts), "--inventory", str(bed.inventory))
        offline = run_suite(REPORTS / "offline", *judge, env=bed.ansible_env())
        TIMINGS["pytest --facts, 3 documents"] = time.monotonic() - start

        # One variable for both: n1's inventory moves to branch 575.
        bed.set_host_vars({"n1": {"nvidia_driver_branch": "575"}})
        branch_575 = site(
            "--check", "--diff", "--limit", "n1", "--tags", "nvidia_driver", name="branch 575"
        )
        offline_575 = run_suite(REPORTS / "offline-575", *judge, env=bed.ansible_env())
        yield RolesRun(
            bed,
            check,
            writes,
            bad,
            bad_sessions,
            first,
            second,
            new_flags,
            gpud,
            live,
            standard,
            collect,
            offline,
            branch_575,
            offline_575,
        )


def _down() -> None:
    from selftest.testbed import bedlib

    start = time.monotonic()
    bedlib.down()
    TIMINGS["bed down"] = time.monotonic() - start
    print("\n-- roles on the bed: timings --")
    for what, secs in TIMINGS.items():
        print(f"  {what:52} {secs:7.2f}s")
    assert bedlib.leftovers() == []


def _on(bed, node: str, command: str) -> str:
    return bed.ssh(node, command).stdout


@on_the_bed
def test_check_mode_on_a_fresh_node_reports_changes_and_writes_nothing(roles_run):
    run = roles_run.check
    assert run.rc == 0, run.output[-3000:]
    assert run.recap["n1"]["failed"] == 0
    assert run.recap["n1"]["changed"] >= 10, run.recap  # repository, pin, packages, builds...
    mirror = roles_run.bed.mirror_url
    assert f"would install from {mirror}: nvidia-driver-570-open, " in run.output
    assert "would build nccl-tests 2.14.1" in run.output
    # no driver loaded yet: the role says the node must reboot, and does not reboot it
    assert "REBOOT REQUIRED on n1: loaded driver none (no nvidia module loaded)" in run.output
    assert "nvidia_driver_reboot_allowed is false: drain the node and reboot it." in run.output
    assert roles_run.check_writes == {}  # n1's overlay: not one file written or touched


@on_the_bed
def test_a_branch_before_570_fails_before_any_node_runs_a_command(roles_run):
    run = roles_run.bad_branch
    assert run.rc != 0
    assert "value of nvidia_driver_branch must be one of: 570, 575, 580, got: 560" in run.output
    assert {host: (c["ok"], c["failed"]) for host, c in run.recap.items()} == {
        host: (0, 1) for host in ("n1", "n2", "dgx-gpu3", "gb1", "n4")
    }
    assert roles_run.bad_branch_sessions == dict.fromkeys(LIVE, 0)  # counted by sshd


@on_the_bed
def test_site_installs_everything_from_the_mirror(roles_run):
    run, bed = roles_run.first, roles_run.bed
    assert run.rc == 0, run.output[-3000:]
    assert {h: c["failed"] + c["unreachable"] for h, c in run.recap.items()} == dict.fromkeys(
        LIVE, 0
    )
    assert all(run.changed()[h] > 0 for h in LIVE), run.recap
    installed = _on(bed, "n1", "dpkg-query -W -f '${Package} ${Version}\\n'")
    for package in (
        "nvidia-driver-570-open 570.86.15-0ubuntu1",
        "nvidia-fabricmanager-570 570.86.15-1",  # h100-sxm: an NVSwitch baseboard
        "python3-nvidia-ml-py",
        "datacenter-gpu-manager-4-cuda12 1:4.2.3-1",
        "libnccl2 2.25.1-1+cuda12.8",
        "libnccl-dev 2.25.1-1+cuda12.8",
        "numactl",
    ):
        assert package in installed
    # ... through the repository the roles defined from gpu_mirror_url: the only NVIDIA source.
    source = "nvidia-" + re.sub(r"[^A-Za-z0-9]+", "-", bed.mirror_url.split("://")[1]).strip("-")
    listed = _on(bed, "n1", f"cat /etc/apt/sources.list.d/{source}.list")
    assert listed.endswith(f"deb [trusted=yes] {bed.mirror_url} /\n"), listed
    assert "nvidia" not in _on(bed, "n1", "cat /etc/apt/sources.list")  # the OS archive only
    served = (bed.run_dir / "mirror.log").read_text()
    for node in bed.nodes[:2]:
        assert re.search(rf'{re.escape(node.address)} .*"GET /\./nvidia-driver-570-open_', served)
        assert re.search(rf'{re.escape(node.address)} .*"GET /files/gpud_v0\.5\.1_linux_', served)
    assert "Pin: version 570.*" in _on(bed, "n1", "cat /etc/apt/preferences.d/nvidia-driver.pref")
    assert "blacklist nouveau" in _on(bed, "n1", "cat /etc/modprobe.d/blacklist-nouveau.conf")
    assert "REBOOT REQUIRED" not in run.output  # the stand-in driver "loaded" at install
    # nccl-tests built where the health suite runs it, linked against the installed NCCL.
    built = _on(bed, "n1", "cat /opt/nccl-tests/build/.gpuhealth-build")
    assert built.startswith("nccl-tests 2.14.1 sha256:")
    linked = _on(bed, "n1", "ldd /opt/nccl-tests/build/all_reduce_perf")
    assert re.search(r"libnccl\.so\.2 => /\S+/libnccl\.so\.2 ", linked), linked
    # dgx-gpu3: its old driver left alone and said so; EFA (fabric efa) only there.
    assert "nvidia-driver-560-open" in _on(bed, "dgx-gpu3", "dpkg-query -W")
    assert "dgx-gpu3 runs driver 560.35.03 and the inventory expects branch 570" in run.output
    assert "EFA installer version: 1.47.0" in _on(
        bed, "dgx-gpu3", "cat /opt/amazon/efa_installed_packages"
    )
    assert bed.ssh("n1", "test -e /opt/amazon/efa_installed_packages", check=False).returncode == 1


@on_the_bed
def test_services_are_installed_and_said_to_need_systemd(roles_run):
    """No systemd on the bed: the units are there, and the roles say what they did not do."""
    run, bed = roles_run.first, roles_run.bed
    for node in ("n1", "n2"):
        for unit in ("nvidia-persistenced", "nvidia-dcgm", "gpud"):
            assert re.search(rf"{node} has no systemd .*{unit}", run.output), (node, unit)
    unit = _on(bed, "n1", "cat /etc/systemd/system/gpud.service")
    assert "ExecStart=/usr/local/bin/gpud run --listen-address=127.0.0.1:15132\n" in unit
    assert roles_run.gpud["n1"] == "/usr/local/bin/gpud run --listen-address=127.0.0.1:15132"
    dropin = "/etc/systemd/system/nvidia-persistenced.service.d/persistence-mode.conf"
    assert "ExecStart=/usr/bin/nvidia-persistenced --verbose" in _on(bed, "n1", f"cat {dropin}")


# The bed's GB200 tray (gpu_profile gb200, nvlink_domain rack1, alone in its domain).
GB200_TRAY = "gb1"


@on_the_bed
def test_site_sets_up_imex_for_the_gb200_tray_s_nvlink_domain(roles_run):
    """IMEX where the profile requires it, configured for the tray's NVLink domain from the
    inventory; nowhere else."""
    from selftest import imex_samples

    run, bed, tray = roles_run.first, roles_run.bed, GB200_TRAY
    assert run.recap[tray]["failed"] == 0, run.output[-3000:]
    assert "nvidia-imex-570 570.86.15-1" in _on(
        bed, tray, "dpkg-query -W -f '${Package} ${Version}\\n'"
    )
    for node in ("n1", "n2"):  # H100 SXM: no IMEX
        assert "nvidia-imex" not in _on(bed, node, "dpkg-query -W -f '${Package}\\n'")
    address = next(node.address for node in bed.nodes if node.name == tray)
    assert _on(bed, tray, "cat /etc/nvidia-imex/nodes_config.cfg") == f"{address}\n"
    config = _on(
        bed,
        tray,
        "grep -c '^IMEX_NODE_CONFIG_FILE=/etc/nvidia-imex/nodes_config.cfg$' "
        "/etc/nvidia-imex/config.cfg",
    )
    assert config == "1\n"  # NVIDIA's key, already right: left as it is
    assert re.search(rf"{tray} has no systemd .*nvidia-imex", run.output)
    # the tool the health suite's probe asks, from the package: the scenario's (healthy) domain
    assert _on(bed, tray, "nvidia-imex-ctl -N") == imex_samples.sample_text()


@on_the_bed
def test_a_second_run_changes_nothing(roles_run):
    run = roles_run.second
    assert run.rc == 0, run.output[-3000:]
    assert run.changed() == dict.fromkeys(LIVE, 0), run.recap
    # so nccl-tests was not rebuilt: the build task always reports a change when it runs


@on_the_bed
def test_nccl_tests_are_rebuilt_when_the_flags_change(roles_run):
    run, bed = roles_run.new_flags, roles_run.bed
    assert run.rc == 0, run.output[-3000:]
    assert run.changed() == {"n1": 2}  # make, and the record of what it built from
    assert "VERBOSE=1" in _on(bed, "n1", "cat /opt/nccl-tests/build/.gpuhealth-build")


@on_the_bed
def test_one_variable_moves_the_driver_role_and_the_health_suite(roles_run):
    """n1 set to branch 575 in the inventory: the role would pin and install 575 (absent from
    the mirror), and the health suite now fails n1's 570 driver."""
    run = roles_run.branch_575
    assert "+Pin: version 575.*" in run.output and "-Pin: version 570.*" in run.output
    assert "No package matching 'nvidia-driver-575-open'" in run.output
    outcomes, messages = roles_run.offline_575.outcomes(), roles_run.offline_575.messages()
    assert outcomes["test_driver_version[n1]"] == "failed"
    assert "driver 570.86.15 is older than the required 575" in messages["test_driver_version[n1]"]


@on_the_bed
def test_the_health_suite_reaches_the_e2e_verdicts_on_role_installed_nodes(roles_run):
    from selftest.testbed.test_e2e import expected_failures

    suite = roles_run.live
    verdicts = suite.verdicts["nodes"]
    assert {h: v["verdict"] for h, v in verdicts.items()} == {
        "n1": "PASS",
        "n2": "FAIL",
        "dgx-gpu3": "FAIL",
        "gb1": "PASS",
        "n4": "UNREACHABLE",
    }
    outcomes = suite.outcomes()
    for host in LIVE:
        tests = {n: s for n, s in outcomes.items() if n.endswith(f"[{host}]") or f"[{host}-" in n}
        facts = json.loads((suite.reports / "facts" / f"{host}.json").read_text())
        assert {n for n, s in tests.items() if s == "failed"} == expected_failures(host, facts)
        assert "error" not in tests.values()
    # the checks of what the roles installed ran and passed on n1
    for test in ("test_numactl[n1]", "test_dcgm_health[n1]", "test_gpud_health[n1]"):
        assert outcomes.get(test) == "passed", (test, suite.messages().get(test))


@on_the_bed
def test_the_load_tests_run_what_the_roles_built(roles_run):
    """--level standard: dcgmi diag of the DCGM the role installed, all_reduce_perf where the
    nccl_tests role built it (the health suite's default nccl_tests_dir); the e2e's failures."""
    from selftest.testbed.test_e2e import STANDARD_FAILURES

    suite = roles_run.standard
    outcomes = suite.outcomes()
    assert {n for n, s in outcomes.items() if s == "failed"} == STANDARD_FAILURES, suite.messages()
    assert outcomes["test_nccl_bandwidth[n1]"] == "passed"
    assert outcomes["test_dcgm_diag[n1]"] == "passed"
    nodes = suite.verdicts["nodes"]
    assert (nodes["n1"]["verdict"], nodes["n2"]["verdict"]) == ("PASS", "FAIL")
    log = (suite.reports / "evidence" / "n1" / "nccl-all_reduce_perf.log").read_text()
    assert log.startswith("$ /opt/nccl-tests/build/all_reduce_perf -b 8 ")
    assert "NCCL 2.25.1 (libnccl.so.2); replaying" in log


@on_the_bed
def test_collect_gathers_one_facts_document_per_node(roles_run):
    run = roles_run.collect
    assert run.rc == 4  # n4 is down: reported unreachable, the others collected
    assert run.recap["n4"]["unreachable"] == 1
    folder = REPORTS / "collected"
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{h}.json" for h in LIVE)
    docs = {h: json.loads((folder / f"{h}.json").read_text()) for h in LIVE}
    assert {h: d["host"]["hostname"] for h, d in docs.items()} == {h: h for h in LIVE}
    assert docs["dgx-gpu3"]["driver"]["version"] == "560.35.03"


@on_the_bed
def test_judging_the_collected_facts_gives_the_live_verdicts(roles_run):
    live, offline = roles_run.live.verdicts["nodes"], roles_run.offline.verdicts["nodes"]
    assert sorted(offline) == sorted(LIVE)

    def verdict(v: dict) -> tuple:
        failed = sorted((f["check"], str(f["gpu"])) for f in v["failed"])
        return v["verdict"], failed, v["counts"]

    assert {h: verdict(offline[h]) for h in LIVE} == {h: verdict(live[h]) for h in LIVE}


@dataclass
class LoadCollected:
    """collect.yml -e level=standard on n1 and n2, then `pytest --facts --level standard`."""

    collect: Any  # roles_bed.PlaybookRun
    docs: dict[str, dict[str, Any]]
    offline: SuiteRun


@pytest.fixture(scope="module")
def load_collected(roles_run):
    from selftest.testbed import roles_bed

    bed = roles_run.bed
    facts = REPORTS / "collected-standard"
    start = time.monotonic()
    collect = roles_bed.playbook(
        bed,
        "playbooks/collect.yml",
        "--limit",
        "n1,n2",
        "-e",
        "level=standard",
        "-e",
        f"gpuhealth_facts_dir={facts}",
    )
    (REPORTS / "collect-standard.log").write_text(collect.output)
    TIMINGS["playbooks/collect.yml -e level=standard, n1 + n2"] = time.monotonic() - start
    docs = {h: json.loads((facts / f"{h}.json").read_text()) for h in ("n1", "n2")}
    start = time.monotonic()
    judge = ("--facts", str(facts), "--inventory", str(bed.inventory), "--level", "standard")
    marks = ("-m", "dcgm or nccl or history")
    offline = run_suite(REPORTS / "offline-standard", *judge, *marks, env=bed.ansible_env())
    TIMINGS["pytest --facts --level standard, 2 documents"] = time.monotonic() - start
    return LoadCollected(collect, docs, offline)


@on_the_bed
def test_load_tests_collected_at_level_standard_are_judged_offline_as_live(
    load_collected, roles_run
):
    """The fleet recipe with load tests: collect.yml runs nccl-tests and dcgmi diag on each
    node (what the roles installed), the documents carry them, and `pytest --facts --level
    standard` gives every load test the live run's outcome (n2: slow NCCL, GPU 3 failing
    DCGM), keeps their logs as evidence and records busbw and DCGM results in the run store."""
    from selftest.test_active_runners import stored_load
    from selftest.testbed.test_e2e import STANDARD_FAILURES

    run = load_collected.collect
    assert run.rc == 0, run.output[-3000:]
    for host, doc in load_collected.docs.items():
        assert doc["load_level"] == "standard"
        assert [launch["name"] for launch in doc["nccl"]["launches"]] == ["nccl-all_reduce_perf"]
        assert doc["dcgm"]["launches"][0]["command"] == "dcgmi diag -r 2 -j", host
    offline, live = load_collected.offline, roles_run.standard
    loads = ("test_nccl_", "test_dcgm_diag")
    outcomes = {n: s for n, s in offline.outcomes().items() if n.startswith(loads)}
    assert {n for n, s in outcomes.items() if s == "failed"} == STANDARD_FAILURES
    assert outcomes == {n: s for n, s in live.outcomes().items() if n in outcomes}
    assert "busbw 365.8 GB/s" in offline.messages()["test_nccl_bandwidth[n2]"]
    nodes = offline.verdicts["nodes"]
    assert (nodes["n1"]["verdict"], nodes["n2"]["verdict"]) == ("PASS", "FAIL")
    log = (offline.reports / "evidence" / "n1" / "nccl-all_reduce_perf.log").read_text()
    assert log.startswith("$ /opt/nccl-tests/build/all_reduce_perf -b 8 ")
    assert "NCCL 2.25.1 (libnccl.so.2); replaying" in log
    busbw, failing, counted = stored_load(offline.reports / "history.sqlite")
    assert [host for host, _ in busbw] == ["n1", "n2"] and busbw[1][1] < 460  # n2 is slow
    assert failing == [("n2", 3)] and counted == ["n1", "n2"]


# ---------------------------------------------------------------- acting on the verdicts


@dataclass
class Served:
    """gpuhealth serve on n1 and n2, started from the unit the gpuhealth_agent role installed,
    asked on each node (where ft_launcher runs) by the launcher's gRPC client over the socket:
    each node's answer (success, exit_code, output, error, ms) and the socket's mode."""

    commands: dict[str, str]
    answers: dict[str, dict[str, Any]]
    mode: dict[str, str]


# The launcher's side on the node: a client from the installed gpuhealth's nvhcd stubs.
ASK = """
import json, time, grpc
from gpuhealth.integrations import nvhcd_pb2, nvhcd_pb2_grpc
start = time.perf_counter()
with grpc.insecure_channel("unix:///var/run/nvhcd.sock") as channel:
    stub = nvhcd_pb2_grpc.HealthCheckServiceStub(channel)
    reply = stub.RunHealthCheck(nvhcd_pb2.HealthCheckRequest(args=["--no-slurm"]), timeout=60)
print(json.dumps({"success": reply.success, "exit_code": reply.exit_code, "output": reply.output,
                  "error": reply.error, "ms": (time.perf_counter() - start) * 1000}))
"""


@pytest.fixture(scope="module")
def served(roles_run):
    from selftest.testbed import roles_bed

    bed = roles_run.bed
    commands = {n: roles_bed.start_unit(bed, n, "gpuhealth-serve") for n in ("n1", "n2")}
    deadline = time.monotonic() + 60
    while any(bed.ssh(n, "test -S /var/run/nvhcd.sock", check=False).returncode for n in commands):
        if time.monotonic() > deadline:
            logs = {n: _on(bed, n, "cat /var/log/gpuhealth-serve.log") for n in commands}
            pytest.fail(f"no socket within 60 s: {logs}")
        time.sleep(0.2)
    ask = f"/opt/gpuhealth/bin/python -c {shlex.quote(ASK)}"
    answers = {n: json.loads(_on(bed, n, ask)) for n in commands}
    modes = {n: _on(bed, n, "stat -L -c %a /var/run/nvhcd.sock").strip() for n in commands}
    return Served(commands, answers, modes)


@on_the_bed
def test_a_bundle_taken_on_a_bed_node_is_judged_again_here(roles_run, tmp_path):
    """`gpuhealth bundle` as the agent role installed it on n2 (fake NVML, its ECC and reset
    faults): the archive comes back and `gpuhealth triage` here gives node-check's verdict."""
    bed = roles_run.bed
    archive = "/tmp/n2-bundle.tar.gz"
    _on(
        bed,
        "n2",
        "/opt/gpuhealth/bin/gpuhealth bundle --inventory /etc/gpuhealth/inventory.yml --host n2 "
        f"--timeout 90 -o {archive}",
    )
    local = tmp_path / "n2-bundle.tar.gz"
    local.write_bytes(base64.b64decode(_on(bed, "n2", f"base64 -w0 {archive}")))
    done = subprocess.run(
        [GPUHEALTH, "triage", str(local), "--profile", "h100-sxm", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    doc = json.loads(done.stdout)
    assert (done.returncode, doc["verdict"]) == (1, "FAIL"), done.stdout[-2000:] + done.stderr
    found = {(f["check"], f["gpu"]) for f in doc["findings"] if f["status"] == "FAIL"}
    assert {("ecc_errors", 3), ("recovery_action", 5)} <= found, found
    # the two probe paths (NVML, the stand-in nvidia-smi's XML) were compared
    assert [f for f in doc["findings"] if f["check"] == "probe_paths"], doc["findings"][-3:]


@on_the_bed
def test_the_health_service_runs_from_the_agent_role_s_unit(served):
    for node, command in served.commands.items():
        assert command.startswith("/opt/gpuhealth/bin/gpuhealth serve --socket /var/run/nvhcd.sock")
        assert served.mode[node] == "666"  # the jobs' users reach it (the role's default)


@on_the_bed
def test_the_launcher_finds_n1_healthy_and_n2_unhealthy_with_its_findings(served):
    from selftest.nvrx import failed_checks, nvrx_healthy

    healthy = SimpleNamespace(**served.answers["n1"])
    assert nvrx_healthy(healthy), healthy
    assert json.loads(healthy.output)["verdict"] == "PASS"
    sick = SimpleNamespace(**served.answers["n2"])
    assert not nvrx_healthy(sick)
    assert (sick.success, sick.exit_code) == (False, 1)
    assert {("ecc_errors", 3), ("recovery_action", 5)} <= failed_checks(sick), sick.output
    # the first answers, judged on the node, well inside ft_launcher's 60 s
    assert max(a["ms"] for a in served.answers.values()) < 60_000 / 4


GPUHEALTH = str(Path(sys.executable).with_name("gpuhealth"))
SLURM_NAMES = {"n1": "n1", "n2": "n2", "dgx-gpu3": "n3", "gb1": "gb1", "n4": "n4"}  # dgx-gpu3: n3
ADMIN_REASON = "maintenance: PSU swap"
HEALTH_CHECK = "HealthCheckProgram=/usr/local/sbin/gpuhealth-slurm-healthcheck\n"


@dataclass
class SlurmRun:
    """gpuhealth against a real Slurm on the bed, step by step (sinfo after each)."""

    dry: subprocess.CompletedProcess  # act slurm on the live run's verdicts, no --apply
    before: dict[str, tuple[str, str]]
    applied: subprocess.CompletedProcess
    drained: dict[str, tuple[str, str]]
    again: subprocess.CompletedProcess  # the same --apply once more
    healed: SuiteRun  # the suite on n2 after its faults were healed
    resumed_by_act: subprocess.CompletedProcess
    resumed: dict[str, tuple[str, str]]
    # slurmd's HealthCheckProgram (the agent's wrapper of node-check --slurm --apply) on n2,
    # broken again, then healed: what sinfo showed, and after how many seconds.
    health_drained: tuple[str, str]
    health_drained_s: float
    health_resumed: tuple[str, str]
    health_resumed_s: float
    n1_meanwhile: tuple[str, str]
    node_check_log: str
    jobs: JobsRun


def _n2(bed, broken: bool) -> None:
    """n2's faults (ECC gpu3, reset gpu5, a hung storage path) back, or healed."""
    from selftest.fakenvml import DEFAULT_SCENARIO, scenario_text
    from selftest.testbed import fleet

    role = fleet.ROLES["n2"]
    text = fleet.node_scenario(role) if broken else scenario_text("healthy-h100x8")
    bed.ssh("n2", f"cat > {DEFAULT_SCENARIO}", input=text)
    fifo = fleet.STORAGE_HANG_FIFO
    fix = f"mkfifo {fifo}" if broken else f"echo 'sample shard' > {fifo}"
    bed.ssh("n2", f"rm -f {fifo} && {fix}")


@pytest.fixture(scope="module")
def slurm_run(roles_run):
    from selftest.testbed import slurmbed

    bed = roles_run.bed
    bed.set_host_vars({"dgx-gpu3": {"slurm_node_name": "n3"}})
    start = time.monotonic()
    with slurmbed.cluster(bed, SLURM_NAMES, list(LIVE)) as slurm:
        TIMINGS["Slurm up: slurmctld, munge, 3 slurmd"] = time.monotonic() - start
        slurm.run("scontrol", "update", "NodeName=n4", "State=DRAIN", f"Reason={ADMIN_REASON}")

        def act(verdicts: Path, *more: str) -> subprocess.CompletedProcess:
            argv = [GPUHEALTH, "act", "slurm", "--verdicts", str(verdicts)]
            argv += ["--inventory", str(bed.inventory), *more]
            return subprocess.run(
                argv, env=slurm.env(), capture_output=True, text=True, timeout=120
            )

        live = roles_run.live.reports / "verdicts.json"
        dry = act(live)
        before = slurm.nodes()
        applied = act(live, "--apply")
        drained = slurm.nodes()
        again = act(live, "--apply")

        _n2(bed, broken=False)
        hosts = f"--hosts=ansible://n2?ansible_inventory={bed.inventory}"
        healed = run_suite(REPORTS / "healed-n2", hosts, env=bed.ansible_env())
        resumed_by_act = act(healed.reports / "verdicts.json", "--apply")
        resumed = slurm.nodes()

        _n2(bed, broken=True)
        slurm.configure(bed, HEALTH_CHECK + "HealthCheckInterval=5\n")
        start = time.monotonic()
        health_drained = slurm.wait_for("n2", lambda s: s[1].startswith("gpuhealth:"), 90)
        health_drained_s = time.monotonic() - start
        _n2(bed, broken=False)
        start = time.monotonic()
        health_resumed = slurm.wait_for("n2", lambda s: s[0] == "idle", 90)
        health_resumed_s = time.monotonic() - start
        TIMINGS["HealthCheckProgram: n2 drained, then resumed"] = (
            health_drained_s + health_resumed_s
        )
        n1_meanwhile = slurm.nodes()["n1"]
        node_check_log = bed.ssh("n2", "cat /var/log/gpuhealth-node-check.log", check=False).stdout
        start = time.monotonic()
        busy = _jobs(bed, slurm)
        TIMINGS["Jobs: busy n1, prolog and epilog drains"] = time.monotonic() - start
        yield SlurmRun(
            dry,
            before,
            applied,
            drained,
            again,
            healed,
            resumed_by_act,
            resumed,
            health_drained,
            health_drained_s,
            health_resumed,
            health_resumed_s,
            n1_meanwhile,
            node_check_log,
            busy,
        )


# The README's slurm.conf lines: the HealthCheckProgram on every node whatever its state, the
# prolog before each job (at allocation) and the epilog after it (every 5 s here, not 300).
README_SLURM = (
    HEALTH_CHECK
    + "HealthCheckInterval=5\nHealthCheckNodeState=ANY,CYCLE\n"
    + "Prolog=/usr/local/sbin/gpuhealth-slurm-prolog\nPrologFlags=Alloc\n"
    + "Epilog=/usr/local/sbin/gpuhealth-slurm-epilog\n"
)
JOB_SECONDS = 600  # the jobs sleep; each phase ends its job itself


JOBS_SOCKET = "/run/gpuhealth-jobs.sock"  # a second serve on n1, refreshed every 2 s
ASK_AS_NOBODY = (
    "setpriv --reuid nobody --regid nogroup --clear-groups /opt/gpuhealth/bin/python -c "
    + shlex.quote(ASK.replace("/var/run/nvhcd.sock", JOBS_SOCKET))
)


@dataclass
class JobsRun:
    """Jobs on the bed under the README's Slurm config (sinfo's (state, reason) each time)."""

    busy_seen: list[tuple[str, str]]  # n1 running a job, healthy, over several intervals
    busy_job: str  # squeue's state of that job meanwhile
    busy_log: str  # n1's node-check log then
    busy_answer: dict[str, Any]  # serve on n1 (the role's unit, ttl 2 s) asked as nobody
    fault_answer: dict[str, Any]  # the same after the ECC fault
    fault_seen: tuple[str, str]  # n1, same job, ECC errors on gpu3
    fault_job: str  # the job's state once n1 is draining
    prolog_seen: tuple[str, str]  # n2 with a stray process, a job sent to it
    prolog_job: str  # that job's state and reason (requeued)
    epilog_seen: tuple[str, str]  # n1 after a job whose GPU memory stays in use
    log: str  # n1's and n2's node-check logs at the end


def _scenario(bed, node: str, name: str, pid: str | None = None, **keys: str) -> None:
    """Serve a fake-NVML scenario on a node, its compute processes owned by `pid`."""
    from selftest.fakenvml import DEFAULT_SCENARIO, scenario_text

    text = scenario_text(name)
    if pid is not None:
        text = text.replace("processes=1:", f"processes={pid}:")
    text += "".join(f"{key}={value}\n" for key, value in keys.items())
    bed.ssh(node, f"cat > {DEFAULT_SCENARIO}", input=text)


def _job(slurm, node: str) -> str:
    """Submit a job that sleeps on `node`; its id."""
    out = slurm.run(
        "sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", f"exec sleep {JOB_SECONDS}"
    )
    return out.strip().split(";")[0]


def _job_state(slurm, job: str) -> str:
    """squeue's state and reason of a job ("" once it left the queue)."""
    return slurm.run("squeue", "-h", "-j", job, "-o", "%T %r").strip()


def _wait(what, test, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        seen = what()
        if test(seen) or time.monotonic() > deadline:
            return seen
        time.sleep(0.5)


def _sleeper(bed, node: str) -> str:
    """The PID of the job's `sleep` on the node (its own PID namespace), once it runs."""
    found = _wait(
        lambda: bed.ssh(node, f"pgrep -x -f 'sleep {JOB_SECONDS}'", check=False).stdout.split(),
        bool,
        30,
    )
    assert found, f"no job process on {node}"
    return found[0]


def _jobs(bed, slurm) -> JobsRun:
    """The README's HealthCheckProgram, prolog and epilog with jobs on n1 and n2."""
    slurm.configure(bed, README_SLURM)
    # A healthy busy node: a job on n1, its process on every GPU (60 GiB, 97 % busy), over
    # several HealthCheckIntervals; then 2 uncorrectable ECC errors on gpu3 under the job.
    job = _job(slurm, "n1")
    assert _wait(lambda: _job_state(slurm, job), lambda s: s.startswith("RUNNING"), 60)
    pid = _sleeper(bed, "n1")
    _scenario(bed, "n1", "busy-h100x8", pid)
    busy_seen = []
    for _ in range(6):
        time.sleep(3)
        busy_seen.append(slurm.nodes()["n1"])
    busy_job = _job_state(slurm, job)
    busy_log = bed.ssh("n1", "cat /var/log/gpuhealth-node-check.log", check=False).stdout
    # ft_launcher's service as the role runs it (its unit's command, its socket mode), on its
    # own socket with a 2 s refresh, asked by the job's user: here nobody.
    from selftest.testbed import roles_bed

    unit = bed.ssh("n1", "cat /etc/systemd/system/gpuhealth-serve.service").stdout
    jobs_unit = re.sub(r"(?m)^(ExecStart=.*)$", rf"\1 --socket {JOBS_SOCKET} --ttl 2", unit)
    assert jobs_unit != unit
    bed.ssh("n1", "cat > /etc/systemd/system/gpuhealth-jobs.service", input=jobs_unit)
    roles_bed.start_unit(bed, "n1", "gpuhealth-jobs")

    def asked() -> dict[str, Any]:
        return json.loads(_on(bed, "n1", ASK_AS_NOBODY))

    socket_up = _wait(
        lambda: bed.ssh("n1", f"test -S {JOBS_SOCKET}", check=False).returncode == 0, bool, 60
    )
    assert socket_up, _on(bed, "n1", "cat /var/log/gpuhealth-jobs.log")
    busy_answer = asked()
    _scenario(bed, "n1", "busy-ecc-gpu3", pid)
    fault_seen = slurm.wait_for("n1", lambda s: s[1].startswith("gpuhealth:"), 60)
    fault_job = _job_state(slurm, job)
    fault_answer = _wait(asked, lambda a: not a["success"], 30)
    bed.ssh("n1", f"pkill -f -- '--socket {JOBS_SOCKET}'; rm -f {JOBS_SOCKET}", check=False)
    slurm.run("scancel", job)
    _scenario(bed, "n1", "healthy-h100x8")
    slurm.wait_for("n1", lambda s: s[0] == "idle", 90)  # an idle PASS resumes it
    # The prolog: a stray process on idle n2; the job sent there is requeued, n2 drained.
    slurm.configure(bed, README_SLURM.replace(HEALTH_CHECK, ""))
    _scenario(bed, "n2", "memory-stuck-gpu6")
    stray = _job(slurm, "n2")
    prolog_seen = slurm.wait_for("n2", lambda s: s[0].startswith("drain"), 60)
    prolog_job = _wait(lambda: _job_state(slurm, stray), lambda s: s.startswith("PENDING"), 60)
    slurm.run("scancel", stray)
    # The epilog: a job on n1 ends and 20 GiB stay in use on gpu6 with no process holding it.
    job = _job(slurm, "n1")
    assert _wait(lambda: _job_state(slurm, job), lambda s: s.startswith("RUNNING"), 60)
    _scenario(bed, "n1", "healthy-h100x8", **{"gpu.6.memory.used_mib": "20480"})
    slurm.run("scancel", job)
    epilog_seen = slurm.wait_for("n1", lambda s: s[0].startswith("drain"), 90)
    log = "".join(
        f"--- {node}\n" + bed.ssh(node, "cat /var/log/gpuhealth-node-check.log", check=False).stdout
        for node in ("n1", "n2")
    )
    REPORTS.mkdir(parents=True, exist_ok=True)
    seen = {"busy": busy_seen, "busy_job": busy_job, "fault": fault_seen, "fault_job": fault_job}
    seen.update(prolog=prolog_seen, prolog_job=prolog_job, epilog=epilog_seen)
    (REPORTS / "jobs.log").write_text(f"{seen}\n{log}")
    for node in ("n1", "n2"):  # leave both as the tests after found them
        _scenario(bed, node, "healthy-h100x8")
    slurm.configure(bed)
    for name in ("n1", "n2"):
        if slurm.nodes()[name][0].startswith("drain"):
            slurm.run("scontrol", "update", f"NodeName={name}", "State=RESUME")
    return JobsRun(
        busy_seen,
        busy_job,
        busy_log,
        busy_answer,
        fault_answer,
        fault_seen,
        fault_job,
        prolog_seen,
        prolog_job,
        epilog_seen,
        log,
    )


@on_the_bed
def test_act_slurm_prints_its_changes_and_makes_none_without_apply(slurm_run):
    run = slurm_run.dry
    assert run.returncode == 0, run.stdout + run.stderr
    assert "would run: scontrol update NodeName=n2 State=DRAIN 'Reason=gpuhealth: FAIL " in (
        run.stdout
    )
    assert "would run: scontrol update NodeName=n3 State=DRAIN" in run.stdout  # dgx-gpu3
    assert "dry run: nothing changed (--apply makes these changes)" in run.stdout
    assert f"n4: UNREACHABLE, left alone: already drained by someone else ({ADMIN_REASON})" in (
        run.stdout
    )
    before = slurm_run.before
    assert {n: before[n] for n in ("n1", "n2", "n3")} == dict.fromkeys(
        ("n1", "n2", "n3"), ("idle", "")
    )
    assert before["n4"][1] == ADMIN_REASON  # drained (and, once Slurm notices, not responding)


@on_the_bed
def test_act_slurm_drains_failed_nodes_and_leaves_an_admins_drain_alone(slurm_run):
    run, nodes = slurm_run.applied, slurm_run.drained
    assert run.returncode == 0, run.stdout + run.stderr
    assert nodes["n1"] == nodes["gb1"] == ("idle", "")
    for name in ("n2", "n3"):
        state, reason = nodes[name]
        assert state == "drained", nodes
        assert reason.startswith("gpuhealth: FAIL "), reason
        assert len(reason) <= 200
    assert "gpu3" in nodes["n2"][1] or "gpu5" in nodes["n2"][1], nodes["n2"]
    assert nodes["n4"][0].startswith("drained") and nodes["n4"][1] == ADMIN_REASON  # not ours
    assert "done: scontrol update NodeName=n2 State=DRAIN" in run.stdout
    again = slurm_run.again
    assert again.returncode == 0
    assert "0 changes" in again.stdout
    assert "n2: FAIL, already drained by gpuhealth" in again.stdout


@on_the_bed
def test_act_slurm_resumes_the_node_it_drained_once_it_passes(slurm_run):
    assert slurm_run.healed.verdicts["nodes"]["n2"]["verdict"] == "PASS", slurm_run.healed.output
    run = slurm_run.resumed_by_act
    assert run.returncode == 0, run.stdout + run.stderr
    assert "done: scontrol update NodeName=n2 State=RESUME" in run.stdout
    # idle, and "*" (not responding) until slurmctld's next ping after a RESUME
    assert slurm_run.resumed["n2"][0].rstrip("*") == "idle"
    assert slurm_run.resumed["n2"][1] == ""
    assert slurm_run.resumed["n3"][0] == "drained"  # not in that run: untouched
    assert slurm_run.resumed["n4"][1] == ADMIN_REASON


@on_the_bed
def test_the_health_check_program_drains_and_resumes_its_own_node(slurm_run):
    """slurmd runs the agent's wrapper (node-check --slurm --apply) every 5 s: n2 broken is
    drained with gpuhealth's reason, healed is resumed; n1 (healthy) stays idle."""
    state, reason = slurm_run.health_drained
    assert state.startswith("drain"), (slurm_run.health_drained, slurm_run.node_check_log)
    assert reason.startswith("gpuhealth: FAIL "), reason
    assert slurm_run.health_resumed == ("idle", ""), slurm_run.node_check_log
    assert slurm_run.n1_meanwhile == ("idle", "")
    assert "slurm: done: scontrol update NodeName=n2 State=DRAIN" in slurm_run.node_check_log
    assert "slurm: done: scontrol update NodeName=n2 State=RESUME" in slurm_run.node_check_log
    # well inside Slurm's 60 s for a HealthCheckProgram, the hung storage path included
    durations = [float(d) for d in re.findall(r", ([0-9.]+) s[,)]", slurm_run.node_check_log)]
    assert durations and max(durations) < 30, slurm_run.node_check_log


@on_the_bed
def test_a_busy_healthy_node_is_never_drained_and_a_busy_faulty_one_is(slurm_run):
    """The README's HealthCheckProgram (ANY,CYCLE, node state auto) on n1 running a job on
    every GPU: allocated and undrained over six looks; with ECC errors on gpu3 it is drained
    with gpuhealth's reason while the job keeps running."""
    jobs = slurm_run.jobs
    assert all(seen == ("allocated", "") for seen in jobs.busy_seen), (jobs.busy_seen, jobs.log)
    assert jobs.busy_job.startswith("RUNNING"), jobs.busy_job
    assert "in-use: Slurm: node n1 is ALLOCATED" in jobs.busy_log, jobs.busy_log
    _drained_for(jobs, jobs.fault_seen, "ECC")
    assert jobs.fault_seen[0] == "draining"  # the job keeps its node until it ends
    assert jobs.fault_job.startswith("RUNNING"), jobs.fault_job


def _drained_for(jobs: JobsRun, seen: tuple[str, str], why: str) -> None:
    """sinfo shows the node drained (or draining) with gpuhealth's reason, saying `why`."""
    state, reason = seen
    assert state.startswith("drain"), (seen, jobs.log)
    assert reason.startswith("gpuhealth: FAIL ") and why in reason, reason


@on_the_bed
def test_the_prolog_drains_a_node_with_stray_processes_and_requeues_the_job(slurm_run):
    jobs = slurm_run.jobs
    _drained_for(jobs, jobs.prolog_seen, "stray compute processes")
    assert jobs.prolog_job.startswith("PENDING") and "requeued" in jobs.prolog_job, jobs.prolog_job


@on_the_bed
def test_the_epilog_drains_a_node_whose_gpu_memory_is_not_freed(slurm_run):
    jobs = slurm_run.jobs
    _drained_for(jobs, jobs.epilog_seen, "still in use after waiting")


@on_the_bed
def test_the_health_service_answers_a_job_s_user_for_the_busy_node(slurm_run):
    """serve as the role installs it (mode 0666), asked by an unprivileged user while n1 runs
    a job: healthy, reached (gpuhealth's own answer, judged in use); unhealthy once gpu3 shows
    uncorrectable ECC errors under the same job."""
    from selftest.nvrx import failed_checks, nvrx_healthy, reached

    busy = SimpleNamespace(**slurm_run.jobs.busy_answer)
    assert reached(busy), busy
    assert nvrx_healthy(busy), busy
    assert json.loads(busy.output)["node_state"] == "in-use"
    fault = SimpleNamespace(**slurm_run.jobs.fault_answer)
    assert reached(fault) and not nvrx_healthy(fault), fault
    assert ("ecc_errors", 3) in failed_checks(fault), fault.output
