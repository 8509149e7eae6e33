"""gpuhealth.api, the in-process check a training script makes, under the fake NVML: the
probe child inherits this process's environment, which points it at the fake library and a
scenario; a probe wrapper counts the runs and can replay the last facts (fast judgements for
the watcher's timing). The README's training-script example is cut out and run as written."""

from __future__ import annotations

import copy
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuhealth import api, local
from gpuhealth.config import ConfigError
from gpuhealth.transport import ProbeError
from selftest.fakenvml import nvml_env, write_scenario
from selftest.suite import REPO

H100 = {"profile": "h100-sxm", "expected_gpus": 8}


class Probes:
    """Stands in for local.run_local_probe: runs the real probe (or replays its last facts),
    counting the runs and recording each deadline."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.runs = 0
        self.timeouts: list[float] = []
        self.facts: dict[str, Any] | None = None
        self.replay = False
        self.delay_s = 0.0
        self.lock = threading.Lock()

    def __call__(self, config: dict[str, Any], python: str, timeout_s: float) -> dict[str, Any]:
        with self.lock:
            self.runs += 1
            self.timeouts.append(timeout_s)
        time.sleep(self.delay_s)
        if self.replay and self.facts is not None:
            return copy.deepcopy(self.facts)
        self.facts = self.real(config, python, timeout_s)
        return self.facts


@pytest.fixture
def node(monkeypatch, fake_nvml_lib, tmp_path):
    """The probe wrapper; `serve(scenario)` makes the fake NVML serve that scenario."""
    probes = Probes(local.run_local_probe)
    monkeypatch.setattr(local, "run_local_probe", probes)

    def serve(scenario: str) -> None:
        env = nvml_env(fake_nvml_lib.parent, write_scenario(scenario, tmp_path / "fake.conf"))
        for key in ("LD_LIBRARY_PATH", "FAKE_NVML_SCENARIO"):
            monkeypatch.setenv(key, env[key])

    probes.serve = serve  # type: ignore[attr-defined]
    return probes


def failed(verdict: api.Verdict) -> set[tuple[str, int | None]]:
    return {(f.check, f.gpu) for f in verdict.failed_checks}


def test_a_busy_healthy_node_is_healthy_in_use(node):
    node.serve("busy-h100x8")
    verdict = api.check(**H100)
    assert verdict.healthy and bool(verdict), verdict.reasons
    assert (verdict.verdict, verdict.failed_checks, verdict.actions) == ("PASS", (), ())
    assert (verdict.node_state, verdict.node_state_source) == ("in-use", "requested")
    assert verdict.checked_at.tzinfo is not None and verdict.duration_s > 0
    assert node.timeouts == [local.DEFAULT_TIMEOUT_S]


def test_a_busy_node_judged_idle_fails_on_its_processes(node):
    node.serve("busy-h100x8")
    verdict = api.check(node_state="idle", timeout_s=11, **H100)  # the reclaim waits 1 s
    assert not verdict and verdict.verdict == "FAIL"
    assert {("idle_processes", gpu) for gpu in range(8)} <= failed(verdict)
    assert verdict.node_state == "idle"


def test_ecc_errors_on_gpu3_fail_the_node_and_gpu3_only(node):
    node.serve("busy-ecc-gpu3")
    whole = api.check(**H100)
    assert not whole and whole.verdict == "FAIL"
    assert failed(whole) == {("ecc_errors", 3)}
    assert whole.actions == ("RESET_GPU",)
    assert whole.failed_checks[0].message.startswith(f"{whole.host} gpu3 (GPU-")
    assert whole.headline.startswith(f"FAIL: {whole.host} gpu3 (")
    node.replay = True  # the same facts, judged for one GPU
    gpu3, gpu2 = api.check(3, **H100), api.check(2, **H100)
    assert (gpu3.healthy, failed(gpu3), gpu3.gpu) == (False, {("ecc_errors", 3)}, 3)
    assert (gpu2.healthy, gpu2.verdict, gpu2.gpu) == (True, "PASS", 2)
    absent = api.check(9, **H100)
    assert (absent.healthy, failed(absent), absent.actions) == (
        False,
        {("gpu_index", 9)},
        ("FIX_CONFIG",),
    )


def test_quick_check_judges_the_faults_in_use_on_a_short_deadline(node):
    node.serve("busy-ecc-gpu3")
    verdict = api.quick_check(**H100)
    assert not verdict and failed(verdict) == {("ecc_errors", 3)}
    assert verdict.node_state == "in-use"
    assert node.timeouts == [api.QUICK_TIMEOUT_S]


@pytest.mark.parametrize(
    ("error", "check", "message"),
    [
        (ProbeError("probe killed after 2 s", unreachable=False), "probe", "the probe failed"),
        (RuntimeError("a bug"), "check", "RuntimeError: a bug"),
    ],
    ids=["probe-failed", "bug"],
)
def test_a_failed_judgement_is_an_unhealthy_verdict_never_an_exception(
    monkeypatch, error, check, message
):
    def broken(config: dict[str, Any], python: str, timeout_s: float) -> dict[str, Any]:
        raise error

    monkeypatch.setattr(local, "run_local_probe", broken)
    verdict = api.check(**H100)
    assert (verdict.healthy, verdict.verdict, verdict.actions) == (False, "FAIL", ("RERUN",))
    assert [f.check for f in verdict.failed_checks] == [check]
    assert message in verdict.failed_checks[0].message
    assert verdict.node_state is None


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda: api.check(node_state="busy"), ValueError, "idle, in-use, auto"),
        (lambda: api.check(profile="nosuch"), ConfigError, "unknown profile 'nosuch'"),
        (lambda: api.check(-1), ValueError, "gpu must be a GPU index"),
        (lambda: api.quick_check(timeout_s=0), ValueError, "timeout_s"),
        (lambda: api.Watcher(interval_s=0), ValueError, "interval_s"),
        (lambda: api.Watcher(profile="nosuch"), ConfigError, "unknown profile"),
    ],
    ids=["node-state", "profile", "gpu", "timeout", "interval", "watcher-profile"],
)
def test_bad_arguments_raise_before_any_probe(node, call, error, text):
    with pytest.raises(error, match=re.escape(text)):
        call()
    assert node.runs == 0


def wait_for(condition: Any, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_the_watcher_calls_on_failure_once_per_failing_judgement_and_survives_it(node, caplog):
    node.serve("busy-ecc-gpu3")
    node.replay = True
    calls: list[api.Verdict] = []

    def on_failure(verdict: api.Verdict) -> None:
        calls.append(verdict)
        if len(calls) == 1:
            raise RuntimeError("the callback broke")
        if len(calls) == 2:
            sys.exit(3)  # ends no process from the watcher's thread: logged too

    watcher = api.Watcher(interval_s=0.05, on_failure=on_failure, **H100)
    with caplog.at_level(logging.ERROR, logger="gpuhealth.api"), watcher:
        wait_for(lambda: len(calls) >= 4)
    assert len(calls) == node.runs  # stopped: no judgement in flight any more
    assert all(not v and failed(v) == {("ecc_errors", 3)} for v in calls)
    assert watcher.latest is calls[-1]
    logged = caplog.text
    assert "on_failure raised; the watcher goes on" in logged and "the callback broke" in logged
    assert "on_failure called sys.exit()" in logged


def test_the_watcher_stops_at_once_between_judgements(node):
    node.serve("busy-h100x8")
    failures: list[api.Verdict] = []
    watcher = api.Watcher(interval_s=3600, on_failure=failures.append, **H100).start()
    assert watcher.start() is watcher  # started once
    wait_for(lambda: watcher.latest is not None)
    begin = time.monotonic()
    watcher.stop()
    assert time.monotonic() - begin < 1.0
    assert not any(t.name == "gpuhealth-watcher" and t.is_alive() for t in threading.enumerate())
    assert watcher.latest is not None and watcher.latest.healthy and failures == []
    assert node.runs == 1


def test_concurrent_checks_share_one_probe(node):
    node.serve("busy-ecc-gpu3")
    node.delay_s = 0.5  # the judgement is in flight while the other threads arrive
    failures: list[api.Verdict] = []
    watcher = api.Watcher(on_failure=failures.append, **H100)
    barrier = threading.Barrier(4)
    verdicts: list[api.Verdict] = []

    def ask() -> None:
        barrier.wait()
        verdicts.append(watcher.check())

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert node.runs == 1 and len(verdicts) == 4
    assert all(v is verdicts[0] for v in verdicts) and not verdicts[0]
    assert failures == [verdicts[0]]  # one judgement, one call
    assert watcher.check() is not verdicts[0] and node.runs == 2  # then a new judgement


def test_importing_the_api_loads_neither_pytest_nor_grpc():
    code = "import json, sys, gpuhealth.api; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    ).stdout
    roots = {name.split(".")[0] for name in json.loads(out)}
    assert roots & {"pytest", "_pytest", "grpc", "testinfra", "pluggy"} == set()


# ---------------------------------------------------------------- the README's example

STUB_TORCH = """
import os
import shutil


