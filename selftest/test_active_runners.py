"""The active runners end to end: the real launch, timeout and parsing code, with stand-in
executables (selftest/standins) on PATH that replay real outputs, hang, fail or print garbage.

Single-node runs go through testinfra's local backend (and, in the suite, the fake NVML for
8 H100s); the multi-node test plays four nodes through a stand-in `ssh` that runs each
command here, and a stand-in `mpirun`/`srun` whose output depends on which nodes are in the
set, so bisection has a slow node to find.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import testinfra

from gpuhealth.active import bisect, collect, runner
from gpuhealth.active import node as on_node
from gpuhealth.checks import NodeView
from gpuhealth.documents import FactsError, validated
from gpuhealth.families.dcgm import active as dcgm_active
from gpuhealth.families.nccl import active as nccl_active
from selftest.facts import healthy_h100, judge, write_facts
from selftest.facts import limits as fact_limits
from selftest.fakenvml import load_scenario, nvml_env, write_scenario
from selftest.suite import SuiteRun, run_suite
from selftest.test_dcgm import dcgm4_failing_gpu3, dcgm4_text
from selftest.test_node_pythons import SUPPORTED, interpreter

HERE = Path(__file__).resolve().parent
STANDINS = HERE / "standins"
HOST = socket.gethostname()


@pytest.fixture
def standins(monkeypatch, tmp_path) -> Path:
    """Stand-ins first on PATH; returns the file each of them logs its command line to."""
    monkeypatch.setenv("PATH", f"{STANDINS}{os.pathsep}{os.environ['PATH']}")
    calls = tmp_path / "calls.log"
    monkeypatch.setenv("STANDIN_CALLS", str(calls))
    return calls


@pytest.fixture
def local():
    return testinfra.get_host("local://")


def judged(section: dict[str, Any], name: str) -> Any:
    return judge(name, {"source": "active", "nccl": section}, host="n1")


def single(host: Any, timeout_s: float = 30, folder: Path = STANDINS) -> dict[str, Any]:
    path = str(folder / "all_reduce_perf")
    command = nccl_active.single_command(path, "-b 8 -e 16G -f 2", 8)
    outcome = runner.run_on(host, command, timeout_s)
    return nccl_active.section_of(outcome, ["n1"], "nccl_timeout_s")


# ---------------------------------------------------------------- single-node nccl-tests


def test_replayed_healthy_run_passes_with_the_real_command_line(standins, local):
    section = single(local)
    assert section["error"] is None and section["rc"] == 0
    assert judged(section, "nccl_bandwidth").status == "PASS"
    assert judged(section, "nccl_data_integrity").status == "PASS"
    assert standins.read_text() == "local all_reduce_perf -b 8 -e 16G -f 2 -g 8\n"


def test_a_hung_run_is_killed_at_its_timeout(standins, local, monkeypatch):
    monkeypatch.setenv("STANDIN_NCCL", "hang")
    started = time.monotonic()
    section = single(local, timeout_s=1)
    assert time.monotonic() - started < 5
    assert section["error"].startswith("timed out: killed after 1 s (nccl_timeout_s)")
    result = judged(section, "nccl_bandwidth")
    assert result.status == "FAIL" and "hung GPU" in result.advice


def test_an_nccl_failure_fails_with_its_message(standins, local, monkeypatch):
    monkeypatch.setenv("STANDIN_NCCL", "fail")
    section = single(local)
    assert section["error"].startswith("exited 3: node005: Test NCCL failure common.cu:1005")
    assert judged(section, "nccl_data_integrity").status == "FAIL"


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("garbage", "output is not an nccl-tests result: no nccl-tests result rows"),
        ("truncated", "line 18: result row has 7 columns, the header has 13"),
    ],
)
def test_garbage_output_is_a_clear_failure(standins, local, monkeypatch, mode, message):
    monkeypatch.setenv("STANDIN_NCCL", mode)
    result = judged(single(local), "nccl_bandwidth")
    assert result.status == "FAIL" and message in result.text


def test_missing_nccl_tests_fails_with_install_advice(standins, local, tmp_path):
    result = judged(single(local, folder=tmp_path), "nccl_bandwidth")
    assert result.status == "FAIL" and "not found" in result.text
    assert "role nccl_tests" in result.advice


def test_slow_single_node_run_fails_the_h100_threshold(standins, local, monkeypatch):
    monkeypatch.setenv("STANDIN_NCCL", "nccltests_issue309_4node_32xH100_vm_all_reduce.txt")
    result = judged(single(local), "nccl_bandwidth")
    assert result.status == "FAIL" and "365.8 GB/s" in result.text


def test_size_arguments_are_quoted_for_the_shell():
    command = nccl_active.single_command("/opt/nccl tests/all_reduce_perf", "-b 8 -e '1G;x'", 4)
    assert command == "'/opt/nccl tests/all_reduce_perf' -b 8 -e '1G;x' -g 4"
    with pytest.raises(ValueError, match="nccl_sizes"):
        nccl_active.single_command("/x", "-b 'unclosed", 4)


# ---------------------------------------------------------------- dcgmi diag


def diag(host: Any, timeout_s: float = 30) -> dict[str, Any]:
    outcome = runner.run_on(host, "dcgmi diag -r 2 -j", timeout_s)
    return dcgm_active.section_of(outcome, 2, "dcgm_diag_timeout_s")


def test_dcgmi_replay_and_a_failing_gpu_with_nonzero_exit(standins, local, monkeypatch, tmp_path):
    assert diag(local)["diag"]["layout"] == "3.x"
    failing = tmp_path / "diag.json"
    failing.write_text(dcgm4_failing_gpu3())
    monkeypatch.setenv("STANDIN_DCGM_DIAG", str(failing))
    monkeypatch.setenv("STANDIN_DCGM_RC", "226")
    section = diag(local)
    assert section["rc"] == 226 and section["error"] is None
    facts = {"source": "active", "gpus": [{"index": i} for i in range(8)], "dcgm": section}
    assert judge("dcgm_diag_gpu", facts, 3).status == "FAIL"
    assert judge("dcgm_diag_gpu", facts, 4).status == "PASS"


@pytest.mark.parametrize(
    ("mode", "error", "action"),
    [
        ("garbage", "no JSON in the output (first line: 'Usage: dcgmi", "by hand"),
        ("nohostengine", "cannot reach the DCGM host engine", "systemctl enable --now"),
    ],
)
def test_dcgmi_garbage_and_host_engine_down_fail(standins, local, monkeypatch, mode, error, action):
    monkeypatch.setenv("STANDIN_DCGM_DIAG", mode)
    section = diag(local)
    assert error in section["error"] and action in section["advice"]


def test_dcgmi_hang_and_missing(standins, local, monkeypatch):
    monkeypatch.setenv("STANDIN_DCGM_DIAG", "hang")
    hung = diag(local, timeout_s=1)
    assert "timed out: killed after 1 s (dcgm_diag_timeout_s)" in hung["error"]
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    missing = diag(local)
    assert missing["error"].startswith("dcgmi not found") and "role dcgm" in missing["advice"]
    assert missing["action"] == "FIX_CONFIG"


# ---------------------------------------------------------------- multi-node launch + bisection


def multi(host: Any, launcher: str, nodes: list[str]) -> dict[str, Any]:
    command = nccl_active.multi_command(
        launcher, "--mca pml ucx", str(STANDINS / "all_reduce_perf"), "-b 8 -e 16G -f 2", nodes, 8
    )
    return nccl_active.section_of(runner.run_on(host, command, 30), nodes, "nccl_timeout_s")


@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_launchers_get_the_node_set(standins, local, monkeypatch, launcher):
    monkeypatch.setenv("STANDIN_SLOW_NODES", "n3")
    fast = multi(local, launcher, ["n1", "n2"])
    slow = multi(local, launcher, ["n1", "n3"])
    assert standins.read_text().splitlines() == [
        f"local {launcher} n1,n2",
        f"local {launcher} n1,n3",
    ]
    assert judge("nccl_bandwidth", {"nccl": fast}, host="x").status == "PASS"
    result = judge("nccl_bandwidth", {"nccl": slow}, host="x")
    assert result.status == "FAIL" and "2 nodes" in result.text


def test_mpirun_command_writes_a_hostfile_and_cleans_it_up():
    command = nccl_active.multi_command(
        "mpirun", "-x PATH", "/b/all_reduce_perf", "-b 8", ["a", "b"], 8
    )
    assert "printf '%s slots=8\\n' a b" in command
    assert 'mpirun --hostfile "$f" -np 16 -x PATH /b/all_reduce_perf -b 8 -g 1' in command
    assert command.endswith('rc=$?; rm -f "$f"; exit $rc')


def measure_with(slow: set[str], runs: list[tuple[str, ...]]):
    def measure(nodes: tuple[str, ...]) -> bool:
        runs.append(nodes)
        return not slow & set(nodes)

    return measure


def test_bisection_names_one_slow_node_among_four():
    runs: list[tuple[str, ...]] = []
    found = bisect.bisect(["n1", "n2", "n3", "n4"], measure_with({"n3"}, runs))
    assert found.slow == ["n3"] and found.fast == ["n1", "n2", "n4"]
    assert runs == [("n1", "n2"), ("n3", "n4"), ("n1", "n3"), ("n1", "n4")]


def test_bisection_finds_two_slow_nodes_in_different_halves():
    found = bisect.bisect(["n1", "n2", "n3", "n4"], measure_with({"n1", "n3"}, []))
    assert sorted(found.slow) == ["n1", "n3"]


def test_bisection_of_a_larger_set_uses_halves():
    nodes = [f"n{i}" for i in range(1, 17)]
    runs: list[tuple[str, ...]] = []
    found = bisect.bisect(nodes, measure_with({"n11"}, runs))
    assert found.slow == ["n11"]
    assert len(runs) <= 10 and ("n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8") in runs


def test_bisection_names_nobody_when_every_set_is_slow_or_fast():
    everything = bisect.bisect(["n1", "n2", "n3", "n4"], lambda nodes: False)
    assert everything.slow == [] and everything.unresolved
    only_together = bisect.bisect(["n1", "n2", "n3", "n4"], lambda nodes: True)
    assert only_together.slow == [] and not only_together.unresolved


# ---------------------------------------------------------------- the suite, as users run it

NODES = ["n1", "n2", "n3", "n4"]


def fleet_inventory(
    tmp_path: Path, host_vars: dict[str, dict[str, Any]] | None = None, **extra: Any
) -> Path:
    lines = [
        "all:",
        "  vars:",
        "    gpu_profile: h100-sxm",
        f"    nccl_tests_dir: {STANDINS}",
        *(f"    {key}: {json.dumps(value)}" for key, value in extra.items()),
        "  hosts:",
        *(f"    {node}: {json.dumps((host_vars or {}).get(node, {}))}" for node in NODES),
    ]
    path = tmp_path / "hosts.yml"
    path.write_text("\n".join(lines) + "\n")
    return path


def multinode(tmp_path: Path, inventory: Path, env: dict[str, str]) -> SuiteRun:
    """The multi-node NCCL test alone (`--level full -k multinode`) over the four stand-ins."""
    return run_suite(
        tmp_path / "r",
        "--hosts",
        ",".join(f"ssh://{n}" for n in NODES),
        "--inventory",
        str(inventory),
        "-m",
        "nccl",
        "--level",
        "full",
        "-k",
        "multinode",
        env=env,
    )


def standin_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "PATH": f"{STANDINS}{os.pathsep}{os.environ['PATH']}",
        "STANDIN_CALLS": str(tmp_path / "calls.log"),
        **extra,
    }


@pytest.mark.suite
def test_quick_level_skips_active_checks_with_the_reason(tmp_path):
    inventory = fleet_inventory(tmp_path)
    hosts = ",".join(f"ssh://{n}" for n in NODES)
    run = run_suite(
        tmp_path / "r",
        "--hosts",
        hosts,
        "--inventory",
        str(inventory),
        "-m",
        "nccl",
        env=standin_env(tmp_path),
    )
    assert run.rc == 0, run.output[-3000:]
    messages = run.messages()
    assert set(run.outcomes().values()) == {"skipped"}
    assert "not run at level quick (use --level standard)" in messages["test_nccl_bandwidth[n1]"]
    assert "not run at level quick (use --level full)" in messages["test_nccl_multinode[fleet]"]
    assert not (tmp_path / "calls.log").exists()


@pytest.mark.suite
def test_full_level_bisection_names_the_slow_node_in_the_verdicts(tmp_path):
    inventory = fleet_inventory(tmp_path)
    hosts = ",".join(f"ssh://{n}" for n in NODES)
    env = standin_env(tmp_path, STANDIN_SLOW_NODES="n3")
    run = run_suite(
        tmp_path / "r",
        "--hosts",
        hosts,
        "--inventory",
        str(inventory),
        "-m",
        "nccl",
        "--level",
        "full",
        "-n",
        "2",
        env=env,
    )
    assert run.rc == 1, run.output[-3000:]
    outcomes = run.outcomes()
    assert outcomes["test_nccl_multinode[fleet]"] == "failed"
    assert {outcomes[f"test_nccl_bandwidth[{n}]"] for n in NODES} == {"passed"}
    message = run.messages()["test_nccl_multinode[fleet]"]
    assert "89.9 GB/s" in message and "< 330 GB/s expected, 4 nodes" in message
    assert "slow node(s): n3" in message
    nodes = run.verdicts["nodes"]
    assert nodes["n3"]["verdict"] == "FAIL"
    assert nodes["n3"]["reasons"][0].startswith("n3: slow in multi-node all_reduce (n3+n4: ")
    assert "n1+n3: 89.9 GB/s" in nodes["n3"]["reasons"][0]
    assert nodes["n3"]["actions"] == ["DRAIN"] and "NICs" in nodes["n3"]["advice"][0]
    for node in ("n1", "n2", "n4"):
        assert nodes[node]["verdict"] == "PASS"
        assert any("bisection named n3" in note for note in nodes[node]["notes"])
    calls = (tmp_path / "calls.log").read_text().splitlines()
    launches = [line.split()[-1] for line in calls if " mpirun " in line]
    assert launches == ["n1,n2,n3,n4", "n1,n2", "n3,n4", "n1,n3", "n1,n4"]
    # each per-node run drove all 8 GPUs of its own node
    assert sorted(line.split()[0] for line in calls if "all_reduce_perf" in line) == NODES
    evidence = tmp_path / "r" / "evidence"
    assert (evidence / "n1" / "nccl-multinode-n1+n2+n3+n4.log").read_text().startswith("$ f=")
    assert (evidence / "n3" / "nccl-all_reduce_perf.log").exists()
    attachments = [p.name for p in (tmp_path / "r" / "allure-results").glob("*-attachment*")]
    assert len(attachments) >= 5


@pytest.mark.suite
def test_full_level_healthy_fleet_over_srun_passes_with_a_note(tmp_path):
    inventory = fleet_inventory(tmp_path, nccl_launcher="srun")
    run = multinode(tmp_path, inventory, standin_env(tmp_path))
    assert run.rc == 0, run.output[-3000:]
    assert run.outcomes() == {"test_nccl_multinode[fleet]": "passed"}
    note = run.verdicts["nodes"]["n2"]["notes"][0]
    assert "469.2 GB/s" in note and ">= 330 GB/s, 4 nodes" in note


@pytest.fixture
def h100_node(tmp_path: Path, fake_nvml_lib: Path) -> tuple[Path, dict[str, str]]:
    """This machine as an 8x H100 node (fake NVML) with DCGM and the stand-ins installed."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    {HOST}:\n      gpu_profile: h100-sxm\n"
        f"      dcgm_installed: true\n      nccl_tests_dir: {STANDINS}\n"
    )
    scenario = write_scenario(load_scenario("healthy-h100x8"), tmp_path / "healthy.conf")
    env = nvml_env(fake_nvml_lib.parent, scenario)
    env.update(standin_env(tmp_path))
    return inventory, env


