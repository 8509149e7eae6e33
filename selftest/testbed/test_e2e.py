"""End to end on the bed: controller -> SSH -> probe -> nvidia-ml-py or nvidia-smi -> fake NVML.

The health suite runs exactly as a user runs it against a fleet (`pytest --hosts=ansible://...
-n 3`) on four nodes set up by fleet.py (n1 healthy, n2 ECC + reset, n3 old driver and a missing
GPU through the nvidia-smi fallback, n4 unreachable); then the report is rendered with
`make report` and read back from a real browser. Run as root:
``.venv/bin/pytest -c selftest/pytest.ini selftest/testbed/test_e2e.py -q -s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass

import pytest

from gpuhealth import checks
from selftest.suite import REPO, SuiteRun, run_suite

from . import bedlib, fleet, htmlreport

pytestmark = [
    pytest.mark.bed,
    pytest.mark.xdist_group("bed"),  # one bed per machine: keep these tests on one worker
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the test bed needs root (network namespaces, mounts, bridge)"
    ),
]

REPORTS = REPO / "reports" / "testbed"  # kept after the run: JUnit, Allure, HTML, screenshot
TIMINGS: dict[str, float] = {}
LIVE = ("n1", "n2", "n3")
# The GPU family (gpuhealth.checks.gpu: tests/test_node.py, tests/test_gpu.py) is what this
# bed's scenarios are about; other families are asserted where noted below.
GPU_CHECKS = {c.name for c in checks.REGISTRY.values() if c.fn.__module__ == "gpuhealth.checks.gpu"}
GPU_TEST_NAMES = {f"test_{name}" for name in GPU_CHECKS}
NODE_GPU_CHECKS = [name for name in checks.names("node") if name in GPU_CHECKS]
PER_GPU = [name for name in checks.names("gpu") if name in GPU_CHECKS]
EXPECTED_FAILURES = {  # n1: none, in any family
    "n2": {"test_ecc_errors[n2-gpu3]", "test_recovery_action[n2-gpu5]"},
    "n3": {"test_driver_version[n3]", "test_gpu_count[n3]"}
    | {f"test_{name}[n3-gpu7]" for name in PER_GPU}
    | {f"test_recovery_action[n3-gpu{i}]" for i in range(8)},
}
# Not asserted yet, set up already (fleet.py): the storage hang on n2 and the missing EFA on
# n3 belong to the storage and fabric families. Until their expectations are added here, only
# the GPU checks (gpuhealth.checks.gpu) of n2 and n3 are held to EXPECTED_FAILURES.


@dataclass
class FleetRun:
    bed: bedlib.Bed
    suite: SuiteRun
    probes: dict[str, int]  # commands each node's sshd ran during the suite

    def tests(self, host: str) -> dict[str, str]:
        """Outcomes of the host's tests, by test id."""
        return {
            name: status
            for name, status in self.suite.outcomes().items()
            if name.endswith(f"[{host}]") or f"[{host}-gpu" in name
        }


def gpu_family(outcomes: dict[str, str]) -> dict[str, str]:
    return {name: s for name, s in outcomes.items() if name.split("[")[0] in GPU_TEST_NAMES}


def failed(outcomes: dict[str, str]) -> set[str]:
    return {name for name, status in outcomes.items() if status == "failed"}


