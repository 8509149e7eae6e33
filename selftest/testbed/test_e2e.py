"""End to end on the bed: controller -> SSH -> probe -> nvidia-ml-py or nvidia-smi -> fake NVML.

The health suite runs exactly as a user runs it against a fleet (`pytest --hosts=ansible://...
-n 3`) on five nodes set up by fleet.py (n1 healthy; n2 ECC + reset + a hung storage path;
dgx-gpu3 old driver, a missing GPU read through the nvidia-smi fallback, and `fabric: efa` with
no EFA; gb1 a healthy GB200 tray with IMEX; n4 unreachable), every family held to exactly the
faults it plays. Then the load tests run as users run them (`--level standard` on n1 and n2:
dcgmi diag and nccl-tests built on the nodes from the mirror's tarball, replaying real
outputs), and the report is rendered with `make report` and read back from a real browser.
Run as root:
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

from gpuhealth import registry
from selftest.fakenvml import DEFAULT_SCENARIO, scenario_text
from selftest.suite import REPO, SuiteRun, run_suite

from . import bedlib, fleet, htmlreport, standins

pytestmark = [
    pytest.mark.bed,
    pytest.mark.xdist_group("bed"),  # one bed per machine: keep these tests on one worker
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the test bed needs root (network namespaces, mounts, bridge)"
    ),
]

REPORTS = REPO / "reports" / "testbed"  # kept after the run: JUnit, Allure, HTML, screenshot
STANDARD_REPORTS = REPORTS / "standard"  # the --level standard run's reports
TIMINGS: dict[str, float] = {}
# dgx-gpu3 is named like many real GPU hosts: its node tests (test_x[dgx-gpu3]) and GPU tests
# (test_x[dgx-gpu3-gpu0]) must still be one host, with one probe, on one worker.
LIVE = ("n1", "n2", "dgx-gpu3", "gb1")
QUICK = [c for c in registry.checks().values() if c.level == "quick"]  # not load tests
QUICK_PER_GPU = [c.name for c in QUICK if c.scope == "gpu"]
# What each node must fail at the default level, in every family; everything else of a live
# node passes or skips with its reason.
EXPECTED_FAILURES = {
    "n1": set(),
    "gb1": set(),
    "n2": {"test_ecc_errors[n2-gpu3]", "test_recovery_action[n2-gpu5]", "test_storage_paths[n2]"},
    "dgx-gpu3": {"test_driver_version[dgx-gpu3]", "test_gpu_count[dgx-gpu3]"}
    | {f"test_{name}[dgx-gpu3-gpu7]" for name in QUICK_PER_GPU}
    | {f"test_recovery_action[dgx-gpu3-gpu{i}]" for i in range(8)}
    # The EFA software never ran on dgx-gpu3: no device, no fi_info, no memlock raised for RDMA.
    | {f"test_efa_{name}[dgx-gpu3]" for name in ("device_count", "fi_info", "ports_active")}
    | {"test_memlock_limit[dgx-gpu3]"},
}
STANDARD_FAILURES = {"test_dcgm_diag_gpu[n2-gpu3]", "test_nccl_bandwidth[n2]"}


@dataclass
class FleetRun:
    bed: bedlib.Bed
    suite: SuiteRun
    probes: dict[str, int]  # commands each node's sshd ran during the suite
    facts: dict[str, dict]  # the facts document of each live node

    def tests(self, host: str) -> dict[str, str]:
        """Outcomes of the host's tests, by test id."""
        return {
            name: status
            for name, status in self.suite.outcomes().items()
            if name.endswith(f"[{host}]") or f"[{host}-gpu" in name
        }


def failed(outcomes: dict[str, str]) -> set[str]:
    return {name for name, status in outcomes.items() if status == "failed"}