def init_process_group(backend, **options):
    print("init_process_group", backend, flush=True)
    broken = os.environ.get("STUB_BREAK_NODE")  # the node breaks once the job has started
    if broken:
        shutil.copyfile(broken, os.environ["FAKE_NVML_SCENARIO"])
"""

# Runs the example as written, with its training loop stood in by a sleep when asked.
RUNNER = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("train", sys.argv[1])
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
if len(sys.argv) > 2:
    train.train = lambda: time.sleep(float(sys.argv[2]))
train.main()
"""


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("\n### In a training script: the Python API\n")
    section = text[start : text.index("\n## ", start)]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def run_example(lib: Path, tmp: Path, scenario: str, *args: str, breaks_into: str = "") -> Any:
    (tmp / "torch").mkdir(exist_ok=True)
    (tmp / "torch" / "__init__.py").write_text("")
    (tmp / "torch" / "distributed.py").write_text(STUB_TORCH)
    (tmp / "train.py").write_text(readme_example())
    (tmp / "runner.py").write_text(RUNNER)
    env = nvml_env(lib.parent, write_scenario(scenario, tmp / "fake.conf"))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(REPO / "src")])
    if breaks_into:
        env["STUB_BREAK_NODE"] = str(write_scenario(breaks_into, tmp / "broken.conf"))
    return subprocess.run(
        [sys.executable, str(tmp / "runner.py"), str(tmp / "train.py"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_readme_example_joins_a_healthy_node(fake_nvml_lib, tmp_path):
    done = run_example(fake_nvml_lib, tmp_path, "healthy-h100x8")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == "init_process_group nccl\n"
    assert "gpuhealth" not in done.stderr, done.stderr


def test_the_readme_example_does_not_join_with_a_faulty_gpu(fake_nvml_lib, tmp_path):
    done = run_example(fake_nvml_lib, tmp_path, "busy-ecc-gpu3")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "init_process_group" not in done.stdout
    assert "gpuhealth: not joining the job: FAIL: " in done.stderr
    assert "[ecc_errors]" in done.stderr


def test_the_readme_example_leaves_when_the_node_breaks_while_training(fake_nvml_lib, tmp_path):
    begin = time.monotonic()
    done = run_example(fake_nvml_lib, tmp_path, "healthy-h100x8", "60", breaks_into="busy-ecc-gpu3")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == "init_process_group nccl\n"
    assert re.search(r"gpuhealth: FAIL: \S+ gpu3 .*\['RESET_GPU'\]", done.stderr), done.stderr
    assert time.monotonic() - begin < 50  # the watcher's first judgement, not the sleep