@pytest.mark.suite
def test_standard_level_dcgm_fails_exactly_the_failing_gpu(tmp_path, h100_node):
    inventory, env = h100_node
    failing = tmp_path / "diag.json"
    failing.write_text(dcgm4_failing_gpu3())
    env.update(STANDIN_DCGM_DIAG=str(failing), STANDIN_DCGM_RC="226")
    run = run_suite(
        tmp_path / "r",
        "--inventory",
        str(inventory),
        "-m",
        "dcgm or nccl",
        "--level",
        "standard",
        env=env,
    )
    outcomes = run.outcomes()
    failed = {name for name, status in outcomes.items() if status != "passed"}
    assert failed == {f"test_dcgm_diag_gpu[{HOST}-gpu3]", "test_nccl_multinode[fleet]"}, run.output[
        -3000:
    ]
    assert outcomes["test_nccl_multinode[fleet]"] == "skipped"
    assert outcomes[f"test_dcgm_health[{HOST}]"] == "passed"
    assert outcomes[f"test_nccl_bandwidth[{HOST}]"] == "passed"
    calls = (tmp_path / "calls.log").read_text()
    assert calls.count("dcgmi diag -r 2 -j") == 1 and calls.count("all_reduce_perf") == 1
    verdict = run.verdicts["nodes"][HOST]
    assert verdict["verdict"] == "FAIL"
    assert "gpu3" in verdict["reasons"][0] and "412.00 gigaflops" in verdict["reasons"][0]


