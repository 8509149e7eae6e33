"""The health suite as users run it (pytest + the gpuhealth plugin), in subprocesses.

Offline runs (`--facts`) on facts documents made from the real H100 sample exercise the
parametrisation, outcomes, verdicts and reports without any connection.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhealth import registry
from gpuhealth.config import Expectations
from gpuhealth.plugin import host_groups, safe_name
from gpuhealth.targets import Target
from selftest.facts import healthy_h100, write_facts
from selftest.suite import REPO, run_suite

INVENTORY = """\
all:
  children:
    gpu_nodes:
      vars:
        gpu_profile: h100-sxm
      hosts:
        n1: {}
        n2: {}
        n3: {}
"""


def fleet(tmp_path: Path) -> tuple[Path, Path]:
    """Three H100 nodes: n1 healthy, n2 with ECC errors on gpu3, n3 with gpu7 gone."""
    n2 = healthy_h100()
    n2["gpus"][3]["ecc"]["volatile"]["uncorrected"] = 4
    n3 = healthy_h100()
    del n3["gpus"][7]
    facts = write_facts(tmp_path / "facts", n1=healthy_h100(), n2=n2, n3=n3)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    return facts, inventory


GPU_MODULES = {
    "gpuhealth.families.gpu.checks",
    "gpuhealth.families.kernel.checks",
    "gpuhealth.families.reclaim.checks",
}


def check_module(test_id: str) -> str | None:
    """The module of the check a test id judges (test_<check>[...]), if it is one."""
    chk = registry.checks().get(test_id.split("[")[0].removeprefix("test_"))
    return chk.fn.__module__ if chk else None


def failed(run) -> set[str]:
    return {name for name, status in run.outcomes().items() if status == "failed"}


@pytest.mark.suite
def test_offline_fleet_fails_exactly_the_faulty_tests(tmp_path):
    facts, inventory = fleet(tmp_path)
    run = run_suite(tmp_path / "r", "--facts", str(facts), "--inventory", str(inventory))
    assert run.rc == 1, run.output
    quick_gpu_checks = [n for n in registry.names("gpu") if registry.checks()[n].level == "quick"]
    gpu7 = {f"test_{name}[n3-gpu7]" for name in quick_gpu_checks}
    # A missing GPU also leaves the node's GPUs unevenly spread over its NUMA nodes.
    assert (
        failed(run)
        == {"test_ecc_errors[n2-gpu3]", "test_gpu_count[n3]", "test_numa_topology[n3]"} | gpu7
    )
    outcomes = run.outcomes()
    fleet_tests = 1  # test_nccl_multinode[fleet]
    assert (
        len(outcomes)
        == 3 * len(registry.names("node")) + 3 * 8 * len(registry.names("gpu")) + fleet_tests
    )
    assert outcomes["test_recovery_action[n1-gpu0]"] == "passed"
    assert outcomes["test_retired_pages[n1-gpu0]"] == "skipped"
    verdicts = run.verdicts["nodes"]
    assert verdicts["n1"]["verdict"] == "PASS"
    assert verdicts["n2"]["verdict"] == "FAIL"
    assert "volatile uncorrected ECC errors 4 > 0" in verdicts["n2"]["reasons"][0]
    assert verdicts["n3"]["verdict"] == "FAIL"
    assert any("expected 8 GPUs, found 7" in r for r in verdicts["n3"]["reasons"])
    assert run.verdicts["overall"] == "FAIL"
    assert "n2    FAIL" in run.output


@pytest.mark.suite
def test_xdist_gives_the_same_outcomes(tmp_path):
    facts, inventory = fleet(tmp_path)
    serial = run_suite(tmp_path / "a", "--facts", str(facts), "--inventory", str(inventory))
    parallel = run_suite(
        tmp_path / "b", "--facts", str(facts), "--inventory", str(inventory), "-n", "2"
    )
    assert parallel.outcomes() == serial.outcomes()
    assert parallel.verdicts["nodes"] == serial.verdicts["nodes"]

    def allure(run):  # name -> status, labels and attachment names (written by the workers)
        found = {}
        for path in (run.reports / "allure-results").glob("*-result.json"):
            doc = json.loads(path.read_text())
            names = sorted(a["name"] for a in doc.get("attachments", []))
            found[doc["name"]] = (doc["status"], sorted(map(str, doc["labels"])), names)
            assert all((path.parent / a["source"]).is_file() for a in doc.get("attachments", []))
        return found

    found = allure(serial)
    assert len(found) == len(serial.outcomes())  # one result per test, not two empty sets
    assert allure(parallel) == found


@pytest.mark.suite
def test_soft_limit_gives_warn_without_failing_the_run(tmp_path):
    warm = healthy_h100()
    warm["gpus"][2]["temperature_c"] = 78
    facts = write_facts(tmp_path / "facts", n1=warm)
    run = run_suite(tmp_path / "r", "--facts", str(facts), "--profile", "h100-sxm")
    assert run.rc == 0, run.output
    node = run.verdicts["nodes"]["n1"]
    assert node["verdict"] == "WARN"
    assert "n1 gpu2" in node["reasons"][0] and ">= warning level 75 C" in node["reasons"][0]


@pytest.mark.suite
def test_broken_facts_file_errors_that_host_only(tmp_path):
    facts = write_facts(tmp_path / "facts", n1=healthy_h100())
    (facts / "n2.json").write_text("{not json")
    run = run_suite(tmp_path / "r", "--facts", str(facts), "--profile", "h100-sxm")
    assert run.rc == 1
    outcomes = run.outcomes()
    assert outcomes["test_driver_version[n2]"] == "error"
    assert outcomes["test_driver_version[n1]"] == "passed"
    n2 = run.verdicts["nodes"]["n2"]
    assert n2["verdict"] == "FAIL" and "n2.json: not JSON (line 1" in n2["reasons"][0]


@pytest.mark.suite
def test_a_value_no_report_can_store_fails_its_node_and_every_report_is_written(tmp_path):
    """Issue 24: a 2**64 driver version made the run store refuse the run at session end, and
    no verdicts.json was written. Now the document is refused at load: its node fails with
    a clear error, the others are judged and kept, every report is written."""
    bad = healthy_h100()
    bad["driver"]["version"] = 2**64
    facts = write_facts(tmp_path / "facts", n1=healthy_h100(), n2=bad, n3=healthy_h100())
    store = tmp_path / "r" / "history.sqlite"
    (tmp_path / "prom").mkdir()
    run = run_suite(
        tmp_path / "r",
        "--facts",
        str(facts),
        "--profile",
        "h100-sxm",
        f"--history={store}",
        "--history-create",
        f"--prometheus-textfile-dir={tmp_path / 'prom'}",
    )
    assert run.rc == 1, run.output
    nodes = run.verdicts["nodes"]
    assert sorted(nodes) == ["n1", "n2", "n3"]
    assert (nodes["n1"]["verdict"], nodes["n3"]["verdict"]) == ("PASS", "PASS")
    assert nodes["n2"]["verdict"] == "FAIL" and nodes["n2"]["actions"] == ["RERUN"]
    assert "n2.json: driver.version: 18446744073709551616" in nodes["n2"]["reasons"][0]
    assert run.verdicts["history"]["run"] is not None, run.output
    assert run.outcomes()["test_driver_version[n2]"] == "error"
    assert any((tmp_path / "r" / "allure-results").glob("*-result.json"))
    assert 'host="n2"' in (tmp_path / "prom" / "gpuhealth.prom").read_text()
    with sqlite3.connect(store) as db:
        kept = dict(db.execute("SELECT host, verdict FROM nodes").fetchall())
    assert kept == {"n1": "PASS", "n2": "FAIL", "n3": "PASS"}


@pytest.mark.suite
def test_gpu_less_machine_skips_with_the_reason_and_passes(tmp_path):
    run = run_suite(tmp_path / "r")
    assert run.rc == 0, run.output
    me = socket.gethostname()
    gpu_tests = {
        test: message
        for test, message in run.messages().items()
        if check_module(test) in GPU_MODULES
    }
    expected = sum(check_module(f"test_{n}") in GPU_MODULES for n in registry.names("node"))
    expected += 8 * sum(check_module(f"test_{n}") in GPU_MODULES for n in registry.names("gpu"))
    assert len(gpu_tests) == expected
    assert all(f"no NVIDIA GPU/driver on {me}" in m for m in gpu_tests.values()), gpu_tests
    node = run.verdicts["nodes"][me]
    assert node["verdict"] == "PASS"
    assert node["reasons"] == [f"no NVIDIA GPU/driver on {me}; none expected, GPU checks skipped"]
    assert (tmp_path / "r" / "facts" / f"{me}.json").exists()
    assert any((tmp_path / "r" / "allure-results").glob("*-result.json"))


@pytest.mark.suite
def test_gpu_less_machine_fails_when_gpus_are_expected(tmp_path):
    run = run_suite(tmp_path / "r", "--expected-gpus", "8")
    assert run.rc == 1
    node = run.verdicts["nodes"][socket.gethostname()]
    assert node["verdict"] == "FAIL"
    assert any("expected 8 GPUs, found 0" in r for r in node["reasons"])


@pytest.mark.suite
def test_allure_results_carry_host_gpu_and_check_labels(tmp_path):
    facts, inventory = fleet(tmp_path)
    run_suite(tmp_path / "r", "--facts", str(facts), "--inventory", str(inventory))
    results = [
        json.loads(p.read_text()) for p in (tmp_path / "r" / "allure-results").glob("*-result.json")
    ]
    ecc = next(r for r in results if r["name"] == "test_ecc_errors[n2-gpu3]")
    labels = {(label["name"], label["value"]) for label in ecc["labels"]}
    assert {("host", "n2"), ("gpu", "3"), ("check", "ecc_errors"), ("parentSuite", "n2")} <= labels
    assert ("uuid", healthy_h100()["gpus"][3]["uuid"]) in labels
    assert ecc["status"] == "failed"
    attachments = list((tmp_path / "r" / "allure-results").glob("*-attachment.json"))
    assert len(attachments) == 3  # the facts document, once per host


@pytest.mark.suite
@pytest.mark.parametrize(
    ("inventory", "message"),
    [
        (
            "all:\n  hosts:\n    n1:\n      gpu_profile: h100\n",
            "inventory host n1: gpu_profile: unknown profile 'h100'",
        ),
        (
            "all:\n  hosts:\n    n1:\n      temp_warn: 70\n",
            "unknown var 'temp_warn' (did you mean 'temp_warn_c'?)",
        ),
        ("all:\n  hosts:\n    n1:\n      gpu_count: many\n", "gpu_count must be a whole number"),
    ],
)
def test_bad_inventory_is_one_usage_error(tmp_path, inventory, message):
    facts = write_facts(tmp_path / "facts", n1=healthy_h100())
    path = tmp_path / "hosts.yml"
    path.write_text(inventory)
    run = run_suite(tmp_path / "r", "--facts", str(facts), "--inventory", str(path))
    assert run.rc == 4, run.output
    assert message in run.output
    assert "Traceback" not in run.output


@pytest.mark.suite
def test_bad_profile_directory_is_one_usage_error(tmp_path):
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "lab.yml").write_text("temp_fail: 80\n")
    run = run_suite(tmp_path / "r", "--profile-dir", str(profiles))
    assert run.rc == 4
    assert "lab.yml: unknown key 'temp_fail' (did you mean 'temp_fail_c'?)" in run.output


@pytest.mark.suite
def test_one_probe_per_host_with_xdist(tmp_path):
    log = tmp_path / "probes.log"
    wrapper = tmp_path / "counting-python3"
    wrapper.write_text(f'#!/bin/sh\necho probe >> {log}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    {socket.gethostname()}:\n      gpuhealth_python: {wrapper}\n"
    )
    run = run_suite(
        tmp_path / "r",
        "--hosts",
        "local://",
        "--inventory",
        str(inventory),
        "-n",
        "2",
        env={"PATH": os.environ["PATH"]},
    )
    assert run.rc == 0, run.output
    assert log.read_text().count("probe") == 1


def targets(*names: str, gpus: int = 8) -> list[Target]:
    return [Target(name, Expectations(None, gpus, {})) for name in names]


def test_xdist_groups_come_from_the_hosts_not_from_parsing_ids():
    groups = host_groups(targets("node-17", "gpu-box"))
    assert groups["node-17"] == groups["node-17-gpu3"] == "node-17"
    assert groups["gpu-box"] == groups["gpu-box-gpu0"] == "gpu-box"


def test_hosts_whose_ids_could_collide_share_one_worker():
    """`dgx` GPU 1 and a host named `dgx-gpu1` are the id `dgx-gpu1`: one group, one worker,
    and each host still gets exactly one probe."""
    groups = host_groups(targets("dgx", "dgx-gpu1", "n2"))
    assert groups["dgx-gpu1"] == groups["dgx"] == groups["dgx-gpu1-gpu7"] == groups["dgx-gpu3"]
    assert groups["n2"] == "n2"


@pytest.mark.suite
def test_gpu_named_hosts_under_xdist_give_the_serial_outcomes(tmp_path):
    n2 = healthy_h100()
    n2["gpus"][1]["ecc"]["volatile"]["uncorrected"] = 3
    facts = write_facts(tmp_path / "facts", **{"dgx": healthy_h100(), "dgx-gpu1": n2})
    serial = run_suite(tmp_path / "a", "--facts", str(facts), "--profile", "h100-sxm")
    parallel = run_suite(tmp_path / "b", "--facts", str(facts), "--profile", "h100-sxm", "-n", "2")
    assert parallel.outcomes() == serial.outcomes()
    assert failed(parallel) == {"test_ecc_errors[dgx-gpu1-gpu1]"}
    assert parallel.verdicts["nodes"]["dgx"]["verdict"] == "PASS"


@pytest.mark.parametrize(
    ("host", "name"),
    [("../../x", ".._.._x"), ("n1\nevil", "n1_evil"), ("..", "_.."), ("node17", "node17")],
)
def test_host_names_become_safe_file_names(host, name):
    assert safe_name(host.replace("\\n", "\n")) == name


@pytest.mark.suite
def test_unreachable_host_is_unreachable_and_the_rest_goes_on(tmp_path):
    run = run_suite(
        tmp_path / "r",
        "--hosts",
        "local://,ssh://127.0.0.1:1",
        "--ssh-extra-args=-o BatchMode=yes -o ConnectTimeout=5",
    )
    assert run.rc == 1
    nodes = run.verdicts["nodes"]
    assert nodes["127.0.0.1"]["verdict"] == "UNREACHABLE"
    assert "ssh failed" in nodes["127.0.0.1"]["reasons"][0]
    assert "Connection refused" in nodes["127.0.0.1"]["reasons"][0]
    assert nodes[socket.gethostname()]["verdict"] == "PASS"
    outcomes = run.outcomes()
    assert outcomes["test_driver_version[127.0.0.1]"] == "error"
    assert list(run.verdicts["nodes"])[0] == "127.0.0.1"  # worst first


@pytest.mark.suite
def test_absolute_paths_from_anywhere_run_the_suite(tmp_path):
    """pytest finds no ini above --facts /elsewhere: the run restarts with the suite's and
    never collects the current directory (the project's own tests, someone's scripts)."""
    facts, inventory = fleet(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "test_not_ours.py").write_text("def test_x():\n    raise SystemExit(9)\n")
    args = ("--facts", str(facts), "--inventory", str(inventory))
    home = run_suite(tmp_path / "home", *args)
    for cwd in (elsewhere, REPO):
        run = run_suite(tmp_path / cwd.name, *args, cwd=cwd, ini=False)
        assert run.rc == 1, run.output
        assert run.outcomes() == home.outcomes()
        assert run.verdicts["nodes"]["n1"]["verdict"] == "PASS"


@pytest.mark.suite
def test_another_ini_named_with_c_is_one_usage_error(tmp_path):
    facts, _ = fleet(tmp_path)
    (tmp_path / "other.ini").write_text("[pytest]\n")
    run = run_suite(
        tmp_path / "r", "-c", str(tmp_path / "other.ini"), "--facts", str(facts), ini=False
    )
    assert run.rc == 4, run.output
    assert f"not the suite's pytest.ini; name it: pytest -c {REPO / 'pytest.ini'}" in run.output


@pytest.mark.suite
def test_the_installed_plugin_is_inert_in_unrelated_runs(tmp_path):
    """The entry point loads gpuhealth into every pytest run; without its options or the
    suite's ini it must neither probe nor write reports nor restart anything."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_theirs.py").write_text("def test_theirs():\n    assert True\n")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        cwd=project,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout and "gpuhealth" not in proc.stdout + proc.stderr
    assert sorted(p.name for p in project.iterdir()) == ["pytest.ini", "test_theirs.py"]