def expected_failures(host: str, facts: dict) -> set[str]:
    """EXPECTED_FAILURES, plus dgx-gpu3's kernel modules where the host kernel lists modules: the
    driver packages "load" nvidia there, and efa is missing like everything else of EFA."""
    found = set(EXPECTED_FAILURES[host])
    if host == "dgx-gpu3" and facts["system"]["kernel_modules"] is not None:
        found.add("test_kernel_modules[dgx-gpu3]")
    return found


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
        TIMINGS["bed up, 5 nodes"] = time.monotonic() - start
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
        TIMINGS["suite run, 5 hosts, -n 3"] = time.monotonic() - start
        probes = {name: bed.sessions(name) - before[name] for name in LIVE}
        facts = {h: json.loads((REPORTS / "facts" / f"{h}.json").read_text()) for h in LIVE}
        yield FleetRun(bed, suite, probes, facts)


@pytest.fixture(scope="module")
def standard(run):
    """The load tests on n1 and n2, as users start them: `--level standard`."""
    hosts = ",".join(f"ansible://{h}?ansible_inventory={run.bed.inventory}" for h in ("n1", "n2"))
    start = time.monotonic()
    suite = run_suite(
        STANDARD_REPORTS,
        f"--hosts={hosts}",
        "--level",
        "standard",
        "-m",
        "dcgm or nccl or gpud",
        "-n",
        "2",
        env=run.bed.ansible_env(),
    )
    TIMINGS["suite run --level standard, n1 + n2"] = time.monotonic() - start
    return suite


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
    assert verdicts["hosts"] == sorted(["n1", "n2", "dgx-gpu3", "gb1", "n4"])
    facts = run.facts
    assert {host: doc["host"]["hostname"] for host, doc in facts.items()} == {h: h for h in LIVE}
    assert {host: doc["source"] for host, doc in facts.items()} == {
        "n1": "nvml",
        "n2": "nvml",
        # No nvidia-ml-py on dgx-gpu3: the probe fell back to nvidia-smi -q -x.
        "dgx-gpu3": "nvidia-smi",
        "gb1": "nvml",
    }
    assert facts["dgx-gpu3"]["driver"]["version"] == "560.35.03"
    assert facts["n1"]["driver"]["nvml_version"] == "12.570.86.15"


def test_installed_stand_ins_answer_the_probe(run):
    """GPUd from the mirror's release tarball (HTTPS, self-signed) and dcgmi from the DCGM
    package answer on the GPU nodes; nodes that do not expect them are not asked."""
    for host in ("n1", "n2"):
        gpud, dcgm = run.facts[host]["gpud"], run.facts[host]["dcgm_health"]
        assert gpud["address"] == "https://127.0.0.1:15132"
        assert gpud["healthz"] == {"status": "ok", "version": "v1"}
        assert [(s["component"], s["health"]) for s in gpud["states"]] == [("echo", "Healthy")]
        assert run.facts[host]["gpud_events"]["events"] == []
        assert dcgm["health"] == {"overall": "Healthy", "incidents": []}
    assert run.facts["dgx-gpu3"]["gpud"] == {
        "skipped": "GPUd not expected on this host (gpud_installed: false)"
    }
    assert run.facts["dgx-gpu3"]["dcgm_health"] == {
        "skipped": "DCGM not expected on this host (dcgm_installed: false)"
    }


def test_exactly_one_probe_round_trip_per_host(run):
    """Counted by each node's sshd (LogLevel VERBOSE logs every command it starts)."""
    assert run.probes == {"n1": 1, "n2": 1, "dgx-gpu3": 1, "gb1": 1}


def test_healthy_node_passes(run):
    tests = run.tests("n1")
    assert len(tests) == len(registry.names("node")) + 8 * len(registry.names("gpu"))
    assert set(tests.values()) <= {"passed", "skipped"}, run.suite.messages()  # all families
    verdict = run.suite.verdicts["nodes"]["n1"]
    assert verdict["verdict"] == "PASS", verdict
    assert verdict["failed"] == [] and verdict["counts"]["PASS"] > 0