@pytest.mark.suite
def test_full_level_runs_dcgm_level_3_and_a_broken_dcgm_never_passes(tmp_path, h100_node):
    inventory, env = h100_node
    env.update(STANDIN_DCGM_DIAG="garbage", STANDIN_DCGM_HEALTH="nohostengine")
    run = run_suite(
        tmp_path / "r", "--inventory", str(inventory), "-m", "dcgm", "--level", "full", env=env
    )
    outcomes = run.outcomes()
    assert outcomes[f"test_dcgm_diag[{HOST}]"] == "failed"
    assert outcomes[f"test_dcgm_health[{HOST}]"] == "failed"
    assert {outcomes[f"test_dcgm_diag_gpu[{HOST}-gpu{i}]"] for i in range(8)} == {"skipped"}
    assert "dcgmi diag -r 3 -j" in (tmp_path / "calls.log").read_text()
    assert "cannot reach the DCGM host engine" not in run.messages()[f"test_dcgm_diag[{HOST}]"]
    assert "host engine" in run.messages()[f"test_dcgm_health[{HOST}]"]


@pytest.mark.suite
def test_fleet_slow_everywhere_warns_every_node_and_names_none(tmp_path):
    inventory = fleet_inventory(tmp_path)
    run = multinode(tmp_path, inventory, standin_env(tmp_path, STANDIN_SLOW_NODES=",".join(NODES)))
    assert run.outcomes() == {"test_nccl_multinode[fleet]": "failed"}
    for node in NODES:
        verdict = run.verdicts["nodes"][node]
        assert verdict["verdict"] == "WARN"
        assert "no subset tried was fast" in verdict["reasons"][0]