@pytest.fixture(scope="module")
def run():
    bedlib.become_subreaper()  # reap detached bed processes even if PID 1 does not
    start = time.monotonic()
    bedlib.ensure_rootfs()
    TIMINGS["rootfs (cached, or built now)"] = time.monotonic() - start
    shutil.rmtree(REPORTS, ignore_errors=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(bedlib.exclusive())
        stack.callback(_down)
        start = time.monotonic()
        bed = fleet.up()
        TIMINGS["bed up, 4 nodes"] = time.monotonic() - start
        TIMINGS.update(fleet.provision(bed))
        before = {name: bed.sessions(name) for name in LIVE}
        start = time.monotonic()
        suite = run_suite(
            REPORTS,
            f"--hosts=ansible://all?ansible_inventory={bed.inventory}",
            "-n",
            "3",
            env=bed.ansible_env(),
        )
        TIMINGS["suite run, 4 hosts, -n 3"] = time.monotonic() - start
        probes = {name: bed.sessions(name) - before[name] for name in LIVE}
        yield FleetRun(bed, suite, probes)


def _down() -> None:
    start = time.monotonic()
    bedlib.down()
    TIMINGS["bed down"] = time.monotonic() - start
    cold = bedlib.rootfs_build_seconds()
    print("\n-- end-to-end timings --")
    print(f"  {'rootfs cold build (recorded when built)':46} {cold or float('nan'):7.2f}s")
    for what, secs in TIMINGS.items():
        print(f"  {what:46} {secs:7.2f}s")
    assert bedlib.leftovers() == []


def test_suite_ran_over_ssh_on_every_host(run):
    assert run.suite.rc == 1, run.suite.output[-3000:]  # failures found: exit status 1
    verdicts = run.suite.verdicts
    assert verdicts["hosts"] == ["n1", "n2", "n3", "n4"]
    facts = {host: json.loads((REPORTS / "facts" / f"{host}.json").read_text()) for host in LIVE}
    assert {host: doc["host"]["hostname"] for host, doc in facts.items()} == {h: h for h in LIVE}
    assert {host: doc["source"] for host, doc in facts.items()} == {
        "n1": "nvml",
        "n2": "nvml",
        "n3": "nvidia-smi",  # no nvidia-ml-py on n3: the probe fell back to nvidia-smi -q -x
    }
    assert facts["n3"]["driver"]["version"] == "560.35.03"
    assert facts["n1"]["driver"]["nvml_version"] == "12.570.86.15"


def test_exactly_one_probe_round_trip_per_host(run):
    """Counted by each node's sshd (LogLevel VERBOSE logs every command it starts)."""
    assert run.probes == {"n1": 1, "n2": 1, "n3": 1}


def test_healthy_node_passes(run):
    tests = run.tests("n1")
    assert len(gpu_family(tests)) == len(NODE_GPU_CHECKS) + 8 * len(PER_GPU)
    assert set(tests.values()) <= {"passed", "skipped"}, run.suite.messages()  # all families
    verdict = run.suite.verdicts["nodes"]["n1"]
    assert verdict["verdict"] == "PASS", verdict
    assert verdict["failed"] == [] and verdict["counts"]["PASS"] > 0


@pytest.mark.parametrize("host", ["n2", "n3"])
def test_faulty_nodes_fail_exactly_their_faults(run, host):
    tests = run.tests(host)
    gpu = gpu_family(tests)
    assert failed(gpu) == EXPECTED_FAILURES[host], run.suite.messages()
    assert set(gpu.values()) <= {"passed", "skipped", "failed"}
    assert "error" not in tests.values()  # other families: judged, never broken
    verdict = run.suite.verdicts["nodes"][host]
    assert verdict["verdict"] == "FAIL"
    assert {(f["check"], f["gpu"]) for f in verdict["failed"] if f["check"] in GPU_CHECKS} == {
        (name.split("[")[0].removeprefix("test_"), _gpu_of(name))
        for name in EXPECTED_FAILURES[host]
    }


def _gpu_of(test_name: str) -> int | None:
    params = test_name.split("[")[1].rstrip("]")
    return int(params.rsplit("-gpu", 1)[1]) if "-gpu" in params else None


def test_failure_messages_name_what_was_found(run):
    messages = run.suite.messages()
    assert "volatile uncorrected ECC errors 2 > 0" in messages["test_ecc_errors[n2-gpu3]"]
    assert "GPU recovery action is GPU_RESET (1)" in messages["test_recovery_action[n2-gpu5]"]
    assert "expected 8 GPUs, found 7" in messages["test_gpu_count[n3]"]
    assert "driver 560.35.03 is older than the required 570" in messages["test_driver_version[n3]"]
    assert "predates the GPU recovery action" in messages["test_recovery_action[n3-gpu0]"]
    assert "GPU index 7 missing on n3" in messages["test_temperature[n3-gpu7]"]


def test_every_skip_says_why(run):
    outcomes, messages = run.suite.outcomes(), run.suite.messages()
    skipped = [name for name, status in outcomes.items() if status == "skipped"]
    assert skipped
    assert all(messages.get(name, "").strip() for name in skipped)
    # H100s retire no pages (they remap rows); nvidia-smi -q does not report NVLink.
    assert "not supported" in messages["test_retired_pages[n1-gpu0]"]
    assert "NVLink" in messages["test_nvlink[n3-gpu0]"]


def test_unreachable_node_is_reported_and_stops_nothing(run):
    n4 = run.suite.verdicts["nodes"]["n4"]
    assert n4["verdict"] == "UNREACHABLE"
    assert any("ssh failed" in reason for reason in n4["reasons"]), n4
    tests = run.tests("n4")
    # Broken, not failed: no health verdict without facts (tests that need none may skip).
    assert set(gpu_family(tests).values()) == {"error"}
    assert set(tests.values()) <= {"error", "skipped"}
    assert not (REPORTS / "facts" / "n4.json").exists()
    assert all(run.suite.verdicts["nodes"][h]["counts"]["PASS"] > 0 for h in LIVE)


def test_html_report_shows_the_failures(run):
    start = time.monotonic()
    rendered, index, screenshot = htmlreport.render(REPORTS)
    TIMINGS["HTML: make report + Chromium (DOM, screenshot)"] = time.monotonic() - start
    assert index == REPORTS / "allure-report" / "index.html"
    shown_failed = {name for name, status in rendered.items() if status == "failed"}
    for host in ("n2", "n3"):
        assert EXPECTED_FAILURES[host] <= shown_failed, sorted(shown_failed)
    assert shown_failed == failed(run.suite.outcomes())  # the page and JUnit agree
    broken = {name for name, status in rendered.items() if status == "broken"}
    assert broken == {name for name, status in run.tests("n4").items() if status == "error"}
    assert screenshot.stat().st_size > 20_000  # a rendered page, not a blank one