def test_the_gb200_tray_passes_as_a_gb200_with_its_fabric_and_imex(run):
    """gb1: 4 Blackwell GPUs out of PCI order, registered in its NVLink domain, IMEX up: judged
    by the gb200 profile, every test of its 4 GPU slots passes or skips with its reason."""
    tests = run.tests("gb1")
    # ... and the fleet check of its NVLink domain, test_nvlink_domain[gb1]
    assert len(tests) == len(registry.names("node")) + 4 * len(registry.names("gpu")) + 1
    assert set(tests.values()) <= {"passed", "skipped"}, run.suite.messages()
    verdict = run.suite.verdicts["nodes"]["gb1"]
    assert verdict["verdict"] == "PASS" and verdict["gpu_slots"] == 4, verdict
    for name in ("nvlink_fabric_state", "nvlink_fabric_health", "nvlink_errors"):
        assert {tests[f"test_{name}[gb1-gpu{i}]"] for i in range(4)} == {"passed"}
    for name in ("nvlink_clique", "imex_domain"):
        assert tests[f"test_{name}[gb1]"] == "passed", name
    messages = run.suite.messages()
    # The only tray of rack1 in the bed: nothing to compare its NVLink domain with.
    assert tests["test_nvlink_domain[gb1]"] == "skipped"
    assert "the only node of nvlink_domain rack1" in messages["test_nvlink_domain[gb1]"]
    assert "systemctl not available" in messages["test_imex_service[gb1]"]
    facts = run.facts["gb1"]
    assert [g["pci_bus_id"][:8] for g in facts["gpus"]] == [
        "00000008",
        "00000009",
        "00000018",
        "00000019",
    ]
    assert [g["platform"]["module_id"] for g in facts["gpus"]] == [2, 1, 4, 3]
    assert facts["imex"]["domain"]["domain_state"] == "UP"


@pytest.mark.parametrize("host", ["n2", "dgx-gpu3"])
def test_faulty_nodes_fail_exactly_their_faults(run, host):
    tests = run.tests(host)
    expected = expected_failures(host, run.facts[host])
    assert failed(tests) == expected, run.suite.messages()
    assert set(tests.values()) <= {"passed", "skipped", "failed"}  # judged, never broken
    verdict = run.suite.verdicts["nodes"][host]
    assert verdict["verdict"] == "FAIL"
    assert {(f["check"], f["gpu"]) for f in verdict["failed"]} == {
        (name.split("[")[0].removeprefix("test_"), _gpu_of(name, host)) for name in expected
    }


def _gpu_of(test_name: str, host: str) -> int | None:
    """The GPU of a test id of `host`'s (never parsed from the host name: dgx-gpu3 is a host)."""
    slot = test_name.split("[", 1)[1].rstrip("]").removeprefix(host)
    return int(slot.removeprefix("-gpu")) if slot else None


def test_failure_messages_name_what_was_found(run):
    reasons = run.suite.verdicts["nodes"]["dgx-gpu3"]["reasons"]
    # The cause first (the driver gate), and one reason for what all its GPUs share.
    assert "driver 560.35.03 is older than the required 570" in reasons[0]
    assert any(r.startswith("dgx-gpu3 gpu0-6: GPU recovery action not supported") for r in reasons)
    messages = run.suite.messages()
    assert "volatile uncorrected ECC errors 2 > 0" in messages["test_ecc_errors[n2-gpu3]"]
    assert "GPU recovery action is GPU_RESET (1)" in messages["test_recovery_action[n2-gpu5]"]
    assert (
        "1 of 3 storage paths failing: /mnt/datasets/hang.fifo: timed out after 5 s"
        in messages["test_storage_paths[n2]"]
    )
    assert "expected 8 GPUs, found 7" in messages["test_gpu_count[dgx-gpu3]"]
    assert (
        "driver 560.35.03 is older than the required 570"
        in messages["test_driver_version[dgx-gpu3]"]
    )
    assert "predates the GPU recovery action" in messages["test_recovery_action[dgx-gpu3-gpu0]"]
    assert "GPU index 7 missing on dgx-gpu3" in messages["test_temperature[dgx-gpu3-gpu7]"]
    assert "expected at least 1 EFA devices, found 0" in messages["test_efa_device_count[dgx-gpu3]"]
    assert "fi_info is not installed" in messages["test_efa_fi_info[dgx-gpu3]"]
    assert (
        "memlock limit 8192 KB, RDMA over efa needs unlimited"
        in messages["test_memlock_limit[dgx-gpu3]"]
    )
    if "test_kernel_modules[dgx-gpu3]" in expected_failures("dgx-gpu3", run.facts["dgx-gpu3"]):
        assert "efa (" in messages["test_kernel_modules[dgx-gpu3]"]


