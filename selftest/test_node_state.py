"""Node state: a node is judged idle (every rule) or in use (a job owns the GPUs: faults only).

How the probe decides (requested, the kubelet's hint, Slurm's view, compute processes), which
checks skip on a busy node and how the rest judge one, the reclaim wait that never outlasts the
probe, and what Slurm and Kubernetes are told (a busy node's PASS never undoes a drain).
node-check on the fake NVML's busy 8x H100 (busy-h100x8, busy-ecc-gpu3) end to end.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuhealth import registry
from gpuhealth.checks import IN_USE_SKIP, NodeView, evaluate
from gpuhealth.integrations import slurm
from gpuhealth.integrations import verdicts as runs
from gpuhealth.parsing import ParseError
from gpuhealth.probe import state
from gpuhealth.probe.command import CommandResult
from selftest.facts import healthy_h100, judge, limits
from selftest.fakenvml import nvml_env, write_scenario

DATA = Path(__file__).parent / "data" / "slurm"
GPUHEALTH = str(Path(sys.executable).with_name("gpuhealth"))
H100 = ("--profile", "h100-sxm", "--expected-gpus", "8")

# What the issue names as judged on idle nodes only; every other check is a fault rule.
IDLE_ONLY = {
    "temperature",
    "power",
    "idle_processes",
    "memory_reclaim",
    "nccl_bandwidth",
    "nccl_data_integrity",
    "dcgm_diag",
    "dcgm_diag_gpu",
    "load_regression",
}


# ---------------------------------------------------------------- deciding the state


def test_slurm_s_state_is_read_from_a_real_scontrol_answer():
    text = (DATA / "scontrol_show_node_allocated_binfservas07_20.11.txt").read_text()
    assert state.slurm_node_state(text) == ["ALLOCATED"]
    one_line = "NodeName=n1 Arch=x86_64 CPUAlloc=1 State=MIXED+DRAIN ThreadsPerCore=1 Weight=1"
    assert state.slurm_node_state(one_line) == ["MIXED", "DRAIN"]
    assert state.slurm_node_state("NodeName=n1 State=IDLE* Weight=1") == ["IDLE"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "NodeName=n1 Weight=1",
        "State=IDLE\nState=ALLOCATED",
        "State=idle",
        "State=+",
        "x" * 5000,
    ],
)
def test_anything_but_one_slurm_state_is_a_parse_error(text):
    with pytest.raises(ParseError):
        state.slurm_node_state(text)


def _runner(stdout: str, rc: int = 0):
    calls = []

    def run(argv, timeout_s):
        calls.append(argv)
        return CommandResult(rc, stdout, "" if rc == 0 else "slurm_load_node error")

    run.calls = calls
    return run


BUSY_GPUS = [{"index": i, "processes": [{"pid": 7, "name": "python"}]} for i in range(2)]
IDLE_GPUS = [{"index": i, "processes": []} for i in range(2)]


def test_a_requested_state_is_used_as_requested():
    assert state.decide("in-use", None, IDLE_GPUS) == {
        "state": "in-use",
        "requested": "in-use",
        "source": "requested",
    }
    assert state.decide("idle", None, BUSY_GPUS)["state"] == "idle"
    odd = state.decide("busy", None, BUSY_GPUS)
    assert odd["state"] == "idle" and "unknown node state 'busy'" in odd["source"]


def test_auto_takes_slurm_s_view_first(monkeypatch):
    monkeypatch.setattr(state.shutil, "which", lambda name: "/usr/bin/" + name)
    busy = _runner("NodeName=n1 State=ALLOCATED Weight=1")
    found = state.decide("auto", None, IDLE_GPUS, "n1", busy)
    assert found == {
        "state": "in-use",
        "requested": "auto",
        "source": "Slurm: node n1 is ALLOCATED",
    }
    assert busy.calls == [["scontrol", "show", "node", "-o", "n1"]]
    completing = _runner("NodeName=n1 State=IDLE+COMPLETING Weight=1")
    assert state.decide("auto", None, IDLE_GPUS, "n1", completing)["state"] == "in-use"
    # Slurm says idle: stray processes are then judged (the node must be idle).
    idle = state.decide("auto", None, BUSY_GPUS, "n1", _runner("NodeName=n1 State=IDLE"))
    assert idle == {
        "state": "idle",
        "requested": "auto",
        "source": "Slurm: node n1 is IDLE (no job)",
    }


def test_auto_without_slurm_goes_by_the_compute_processes(monkeypatch):
    monkeypatch.setattr(state.shutil, "which", lambda name: None)
    busy = state.decide("auto", None, BUSY_GPUS)
    assert busy["state"] == "in-use" and busy["source"] == "compute processes on gpu0, gpu1"
    assert state.decide("auto", None, IDLE_GPUS)["source"] == "no compute process on any GPU"
    unread = state.decide("auto", None, [{"index": 0, "processes": None}])
    assert unread["state"] == "idle" and "could not be read" in unread["source"]
    assert state.decide("auto", None, None)["state"] == "idle"


def test_a_slurm_that_cannot_answer_falls_back_to_the_processes(monkeypatch):
    monkeypatch.setattr(state.shutil, "which", lambda name: "/usr/bin/" + name)
    broken = _runner("", rc=1)
    assert state.decide("auto", None, BUSY_GPUS, "n1", broken)["source"].startswith("compute")


def test_the_kubelet_s_hint_comes_before_slurm(monkeypatch):
    monkeypatch.setattr(state.shutil, "which", lambda name: "/usr/bin/" + name)
    hint = {"state": "in-use", "source": "kubelet: pods ml/train-0 hold nvidia.com/gpu"}
    runner = _runner("NodeName=n1 State=IDLE")
    assert state.decide("auto", hint, IDLE_GPUS, "n1", runner)["source"] == hint["source"]
    assert runner.calls == []


def test_a_kubelet_that_sees_no_gpu_pod_does_not_overrule_the_gpus(monkeypatch):
    """A job the kubelet does not see (outside Kubernetes, or a pod handed every GPU through
    NVIDIA_VISIBLE_DEVICES) still makes the node busy: "idle" from the kubelet is not final."""
    monkeypatch.setattr(state.shutil, "which", lambda name: None)
    hint = {"state": "idle", "source": "kubelet: no pod holds an NVIDIA GPU"}
    busy = state.decide("auto", hint, BUSY_GPUS)
    assert busy["state"] == "in-use"
    assert busy["source"] == "kubelet: no pod holds an NVIDIA GPU; compute processes on gpu0, gpu1"
    assert state.decide("auto", hint, IDLE_GPUS)["state"] == "idle"


# ---------------------------------------------------------------- which rules apply


def test_each_check_declares_whether_it_applies_in_use():
    """Idle rules are the issue's list (idle temperature and power, stray processes, the
    memory-reclaim wait, load tests and their regressions); every other check is a fault."""
    idle_only = {c.name for c in registry.checks().values() if not c.in_use}
    assert idle_only == IDLE_ONLY
    assert all(not c.in_use for c in registry.checks().values() if c.level != "quick")


def _busy(facts):
    busy = copy.deepcopy(facts)
    for gpu in busy["gpus"]:
        gpu.update(
            processes=[{"pid": 4242, "name": "python", "used_memory_mib": 61440}],
            memory_used_mib=61440,
            temperature_c=83,
            power_draw_w=760,
            utilization_gpu_pct=97,
            performance_state="P0",
        )
        gpu["clock_event_reasons"]["active"] = ["sw_power_cap"]
    for record in busy["memory_reclaim"]["gpus"]:  # as an idle probe would have polled it
        record.update(used_mib=61440, processes=busy["gpus"][0]["processes"])
    busy["node_state"] = {"state": "in-use", "requested": "auto", "source": "Slurm: n is MIXED"}
    return busy


def test_a_busy_healthy_node_passes_every_check_that_applies():
    facts = _busy(healthy_h100())
    view = NodeView("node17", facts, limits(gpu_count=8))
    findings = [evaluate(c, view) for c in registry.checks().values() if c.scope == "node"]
    findings += [
        evaluate(c, view, i)
        for i in range(8)
        for c in registry.checks().values()
        if c.scope == "gpu"
    ]
    bad = [f.text for f in findings if f.status.value in ("FAIL", "WARN")]
    assert bad == []
    skipped = {f.check for f in findings if f.result.message == IN_USE_SKIP}
    assert skipped == IDLE_ONLY


def test_the_same_facts_judged_idle_fail_the_idle_rules():
    facts = _busy(healthy_h100())
    stray = judge("idle_processes", facts, 3, gpu_count=8)
    assert (stray.status.value, stray.result.message) == ("SKIP", IN_USE_SKIP)
    facts["node_state"]["state"] = "idle"
    assert judge("idle_processes", facts, 3, gpu_count=8).status.value == "FAIL"
    assert judge("temperature", facts, 3, gpu_count=8).status.value in ("WARN", "FAIL")
    assert judge("throttle", facts, 3, gpu_count=8).status.value == "WARN"


def test_a_busy_gpu_still_fails_its_faults():
    facts = _busy(healthy_h100())
    facts["gpus"][3]["ecc"]["volatile"]["uncorrected"] = 2
    facts["gpus"][5]["clock_event_reasons"]["active"] = ["hw_slowdown", "sw_power_cap"]
    assert judge("ecc_errors", facts, 3, gpu_count=8).status.value == "FAIL"
    assert judge("throttle", facts, 5, gpu_count=8).status.value == "FAIL"
    assert judge("throttle", facts, 4, gpu_count=8).status.value == "PASS"


def test_a_busy_link_below_its_speed_warns_as_it_does_on_an_idle_node():
    """The load-based rule is the same in use: a busy GPU's link below its top speed warns
    (a WARN takes no node out of service); a link trained to fewer lanes fails."""
    facts = _busy(healthy_h100())
    facts["gpus"][2]["pcie"].update(gen_current=3, width_current=16)
    assert judge("pcie_link", facts, 2, gpu_count=8).status.value == "WARN"
    facts["gpus"][2]["pcie"]["width_current"] = 8
    assert judge("pcie_link", facts, 2, gpu_count=8).status.value == "FAIL"


def test_a_job_s_host_memory_is_not_a_fault_of_a_busy_node():
    facts = _busy(healthy_h100())
    facts["system"]["memory_available_kb"] = facts["system"]["memory_total_kb"] // 50
    assert judge("host_resources", facts, min_memory_available_pct=10).status.value == "PASS"
    facts["node_state"]["state"] = "idle"
    assert judge("host_resources", facts, min_memory_available_pct=10).status.value == "FAIL"


def test_facts_without_a_state_or_with_a_broken_one_are_judged_idle():
    facts = healthy_h100()
    assert NodeView("n", facts, limits()).node_state == "idle"
    assert "without a node state" in NodeView("n", facts, limits()).node_state_source
    for broken in ("in-use", {"state": "busy"}, {"state": None}):
        view = NodeView("n", {**facts, "node_state": broken}, limits())
        assert view.node_state == "idle" and "judged idle" in view.node_state_source
    assert NodeView("n", facts, limits(), state="in-use").in_use


# ---------------------------------------------------------------- acting on a busy PASS


def _node(verdict: str, node_state: str | None) -> runs.NodeState:
    return runs.NodeState("n1", verdict, [], [], [], None, node_state)


def test_a_busy_node_s_pass_never_resumes_what_gpuhealth_drained():
    drained = {"n1": slurm.SlurmNode("n1", "draining", "gpuhealth: FAIL n1: stray")}
    for node_state, resumed in (("in-use", False), ("idle", True), (None, True)):
        run = runs.Run(Path("v.json"), "now", True, {"n1": _node("PASS", node_state)})
        changes, notes = slurm.plan(run, {"n1": "n1"}, drained)
        assert bool(changes) is resumed, (node_state, notes)
        if not resumed:
            assert "judged in use" in notes[0]


def test_verdicts_json_carries_the_node_state_to_the_actions(tmp_path):
    path = tmp_path / "verdicts.json"
    path.write_text(
        json.dumps({"complete": True, "nodes": {"n1": {"verdict": "PASS", "node_state": "in-use"}}})
    )
    assert runs.load(path).nodes["n1"].node_state == "in-use"
    assert not runs.load(path).nodes["n1"].vouches_for_idle


# ---------------------------------------------------------------- node-check, end to end


def _node_check(lib: Path, scenario: str, tmp: Path, *args: str) -> tuple[int, dict, float]:
    conf = write_scenario(scenario, tmp / f"{scenario}.conf")
    started = time.monotonic()
    done = subprocess.run(
        [GPUHEALTH, "node-check", "--host", "gpu-node-1", *H100, "--json", *args],
        env=nvml_env(lib.parent, conf),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, json.loads(done.stdout), time.monotonic() - started


def test_a_busy_healthy_node_passes_node_check_in_seconds(fake_nvml_lib, tmp_path):
    """The issue's node: a job on every GPU, 60 GiB used, 97 % busy. node-check's default
    (auto, no Slurm here) sees the processes and judges it in use."""
    rc, doc, took = _node_check(fake_nvml_lib, "busy-h100x8", tmp_path)
    assert (rc, doc["verdict"], doc["fail_count"]) == (0, "PASS", 0), doc
    assert doc["node_state"] == "in-use"
    assert doc["node_state_source"].startswith("compute processes on gpu0, gpu1")
    assert took < 15, took


def test_a_busy_node_with_a_fault_fails_naming_the_fault(fake_nvml_lib, tmp_path):
    rc, doc, took = _node_check(fake_nvml_lib, "busy-ecc-gpu3", tmp_path)
    assert (rc, doc["verdict"]) == (1, "FAIL")
    assert [(f["check"], f["gpu"], f["action"]) for f in doc["failed_checks"]] == [
        ("ecc_errors", 3, "RESET_GPU")
    ]
    assert "uncorrected ECC errors 2 > 0" in doc["reasons"][0]
    assert took < 15, took


def test_the_busy_node_judged_idle_fails_its_idle_rules_within_the_deadline(
    fake_nvml_lib, tmp_path
):
    """Asked as idle (a prolog's view), the job's processes are stray and its memory is not
    freed; the reclaim wait ends before the probe's deadline instead of getting it killed."""
    rc, doc, took = _node_check(
        fake_nvml_lib, "busy-h100x8", tmp_path, "--node-state", "idle", "--timeout", "20"
    )
    assert (rc, doc["verdict"], doc["node_state"]) == (1, "FAIL", "idle")
    checks = {f["check"] for f in doc["failed_checks"]}
    assert {"idle_processes", "memory_reclaim"} <= checks and "probe" not in checks
    reclaim = next(f for f in doc["failed_checks"] if f["check"] == "memory_reclaim")
    assert "cut to" in reclaim["message"] and "by the probe's deadline" in reclaim["message"]
    assert took < 20 + 5, took


def test_a_busy_node_s_readings_never_enter_an_idle_baseline():
    """history records a GPU's idle temperature and power only from a node judged idle: a job
    on its other GPUs heats an unused one."""
    from gpuhealth.families.gpu import metrics
    from gpuhealth.history.run import measured

    facts = healthy_h100()
    spare = {**facts["gpus"][7], "utilization_gpu_pct": 0, "processes": []}
    assert "idle_temperature_c" in metrics.gpu_values(spare)
    assert "idle_temperature_c" not in metrics.gpu_values(spare, node_in_use=True)
    assert "ecc_uncorrected_aggregate" in metrics.gpu_values(spare, node_in_use=True)
    facts["gpus"][7] = spare
    busy = NodeView("n", {**facts, "node_state": {"state": "in-use", "source": "x"}}, limits())
    names = {row["metric"] for row in measured(busy)["rows"]}
    assert names and not names & {"idle_temperature_c", "idle_power_w"}


def test_node_check_s_state_is_its_own_not_the_inventory_s(fake_nvml_lib, tmp_path):
    """The inventory's node_state is the suite's (a nightly run's idle): slurmd's, NPD's and
    ft_launcher's programs judge in their own state (auto, in-use) unless told otherwise."""
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(
        "all:\n  hosts:\n    gpu-node-1:\n      gpu_profile: h100-sxm\n      node_state: idle\n"
    )
    conf = write_scenario("busy-h100x8", tmp_path / "busy.conf")

    def state_of(*args: str) -> tuple[str, str]:
        done = subprocess.run(
            [GPUHEALTH, "node-check", "--host", "gpu-node-1", "--json", *args],
            env=nvml_env(fake_nvml_lib.parent, conf),
            capture_output=True,
            text=True,
            timeout=120,
        )
        doc = json.loads(done.stdout)
        return doc["node_state"], doc["node_state_source"]

    assert state_of("--inventory", str(inventory))[0] == "in-use"  # auto saw the job
    assert state_of("--inventory", str(inventory), "--node-state", "in-use") == (
        "in-use",
        "requested",
    )


def test_node_check_never_resumes_its_node_on_a_pass_judged_in_use(fake_nvml_lib, tmp_path):
    """slurmd's HealthCheckProgram on a node gpuhealth drained (an idle rule) that now runs a
    job: the busy node passes its faults, and stays drained; judged idle, it is resumed."""
    bin_dir, log = tmp_path / "bin", tmp_path / "scontrol.log"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text('#!/bin/sh\necho "n1|draining|gpuhealth: FAIL n1: stray"\n')
    (bin_dir / "scontrol").write_text(
        f'#!/bin/sh\necho "$*" >> {log}\n'
        '[ "$1 $2" = "show node" ] && echo "NodeName=n1 State=MIXED+DRAIN Weight=1"\nexit 0\n'
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    conf = write_scenario("busy-h100x8", tmp_path / "busy.conf")
    env = nvml_env(fake_nvml_lib.parent, conf)
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '')}", SLURMD_NODENAME="n1")

    def node_check(*args: str) -> str:
        done = subprocess.run(
            [GPUHEALTH, "node-check", "--host", "gpu-node-1", *H100, "--slurm", "--apply", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    busy = node_check()  # auto: Slurm says MIXED, a job runs
    assert "in-use: Slurm: node n1 is MIXED+DRAIN" in busy, busy
    assert "PASS judged in use (fault rules only), not resumed" in busy, busy
    assert "State=RESUME" not in log.read_text()
    write_scenario("healthy-h100x8", conf)  # the job is gone, its memory freed
    node_check("--node-state", "idle")
    assert "update NodeName=n1 State=RESUME" in log.read_text()


def test_node_check_s_slurm_calls_stay_inside_slurmd_s_60_s(fake_nvml_lib, tmp_path):
    """The probe may take --timeout (40 s) and 5 s to be killed; a Slurm that does not answer
    costs node-check 5 s a call, not 20, so the HealthCheckProgram ends before slurmd kills it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text("#!/bin/sh\nexec sleep 30\n")
    (bin_dir / "sinfo").chmod(0o755)
    env = nvml_env(fake_nvml_lib.parent, write_scenario("healthy-h100x8", tmp_path / "h.conf"))
    env.update(PATH=f"{bin_dir}:{env.get('PATH', '')}", SLURMD_NODENAME="n1")
    started = time.monotonic()
    done = subprocess.run(
        [GPUHEALTH, "node-check", "--host", "n1", *H100, "--node-state", "idle", "--slurm"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    assert done.returncode == 1 and "sinfo -h -N: no answer in 5 s" in done.stdout, done.stdout
    assert took < 20, took