@pytest.mark.suite
def test_full_level_counts_the_nvlink_domains_the_fleet_spans_from_the_inventory(tmp_path):
    """n1+n2 in rack A, n3+n4 in rack B: the multi-node run spans 2 NVLink domains and is
    judged by that span's floor (nccl_nvlink_domains_min_busbw_gbps)."""
    racks = {"n1": "rackA", "n2": "rackA", "n3": "rackB", "n4": "rackB"}
    inventory = fleet_inventory(
        tmp_path,
        {node: {"nvlink_domain": rack} for node, rack in racks.items()},
        nccl_nvlink_domains_min_busbw_gbps={1: 500, 2: 460},
    )
    run = multinode(tmp_path, inventory, standin_env(tmp_path))
    assert run.rc == 0, run.output[-3000:]
    note = run.verdicts["nodes"]["n1"]["notes"][0]
    assert "469.2 GB/s" in note and ">= 460 GB/s, 4 nodes in 2 NVLink domains" in note


# ---------------------------------------------------------------- load tests on the nodes


def node_plan(*launches: tuple[str, str, float]) -> str:
    return json.dumps(
        [{"section": "nccl", "name": n, "command": c, "timeout_s": t} for n, c, t in launches]
    )


@pytest.mark.parametrize("version", SUPPORTED, ids=[f"py{v}" for v in SUPPORTED])
def test_the_node_runner_runs_its_plan_on_every_node_python(version, standins):
    """gpuhealth.active.node as collect.yml ships it (`python -c SOURCE`, the plan on stdin),
    bounded on the node as a live launch is (`timeout`, then its process group killed)."""
    python = interpreter(version)
    replay = f"{STANDINS / 'all_reduce_perf'} -b 8 -e 16G -f 2 -g 8"
    plan = node_plan(
        ("replay", replay, 30),
        ("hung", f"STANDIN_NCCL=hang {replay}", 1),
        ("missing", "/nonexistent/all_reduce_perf -g 8", 30),
    )
    call = subprocess.run(
        [python, "-c", Path(on_node.__file__).read_text()],
        input=plan,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert call.returncode == 0, call.stderr
    done = {r["name"]: r for r in collect.node_report("login banner\n" + call.stdout)}
    assert done["replay"]["rc"] == 0 and done["replay"]["error"] is None
    assert "# Avg bus bandwidth" in done["replay"]["stdout"]
    assert done["hung"]["timed_out"] and done["hung"]["error"] == "killed after 1 s"
    assert done["hung"]["rc"] in on_node.TIMEOUT_CODES and done["hung"]["duration_s"] < 5
    assert done["missing"]["rc"] == 127 and not done["missing"]["timed_out"]


def h100(**overrides: Any) -> NodeView:
    limits = fact_limits("h100-sxm", nccl_tests_dir=str(STANDINS), dcgm_installed=True, **overrides)
    return NodeView("n1", healthy_h100(), limits)


def test_a_node_s_load_tests_read_exactly_as_a_live_run_reads_them(standins, local):
    """The same launches planned, the same outputs read into the same sections, whether the
    controller launches them (with_active) or the node runs them (collect.yml, srun)."""
    view = h100()
    live = {}
    for run in collect.runs_at("standard"):
        ctx = runner.ActiveContext(view, "standard", lambda n, c, t: runner.run_on(local, c, t))
        live[run.section] = run.launch(ctx)[0]
    planned = collect.plan(view, "standard")
    assert [(p.section, p.command, p.timeout_s) for p in planned] == [
        ("nccl", f"{STANDINS}/all_reduce_perf -b 8 -e 16G -f 2 -g 8", 600.0),
        ("dcgm", "dcgmi diag -r 2 -j", 360.0),
    ]
    done = on_node.run_plan([asdict(p) for p in planned])
    carried = collect.load_results(view, "standard", done)
    assert carried["load_level"] == "standard"
    for section in ("nccl", "dcgm"):
        kept = carried[section].pop("launches")
        assert [k["name"] for k in kept] == [p.name for p in planned if p.section == section]
        assert kept[0]["stdout"] == done[[d["name"] for d in done].index(kept[0]["name"])]["stdout"]
        for moved in (carried[section], live[section]):
            moved.pop("duration_s")
        assert carried[section] == live[section]


def test_no_report_from_the_node_fails_every_planned_test_and_a_busy_node_runs_none():
    view = h100()
    failed = collect.load_results(view, "full", [], "the load tests on the node gave no report")
    for section in ("nccl", "dcgm"):
        assert failed[section]["error"] == "the load tests on the node gave no report"
        assert failed[section]["action"] == "RERUN"
    assert failed["dcgm"]["level"] == 3  # full: dcgmi diag -r 3
    assert judge("nccl_bandwidth", {"source": "nvml", **failed}, host="n1").status == "FAIL"
    busy = NodeView("n1", {**healthy_h100(), "node_state": {"state": "in-use"}}, view.limits)
    assert collect.plan(busy, "standard") == []
    assert collect.load_results(busy, "standard", [])["nccl"] == {"skipped": collect.IN_USE}
    with pytest.raises(ValueError, match="level 'fast'"):
        collect.plan(view, "fast")


def test_long_outputs_are_carried_as_their_start_and_end():
    long = "".join(f"line {i}\n" for i in range(20_000))
    outcome = runner.Outcome("x", 0, long, "", 1.0)
    kept = collect.raw("nccl-all_reduce_perf", outcome)["stdout"]
    assert len(kept) < collect.KEPT_CHARS + 100 and kept.startswith("line 0\n")
    assert kept.endswith("line 19999\n") and "characters cut" in kept
    assert collect.outcome_of(collect.raw("n", outcome)).rc == 0


def test_the_load_results_of_saved_facts_are_validated():
    doc = {"schema_version": 3, "source": "nvml", "load_level": "standard"}
    launch = {"name": "n", "command": "c", "rc": 0, "stdout": "", "stderr": "", "duration_s": 1.0}
    launch.update(error=None, timed_out=False)
    assert validated({**doc, "nccl": {"launches": [launch]}}, "f")["load_level"] == "standard"
    with pytest.raises(FactsError, match="f: load_level: Input should be 'quick'"):
        validated({**doc, "load_level": "fast"}, "f")
    with pytest.raises(FactsError, match="f: dcgm.launches.0.rc: Input should be a valid int"):
        validated({**doc, "dcgm": {"launches": [{**launch, "rc": "0"}]}}, "f")
    with pytest.raises(FactsError, match="f: nccl.launches.0.rc: Field required"):
        validated({**doc, "nccl": {"launches": [{"name": "n", "command": "c"}]}}, "f")


def stored_load(store: Path) -> tuple[list[tuple[str, float]], list[tuple[str, int]], list[str]]:
    """What the run store kept of the load tests: (host, busbw) of each single-node NCCL run,
    (host, GPU) of each GPU with failed DCGM results, and the hosts with DCGM results."""
    with sqlite3.connect(store) as db:
        busbw = db.execute(
            "SELECT host, value FROM measurements WHERE metric = 'nccl_busbw_gbps' ORDER BY host"
        ).fetchall()
        failing = db.execute(
            "SELECT host, gpu FROM measurements WHERE metric = 'dcgm_diag_failures' AND value > 0"
        ).fetchall()
        counted = db.execute(
            "SELECT DISTINCT host FROM measurements WHERE metric = 'dcgm_diag_failures'"
        ).fetchall()
    return busbw, failing, sorted(host for (host,) in counted)


def carried_facts(env: dict[str, str], level: str = "standard") -> dict[str, Any]:
    """An H100 node's facts with its load tests run here as the node would (stand-ins)."""
    view = h100()
    saved = os.environ.copy()
    os.environ.update(env)
    try:
        done = on_node.run_plan([asdict(p) for p in collect.plan(view, level)])
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return {**view.facts, **collect.load_results(view, level, done)}


@pytest.mark.suite
def test_saved_facts_with_load_results_are_judged_recorded_and_attached(tmp_path):
    """`pytest --facts --level standard` on documents collected at level standard: n1 healthy,
    n2 slow with GPU 3 failing DCGM, n3 claiming standard without its NCCL results, n4
    collected at quick. The same checks, evidence, attachments and history as a live run."""
    failing, healthy = tmp_path / "diag.json", tmp_path / "healthy.json"
    failing.write_text(dcgm4_failing_gpu3())
    healthy.write_text(dcgm4_text())
    env = standin_env(tmp_path, STANDIN_DCGM_DIAG=str(healthy))
    slow = dict(env, STANDIN_NCCL="nccltests_issue309_4node_32xH100_vm_all_reduce.txt")
    slow.update(STANDIN_DCGM_DIAG=str(failing), STANDIN_DCGM_RC="226")
    n3 = carried_facts(env)
    del n3["nccl"]
    docs = {
        "n1": carried_facts(env),
        "n2": carried_facts(slow),
        "n3": n3,
        "n4": {**healthy_h100(), "load_level": "quick"},
    }
    folder = write_facts(tmp_path / "facts", **docs)
    inventory = fleet_inventory(tmp_path, dcgm_installed=True)
    args = ("--facts", str(folder), "--inventory", str(inventory), "--level", "standard")
    run = run_suite(tmp_path / "r", *args, "-m", "dcgm or nccl or history", env=env)
    outcomes, messages = run.outcomes(), run.messages()
    for test in ("nccl_bandwidth", "nccl_data_integrity", "dcgm_diag", "load_regression"):
        assert outcomes[f"test_{test}[n1]"] == ("skipped" if "regr" in test else "passed")
    assert "no baseline yet" in messages["test_load_regression[n1]"]
    assert {outcomes[f"test_dcgm_diag_gpu[n1-gpu{i}]"] for i in range(8)} == {"passed"}
    assert outcomes["test_nccl_bandwidth[n2]"] == "failed"
    assert "busbw 365.8 GB/s" in messages["test_nccl_bandwidth[n2]"]
    assert outcomes["test_dcgm_diag_gpu[n2-gpu3]"] == "failed"
    assert "412.00 gigaflops" in messages["test_dcgm_diag_gpu[n2-gpu3]"]
    assert outcomes["test_nccl_bandwidth[n3]"] == "failed"
    assert (
        "collected at level standard but carry no nccl results"
        in messages["test_nccl_bandwidth[n3]"]
    )
    assert outcomes["test_dcgm_diag[n3]"] == "passed"
    assert outcomes["test_nccl_bandwidth[n4]"] == "skipped"
    assert "these facts were collected at level quick" in messages["test_nccl_bandwidth[n4]"]
    nodes = run.verdicts["nodes"]
    assert {h: nodes[h]["verdict"] for h in docs} == {
        "n1": "PASS",
        "n2": "FAIL",
        "n3": "FAIL",
        "n4": "NOT_CHECKED",  # its selected tests all skipped: nothing was judged
    }
    log = (run.reports / "evidence" / "n1" / "nccl-all_reduce_perf.log").read_text()
    assert log.startswith(f"$ {STANDINS}/all_reduce_perf -b 8 ")
    assert (run.reports / "evidence" / "n2" / "dcgmi-diag-r2.log").exists()
    attached = [p.read_text() for p in (run.reports / "allure-results").glob("*-attachment*")]
    assert sum(text.startswith("$ dcgmi diag -r 2 -j") for text in attached) == 3
    busbw, failing, counted = stored_load(run.reports / "history.sqlite")
    assert busbw == [("n1", 476.53), ("n2", 365.84)]
    assert failing == [("n2", 3)] and counted == ["n1", "n2", "n3"]


@pytest.mark.suite
def test_multi_node_logs_from_the_scheduler_are_judged_per_node_group(tmp_path):
    """`pytest --facts --level full --nccl-log A --nccl-log B`: each log one node group of an
    srun/mpirun run across an allocation, judged by the multi-node floor; every node of the
    group gets its part, and the logs are kept as evidence."""
    data = HERE / "data" / "nccl-tests"
    fast = data / "nccltests_issue309_2node_16xH100_all_reduce.txt"
    slow = data / "nccltests_issue290_2node_16xH100_ring_low_bw.txt"
    hosts = ("bm-h100-01", "bm-h100-02", "node005", "node007")
    folder = write_facts(tmp_path / "facts", **{h: healthy_h100() for h in hosts})
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  vars:\n    gpu_profile: h100-sxm\n  hosts:\n")
    inventory.write_text(inventory.read_text() + "".join(f"    {h}: {{}}\n" for h in hosts))
    common = ("--facts", str(folder), "--inventory", str(inventory), "--level", "full")
    selected = ("-m", "nccl", "-k", "multinode")
    logs = ("--nccl-log", str(fast), "--nccl-log", str(slow))
    run = run_suite(tmp_path / "r", *common, *selected, *logs, env=standin_env(tmp_path))
    assert run.outcomes() == {"test_nccl_multinode[fleet]": "failed"}, run.output[-3000:]
    message = run.messages()["test_nccl_multinode[fleet]"]
    assert message.startswith(f"Failed: {slow.name} (2 nodes): all_reduce busbw 89.9 GB/s")
    assert "< 420 GB/s expected, 2 nodes" in message and fast.name not in message
    nodes = run.verdicts["nodes"]
    for host in ("node005", "node007"):
        assert nodes[host]["verdict"] == "WARN"
        assert "a saved log names no slow node" in nodes[host]["reasons"][0]
    for host in ("bm-h100-01", "bm-h100-02"):  # their own checks deselected (-k): a note only
        assert nodes[host]["verdict"] == "NOT_CHECKED"
        assert nodes[host]["notes"][0].startswith(f"{fast.name} (2 nodes): ")
    kept = run.reports / "evidence" / "node005" / f"nccl-multinode-{slow.stem}.log"
    assert slow.read_text() in kept.read_text()
    without = run_suite(tmp_path / "w", *common, *selected, env=standin_env(tmp_path))
    assert "with --nccl-log FILE" in without.messages()["test_nccl_multinode[fleet]"]
    missing = tmp_path / "no-such.log"
    typo = run_suite(tmp_path / "t", *common, *selected, "--nccl-log", str(missing))
    assert typo.rc == 4, typo.output[-3000:]
    assert f"--nccl-log {missing}: cannot read: No such file or directory" in typo.output


def test_collect_yml_s_load_filters_plan_from_the_inventory_and_fail_without_a_report():
    """playbooks/filter_plugins/gpuhealth_load.py: the task collect.yml runs on a node (the
    inventory's nccl_tests_dir and GPU count, the controller's bound) and the document it
    saves when the task gave no report (its timeout fired): every planned test failed."""
    path = HERE.parent / "playbooks" / "filter_plugins" / "gpuhealth_load.py"
    spec = importlib.util.spec_from_file_location("load_filters", path)
    assert spec is not None and spec.loader is not None
    filters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(filters)
    hostvars = {
        "inventory_hostname": "node7",
        "gpu_profile": "h100-sxm",
        "gpu_count": 4,
        "nccl_tests_dir": "/opt/nt",
        "dcgm_installed": True,
        "ansible_host": "10.0.0.7",
    }
    facts = healthy_h100()
    call = filters.load_call(hostvars, facts, "standard", python="/usr/bin/python3")
    assert call["argv"][:2] == ["/usr/bin/python3", "-c"]
    assert [p["command"] for p in json.loads(call["stdin"])] == [
        "/opt/nt/all_reduce_perf -b 8 -e 16G -f 2 -g 4",
        "dcgmi diag -r 2 -j",
    ]
    assert call["timeout_s"] == 60 + (600 + 15) + (360 + 15)
    timed_out = {"failed": True, "msg": "The task timed out after 1050 seconds", "stdout": ""}
    doc = filters.with_load(facts, hostvars, "standard", timed_out)
    assert doc["load_level"] == "standard"
    for section in ("nccl", "dcgm"):
        assert doc[section]["error"].startswith("the load tests on the node gave no report: The")
    assert filters.with_load(facts, hostvars, "quick", {"skipped": True})["load_level"] == "quick"


def test_gpuhealth_probe_level_standard_runs_the_load_tests_here(tmp_path):
    """The srun recipe's node side: `gpuhealth probe --level standard` runs the load tests the
    host's inventory vars plan, after the probe, into the same document."""
    inventory = fleet_inventory(tmp_path, gpu_count=8, dcgm_installed=True)
    env = {**os.environ, **standin_env(tmp_path)}
    args = ("probe", "--level", "standard", "--inventory", str(inventory), "--host", "n2")
    proc = subprocess.run(
        [sys.executable, "-m", "gpuhealth.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    doc = validated(json.loads(proc.stdout), "gpuhealth probe --level standard")
    assert doc["load_level"] == "standard" and doc["nccl"]["error"] is None
    assert doc["nccl"]["command"] == f"{STANDINS}/all_reduce_perf -b 8 -e 16G -f 2 -g 8"
    assert doc["dcgm"]["launches"][0]["command"] == "dcgmi diag -r 2 -j"
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls == ["local all_reduce_perf -b 8 -e 16G -f 2 -g 8", "local dcgmi diag -r 2 -j"]
    unknown = subprocess.run(
        [sys.executable, "-m", "gpuhealth.cli", *args[:-1], "n9"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert unknown.returncode == 2 and "does not list this host (n9)" in unknown.stderr


def test_results_of_a_lower_level_are_not_judged_as_a_higher_one(tmp_path):
    """Facts collected at standard (`dcgmi diag -r 2`) judged at --level full, which runs
    `-r 3`: DCGM is not judged, saying why; single-node NCCL, the same at both, is."""
    facts = carried_facts(standin_env(tmp_path))
    view = NodeView("n1", facts, h100().limits)
    reason = collect.saved_run(view, "dcgm", "full")
    assert reason == (
        "these facts carry `dcgmi diag -r 2 -j` (collected at level standard); level full runs "
        "`dcgmi diag -r 3 -j`: collect with -e level=full"
    )
    section, kept = collect.saved_run(view, "nccl", "full")
    assert section is facts["nccl"] and [name for name, _ in kept] == ["nccl-all_reduce_perf"]
    assert collect.saved_run(view, "dcgm", "standard")[0] is facts["dcgm"]


def test_a_stray_child_holding_the_pipes_keeps_what_was_printed_and_reaps_the_shell(
    tmp_path, monkeypatch
):
    """A launch whose stray child (in a session of its own, out of `timeout`'s reach) keeps
    stdout open: the runner stops waiting, keeps what the launch printed until then, and
    reaps the shell it started (no zombie left behind)."""
    monkeypatch.setattr(on_node, "KILL_GRACE_S", 1)
    monkeypatch.setattr(on_node, "PIPE_GRACE_S", 1)
    started: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def recorded(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(on_node.subprocess, "Popen", recorded)
    pid_file = tmp_path / "stray.pid"
    command = f"echo partial result; setsid sleep 60 & echo $! > {pid_file}; wait"
    try:
        record = on_node.run(command, 1)
    finally:
        if pid_file.exists():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert record["timed_out"] and record["error"] == "no end after 1 s: its output stayed open"
    assert record["rc"] is None and "partial result" in record["stdout"]
    assert started[0].returncode is not None  # the shell was waited for


@pytest.mark.parametrize("took", [None, "12", True, [1]])
def test_a_launch_without_a_number_for_its_duration_reads_as_unknown(took):
    """Not 0.0: how long a launch ran is evidence, and a record without it did not say."""
    record = {"command": "x", "rc": 0, "stdout": "", "duration_s": took}
    assert collect.outcome_of(record).duration_s is None
    assert collect.outcome_of({**record, "duration_s": 3}).duration_s == 3.0