def test_a_hung_storage_path_costs_one_timeout(run):
    """The FIFO blocks its reader for ever; the probe gives up on it after storage_timeout_s
    (5 s) and the node's probe takes that much longer than n1's, no more."""
    n1, n2 = run.facts["n1"], run.facts["n2"]
    paths = {record["path"]: record for record in n2["storage"]["paths"]}
    hung = paths[fleet.STORAGE_HANG_FIFO]
    assert hung["ok"] is False and hung["error"] == "timed out after 5 s"
    assert 5.0 <= hung["elapsed_s"] < 6.0
    assert all(paths[p]["ok"] for p in ("/mnt/datasets", "/scratch"))
    assert paths["/scratch"]["wrote"] is True
    assert n2["duration_s"] - n1["duration_s"] < 5.0 + 1.5, (n1["duration_s"], n2["duration_s"])


def test_every_skip_says_why(run):
    outcomes, messages = run.suite.outcomes(), run.suite.messages()
    skipped = [name for name, status in outcomes.items() if status == "skipped"]
    assert skipped
    assert all(messages.get(name, "").strip() for name in skipped)
    # H100s retire no pages (they remap rows); the bed's nodes have no systemd.
    assert "not supported" in messages["test_retired_pages[n1-gpu0]"]
    assert "systemctl not available" in messages["test_gpu_services[n1]"]
    assert "not an InfiniBand host (fabric: efa" in messages["test_ib_port_count[dgx-gpu3]"]
    assert "not run at level quick (use --level standard)" in messages["test_nccl_bandwidth[n1]"]


def test_standard_level_runs_the_load_tests_on_the_nodes(run, standard):
    """dcgmi diag and the nccl-tests build on each node replay their node's real recordings:
    n1 passes, n2 fails DCGM on gpu3 (its ECC GPU) and single-node busbw (a slow node)."""
    assert standard.rc == 1, standard.output[-3000:]
    outcomes, messages = standard.outcomes(), standard.messages()
    assert failed(outcomes) == STANDARD_FAILURES, messages
    assert outcomes.pop("test_nccl_multinode[fleet]") == "skipped"  # needs --level full
    assert set(outcomes.values()) == {"passed", "failed"}
    assert {name for name, status in outcomes.items() if status == "passed"} >= {
        "test_dcgm_diag[n1]",
        "test_dcgm_diag[n2]",
        "test_nccl_bandwidth[n1]",
        "test_nccl_data_integrity[n1]",
        "test_nccl_data_integrity[n2]",
        "test_gpud_health[n1]",
        *(f"test_dcgm_diag_gpu[n1-gpu{i}]" for i in range(8)),
    }
    assert "412.00 gigaflops" in messages["test_dcgm_diag_gpu[n2-gpu3]"]
    assert "busbw 365.8 GB/s" in messages["test_nccl_bandwidth[n2]"]
    assert "< 460 GB/s expected, single node" in messages["test_nccl_bandwidth[n2]"]
    nodes = standard.verdicts["nodes"]
    assert nodes["n1"]["verdict"] == "PASS" and nodes["n2"]["verdict"] == "FAIL"
    evidence = STANDARD_REPORTS / "evidence"
    log = (evidence / "n1" / "nccl-all_reduce_perf.log").read_text()
    assert log.startswith(f"$ {fleet.NCCL_TESTS_HOME}/build/all_reduce_perf -b 8 ")
    assert "NCCL 2.25.1 (libnccl.so.2); replaying" in log  # built against the mirror's NCCL
    assert standins.NCCL_HEALTHY in log
    assert (evidence / "n2" / "dcgmi-diag-r2.log").read_text().startswith("$ dcgmi diag -r 2 -j")
    assert TIMINGS["suite run --level standard, n1 + n2"] < 60


def test_unreachable_node_is_reported_and_stops_nothing(run):
    n4 = run.suite.verdicts["nodes"]["n4"]
    assert n4["verdict"] == "UNREACHABLE"
    assert any("ssh failed" in reason for reason in n4["reasons"]), n4
    tests = run.tests("n4")
    # Broken, not failed: no health verdict without facts; load tests skip below their level.
    quick = {f"test_{c.name}" for c in QUICK}
    assert {status for name, status in tests.items() if name.split("[")[0] in quick} == {"error"}
    assert set(tests.values()) == {"error", "skipped"}
    assert not (REPORTS / "facts" / "n4.json").exists()
    assert all(run.suite.verdicts["nodes"][h]["counts"]["PASS"] > 0 for h in LIVE)


def test_html_report_shows_the_failures(run):
    start = time.monotonic()
    rendered, index, screenshot = htmlreport.render(REPORTS)
    TIMINGS["HTML: make report + Chromium (DOM, screenshot)"] = time.monotonic() - start
    assert index == REPORTS / "allure-report" / "index.html"
    shown_failed = {name for name, status in rendered.items() if status == "failed"}
    for host in ("n2", "dgx-gpu3"):
        assert expected_failures(host, run.facts[host]) <= shown_failed, sorted(shown_failed)
    assert shown_failed == failed(run.suite.outcomes())  # the page and JUnit agree
    broken = {name for name, status in rendered.items() if status == "broken"}
    assert broken == {name for name, status in run.tests("n4").items() if status == "error"}
    assert screenshot.stat().st_size > 20_000  # a rendered page, not a blank one


# ---------------------------------------------------------------- three nights of history

NIGHTS = REPORTS / "nights"  # one reports folder per night, the store and Allure history
NIGHT_HOSTS = ("n1", "n2")
# Night 3 on n1: 2 more remapped rows on gpu2 (none pending), thousands more corrected ECC on
# gpu3, gpu4 replaced (a new serial), and all_reduce 15 % slower, still above the floor.
NIGHT3_N1 = {
    "extends": "healthy-h100x8",
    "gpu": {
        2: {"remapped_rows": {"correctable": 2}},
        3: {"ecc": {"aggregate": {"dram_corrected": 4000}}},
        4: {"serial": "1650124039999"},
    },
}
NIGHT3_REGRESSIONS = {
    ("gpu_regression", 2, "remapped_rows_correctable", 0.0, 2.0),
    ("gpu_regression", 3, "ecc_corrected_aggregate", 0.0, 4000.0),
    ("load_regression", None, "nccl_busbw_gbps", 476.53, 405.05),
}


def _scenario(name_or_dict, tools: dict[str, str]) -> str:
    text = scenario_text(name_or_dict)
    return text + "".join(f"{key}={value}\n" for key, value in tools.items())


@pytest.fixture(scope="module")
def nights(run):
    """A nightly job three times on n1 and n2 (n2 healed for it), as the templates in ci/
    run it: `--level standard` with a run store, then `make report` with Allure's history.
    The fleet's own busbw floor is 400 GB/s, and a baseline takes 2 good runs (3 by default:
    two nights are all this test has before the third)."""
    bed = run.bed
    healthy = _scenario("healthy-h100x8", {"dcgm.diag": standins.DCGM_H100X8})
    for host in NIGHT_HOSTS:
        bed.ssh(host, f"cat > {DEFAULT_SCENARIO}", input=healthy)
    bed.set_host_vars(
        {
            host: {
                "storage_paths": fleet.STORAGE_PATHS,  # n2 without its hung path
                "nccl_allreduce_min_busbw_gbps": 400,
                "history_min_runs": 2,
            }
            for host in NIGHT_HOSTS
        }
    )
    hosts = ",".join(f"ansible://{h}?ansible_inventory={bed.inventory}" for h in NIGHT_HOSTS)
    found = []
    for night in (1, 2, 3):
        if night == 3:
            tools = {
                "dcgm.diag": standins.DCGM_H100X8,
                "nccl.all_reduce_perf": standins.NCCL_SLOWER,
            }
            bed.ssh("n1", f"cat > {DEFAULT_SCENARIO}", input=_scenario(NIGHT3_N1, tools))
        start = time.monotonic()
        reports = NIGHTS / f"night{night}"
        suite = run_suite(
            reports,
            f"--hosts={hosts}",
            "--level",
            "standard",
            "-n",
            "2",
            f"--history={NIGHTS / 'history.sqlite'}",
            "--history-create",  # as nightly.sh: its state folder's store starts on night 1
            env=bed.ansible_env(),
        )
        htmlreport.make_report(reports, NIGHTS / "allure-history.jsonl")
        TIMINGS[f"night {night}: suite --level standard + make report"] = time.monotonic() - start
        found.append(suite)
    return found


def test_nights_one_and_two_are_healthy(nights):
    for suite in nights[:2]:
        assert suite.rc == 0, suite.output[-3000:]
        assert {h: suite.verdicts["nodes"][h]["verdict"] for h in NIGHT_HOSTS} == {
            "n1": "PASS",
            "n2": "PASS",
        }
    first, second = (suite.messages() for suite in nights[:2])
    assert "): no baseline yet (0 runs)" in first["test_gpu_regression[n1-gpu0]"]
    assert "n1: no baseline yet (0 runs)" in first["test_load_regression[n1]"]
    # Night 2 judges the counters (and DCGM's results) against night 1; busbw waits for a
    # second good run.
    assert "test_load_regression[n1]" not in second
    outcomes = nights[1].outcomes()
    assert outcomes["test_gpu_regression[n1-gpu0]"] == outcomes["test_load_regression[n1]"]
    assert outcomes["test_load_regression[n1]"] == "passed"


def test_night_three_names_exactly_what_changed_on_n1(nights):
    third = nights[2]
    assert third.rc == 1, third.output[-3000:]  # the regressions fail the nightly job
    nodes = third.verdicts["nodes"]
    assert nodes["n2"]["verdict"] == "PASS" and nodes["n2"]["regressions"] == []
    n1 = nodes["n1"]
    assert n1["verdict"] == "FAIL"
    assert {
        (r["check"], r["gpu"], r["metric"], r["baseline"], r["value"]) for r in n1["regressions"]
    } == NIGHT3_REGRESSIONS
    assert {r["action"] for r in n1["regressions"]} == {"INSPECT"}
    failed = {name for name, status in third.outcomes().items() if status == "failed"}
    assert failed == {
        "test_gpu_regression[n1-gpu2]",
        "test_gpu_regression[n1-gpu3]",
        "test_load_regression[n1]",
    }
    assert [n for n in n1["notes"] if "another GPU" in n] == [
        "gpu4 is another GPU since the last run: serial 1650124039999, was 1650124031504 "
        "(a new GPU); its baseline restarts"
    ]
    messages = third.messages()
    assert (
        "rows remapped for correctable errors 0 -> 2 since the last run"
        in (messages["test_gpu_regression[n1-gpu2]"])
    )
    assert (
        "correctable ECC errors +4000 since the last run"
        in (messages["test_gpu_regression[n1-gpu3]"])
    )
    assert (
        "single-node all_reduce busbw 405.1 GB/s is 15.0% below its baseline 476.5 GB/s "
        "(median of 2 good runs)" in messages["test_load_regression[n1]"]
    )
    assert (
        "): no baseline yet (0 runs); gpu4 is another GPU"
        in (messages["test_gpu_regression[n1-gpu4]"])
    )
    assert "regressions against the nodes' own history (3):" in third.output


def test_allure_shows_each_tests_history(nights):
    index = NIGHTS / "night3" / "allure-report" / "index.html"
    start = time.monotonic()
    # Newest first: night 2 judged gpu2's counters and passed, night 1 had no baseline.
    assert htmlreport.test_history(index, "test_gpu_regression[n1-gpu2]") == [
        "passed",
        "skipped",
    ]
    assert htmlreport.test_history(index, "test_ecc_errors[n1-gpu3]") == ["passed", "passed"]
    TIMINGS["HTML: Allure history of two tests in Chromium"] = time.monotonic() - start
