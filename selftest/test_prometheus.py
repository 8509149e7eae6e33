"""The Prometheus textfile (gpuhealth.integrations.prometheus): what it says, how it is written,
and a real scrape.

The rendering is checked in process: the verdict is one-hot and NOT_CHECKED never reads as
PASS, check statuses have one encoding in which only a pass is 0, every measured value is
exported under a name with its unit (or left out on purpose), hostile host names are escaped,
the file is replaced atomically under a concurrent reader and an unwritable directory is one
clean error. Then the real thing: Debian's node_exporter is started on a loopback port with its
textfile collector on a folder that `gpuhealth node-check` (fake NVML scenarios) and the suite
(`--facts`, `--no-history`) write to; its /metrics is parsed with prometheus_client's parser
and must pass `promtool check metrics`; the alert rules pass `promtool check rules` and their
unit tests (`promtool test rules`), which must catch a rule that alerts on a skipped check.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuhealth import registry
from gpuhealth.checks import NodeView
from gpuhealth.history.run import measured, measured_load
from gpuhealth.integrations import prometheus
from gpuhealth.integrations.prometheus import Run
from gpuhealth.local import LocalVerdict
from gpuhealth.metrics import COUNTER, GAUGE
from gpuhealth.report import NodeVerdict, Outcome
from selftest.facts import healthy_h100, limits, write_facts
from selftest.facts import probe as run_probe
from selftest.fakenvml import nvml_env, write_scenario
from selftest.suite import REPO, run_suite

DEPLOY = REPO / "deploy" / "prometheus"
TREE = Path(__file__).parent / "data" / "system" / "hgx-h100-2socket"
IB_ROOT = Path(__file__).parent / "data" / "efa" / "h100-ib-root"
NODE_TOOLS = Path(__file__).parent / "standins" / "node"
MISSING = "is not installed: `make test-deps` installs it (Debian packages {})"

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def tool(names: tuple[str, ...], package: str) -> str:
    """The path of a required program; a clear failure (never a skip) when it is missing."""
    for name in names:
        found = shutil.which(name) or shutil.which(name, path="/usr/bin:/usr/sbin")
        if found:
            return found
    pytest.fail(f"{names[0]} " + MISSING.format(package), pytrace=False)


def node_exporter_bin() -> str:
    return tool(("prometheus-node-exporter", "node_exporter"), "prometheus-node-exporter")


def promtool() -> str:
    return tool(("promtool",), "prometheus")


def parse(text: str) -> Series:
    """Every sample of an exposition text by (name, labels); a series twice is an error."""
    found: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in found, f"series twice: {key}"
            found[key] = sample.value
    return found


def value(found: Series, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


def run_info(found: Any, mode: str) -> float:
    """gpuhealth_run_info of a quick-level run in `mode`, with this gpuhealth's version."""
    return value(
        found, "gpuhealth_run_info", mode=mode, level="quick", version=prometheus._version()
    )


def named(found: Series, name: str) -> dict[frozenset[tuple[str, str]], float]:
    return {labels: v for (n, labels), v in found.items() if n == name}


def check_metrics(text: str) -> None:
    """`promtool check metrics` (the Prometheus linter) must have nothing to say."""
    lint = subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), (
        lint.stdout + lint.stderr
    )


def a_run(verdicts: list[NodeVerdict], **kwargs: Any) -> Run:
    return Run("suite", "quick", 1_700_000_000.0, 12.5, True, verdicts, **kwargs)


def node_measured(view: NodeView, *sections: str) -> dict[str, Any]:
    """What the suite keeps of a host for the textfile: history's rows, load test rows,
    readings."""
    found = measured(view)
    for section in sections:
        found["rows"] += measured_load(view, section)["rows"]
    found["rows"] += prometheus.readings(view)
    return found


# ---------------------------------------------------------------- rendering


def test_every_measured_value_is_exported_or_left_out_on_purpose():
    """Every metric a family declares is exported, except the idle readings (the readings are
    exported as read); a reading is exported and never judged."""
    declared = registry.metrics()
    exported = prometheus.exports()
    assert set(declared) - set(exported) == {"idle_temperature_c", "idle_power_w"}
    assert {n for n, m in declared.items() if m.rule == "reading"} == {
        "temperature_c",
        "power_draw_w",
    }
    names = [how.name for how in exported.values()]
    assert len(names) == len(set(names)), "two metrics exported under one name"
    for how in exported.values():
        assert not how.name.endswith("_total"), "the exposition adds _total to counters"
        assert how.kind in (GAUGE, COUNTER)
    units = {"temperature_c": "_celsius", "power_draw_w": "_watts", "nccl_busbw_gbps": "_gbps"}
    for name, suffix in units.items():
        assert exported[name].name.endswith(suffix)
    assert prometheus.exported("kernel_log_until") is None  # a cursor, not a value
    assert prometheus.exported("ib.mlx5_0.1.symbol_error") is exported["ib.*.symbol_error"]


def test_verdict_is_one_hot_and_only_pass_reads_pass():
    verdicts = [NodeVerdict(f"h-{v}", v) for v in prometheus.VERDICTS]
    verdicts.append(NodeVerdict("h-odd", "SOMETHING_NEW"))
    found = parse(prometheus.render(a_run(verdicts)).decode())
    series = named(found, "gpuhealth_node_verdict")
    assert len(series) == len(verdicts) * len(prometheus.VERDICTS)
    for node in verdicts:
        ones = [dict(k)["verdict"] for k, v in series.items() if dict(k)["host"] == node.host and v]
        expected = node.verdict if node.verdict in prometheus.VERDICTS else "FAIL"
        assert ones == [expected]
    assert value(found, "gpuhealth_node_verdict", host="h-NOT_CHECKED", verdict="PASS") == 0
    assert value(found, "gpuhealth_node_verdict", host="h-odd", verdict="PASS") == 0


def test_node_state_is_one_hot_and_absent_where_undecided():
    busy, idle, failed = NodeVerdict("busy"), NodeVerdict("idle"), NodeVerdict("failed", "FAIL")
    busy.node_state, idle.node_state = "in-use", "idle"
    found = parse(prometheus.render(a_run([busy, idle, failed])).decode())
    assert value(found, "gpuhealth_node_state", host="busy", state="in-use") == 1
    assert value(found, "gpuhealth_node_state", host="busy", state="idle") == 0
    assert value(found, "gpuhealth_node_state", host="idle", state="idle") == 1
    assert not [k for k in named(found, "gpuhealth_node_state") if dict(k)["host"] == "failed"]


def test_check_status_encoding_only_a_pass_is_zero():
    outcomes = [
        ("n1", 0, "ecc_errors", "PASS"),
        ("n1", 1, "temperature", "WARN"),
        ("n1", 2, "retired_pages", "SKIP"),
        ("n1", 3, "ecc_errors", "FAIL"),
        ("n1", None, "probe", "ERROR"),
        ("n1", None, "numactl", "NOT_A_STATUS"),
        # The same check twice for one GPU keeps the worse status, whatever the order.
        ("n1", 4, "power", "FAIL"),
        ("n1", 4, "power", "PASS"),
        ("n1", 10, "power", "PASS"),
    ]
    text = prometheus.render(a_run([NodeVerdict("n1", "FAIL")], outcomes=outcomes)).decode()
    found = parse(text)
    status = {
        (dict(k)["gpu"], dict(k)["check"]): v
        for k, v in named(found, "gpuhealth_check_status").items()
    }
    assert status == {
        ("0", "ecc_errors"): 0,
        ("1", "temperature"): 1,
        ("2", "retired_pages"): 2,
        ("3", "ecc_errors"): 3,
        ("", "probe"): 4,
        ("", "numactl"): 4,
        ("4", "power"): 3,
        ("10", "power"): 0,
    }
    assert "0 PASS, 1 WARN, 2 SKIP" in text and "3 FAIL, 4 ERROR" in text
    # Node checks first, then GPUs in numeric order (not 0, 1, 10, 2).
    lines = [line for line in text.splitlines() if line.startswith("gpuhealth_check_status")]
    gpus = [line.split('gpu="')[1].split('"')[0] for line in lines]
    assert gpus == ["", "", "0", "1", "2", "3", "4", "10"]


def test_measurements_of_a_node_with_units_and_unknowns_left_out():
    facts = healthy_h100()
    facts["gpus"][3]["ecc"]["aggregate"]["uncorrected"] = 2
    facts["gpus"][5]["temperature_c"] = None  # not read: no series, never 0
    facts["gpus"][5]["power_draw_w"] = "N/A"
    facts["gpus"][6]["utilization_gpu_pct"] = 100  # busy: still has its readings
    facts["fabric"] = ib_section()
    facts["nccl"] = {
        "nodes": 1,
        "run": {
            "collective": "all_reduce",
            "rows": [
                {"size": 1 << 20, "out_of_place": {"busbw_gbps": 900.0}},  # below the reference
                {"size": 16 << 30, "out_of_place": {"busbw_gbps": 471.5}},
            ],
        },
    }
    view = NodeView("n1", facts, limits("h100-sxm"))
    run = a_run([NodeVerdict("n1")], measured={"n1": node_measured(view, "nccl")})
    text = prometheus.render(run).decode()
    check_metrics(text)
    found = parse(text)
    temps = named(found, "gpuhealth_gpu_temperature_celsius")
    assert {dict(k)["gpu"] for k in temps} == {"0", "1", "2", "3", "4", "6", "7"}
    assert (
        value(found, "gpuhealth_gpu_temperature_celsius", host="n1", gpu="6")
        == (facts["gpus"][6]["temperature_c"])
    )
    assert "5" not in {dict(k)["gpu"] for k in named(found, "gpuhealth_gpu_power_draw_watts")}
    ecc = "gpuhealth_gpu_ecc_uncorrected_errors_total"
    assert value(found, ecc, host="n1", gpu="3") == 2
    assert value(found, ecc, host="n1", gpu="0") == 0
    assert value(found, "gpuhealth_nccl_all_reduce_busbw_gbps", host="n1") == 471.5
    ib = named(found, "gpuhealth_ib_symbol_errors_total")
    assert ib and all(set(dict(k)) == {"host", "device", "port"} for k in ib)
    assert named(found, "gpuhealth_ib_link_downed_total")
    info = named(found, "gpuhealth_gpu_info")
    serial = facts["gpus"][3]["serial"]
    assert any(dict(k)["gpu"] == "3" and dict(k)["serial"] == serial for k in info)
    assert "# TYPE gpuhealth_gpu_ecc_uncorrected_errors_total counter" in text
    assert "# TYPE gpuhealth_gpu_temperature_celsius gauge" in text
    # No idle_* duplicates of the readings, no kernel log position, no messages.
    assert "_idle_" not in text and "kernel_log_until" not in text


def test_a_gpu_listed_twice_keeps_its_highest_count():
    rows = [
        {"gpu": 1, "metric": "ecc_uncorrected_aggregate", "value": 0.0},
        {"gpu": 1, "metric": "ecc_uncorrected_aggregate", "value": 7.0},
        {"gpu": 1, "metric": "ecc_uncorrected_aggregate", "value": 3.0},
        {"gpu": None, "metric": "temperature_c", "value": 50.0},  # a GPU value without a GPU
    ]
    run = a_run([NodeVerdict("n1")], measured={"n1": {"rows": rows}})
    found = parse(prometheus.render(run).decode())
    assert named(found, "gpuhealth_gpu_ecc_uncorrected_errors_total") == {
        frozenset({("host", "n1"), ("gpu", "1")}): 7.0
    }
    assert not named(found, "gpuhealth_gpu_temperature_celsius")


@pytest.mark.parametrize(
    "host",
    ['n1"} 1\ngpuhealth_node_verdict{host="evil', "back\\slash\\", "nœud-ünicode", ""],
)
def test_hostile_host_names_are_escaped(host):
    outcomes = [(host, 0, "ecc_errors", "FAIL"), (host, None, "numactl", "PASS")]
    rows = [{"gpu": 0, "metric": "temperature_c", "value": 41.0}]
    run = a_run([NodeVerdict(host, "FAIL")], outcomes=outcomes, measured={host: {"rows": rows}})
    text = prometheus.render(run).decode()
    check_metrics(text)
    found = parse(text)
    verdicts = named(found, "gpuhealth_node_verdict")
    assert {dict(k)["host"] for k in verdicts} == {host}
    assert value(found, "gpuhealth_node_verdict", host=host, verdict="FAIL") == 1
    assert value(found, "gpuhealth_check_status", host=host, gpu="0", check="ecc_errors") == 3
    assert value(found, "gpuhealth_gpu_temperature_celsius", host=host, gpu="0") == 41
    assert sum(verdicts.values()) == 1


def test_the_file_is_replaced_atomically_under_a_concurrent_reader(tmp_path):
    small = a_run([NodeVerdict("n1")])
    hosts = [f"node{i:03d}" for i in range(60)]
    outcomes = [(h, g, c, "PASS") for h in hosts for g in range(8) for c in ("a", "b", "c")]
    big = a_run([NodeVerdict(h) for h in hosts], outcomes=outcomes)
    texts = {prometheus.render(small), prometheus.render(big)}
    assert min(len(t) for t in texts) < 4000 < 100_000 < max(len(t) for t in texts)
    path = tmp_path / prometheus.FILE_NAME
    prometheus.write(tmp_path, small)
    seen: list[bytes] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.append(path.read_bytes())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(60):
            prometheus.write(tmp_path, big if i % 2 else small)
    finally:
        done.set()
        reader.join()
    assert len(seen) > 20
    assert [i for i, text in enumerate(seen) if text not in texts] == []
    assert len(set(seen)) == 2  # both versions were read whole
    assert os.listdir(tmp_path) == [prometheus.FILE_NAME]  # no temp file left behind


def test_the_file_is_readable_by_node_exporter_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        path = prometheus.write(tmp_path, a_run([NodeVerdict("n1")]))
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
    assert path.read_bytes().endswith(b"\n")


def local_verdict(facts: dict[str, Any] | None, outcomes: list[Outcome], verdict: str):
    node = NodeVerdict("n9", verdict)
    return LocalVerdict("n9", node, outcomes, time.time() - 3, 2.5, facts, limits("h100-sxm"))


@pytest.mark.parametrize(
    "kind, why",
    [("missing", "no such directory"), ("a file", "not a directory"),
     ("target is a directory", "Is a directory")],
)  # fmt: skip
def test_an_unwritable_textfile_is_one_clean_error(tmp_path, capsys, kind, why):
    directory = tmp_path / "textfile"
    if kind == "a file":
        directory.write_text("")
    elif kind == "target is a directory":
        (directory / prometheus.FILE_NAME / "x").mkdir(parents=True)
    result = local_verdict(healthy_h100(), [], "PASS")
    assert prometheus.write_node_check(directory, result) == 1
    out, err = capsys.readouterr()
    assert out == ""  # stdout is node-check's answer (node-problem-detector reads it)
    assert f"cannot write {directory / prometheus.FILE_NAME}: " in err and why in err
    if kind == "target is a directory":
        assert sorted(os.listdir(directory)) == [prometheus.FILE_NAME]  # no temp file left


def test_node_check_whose_probe_failed_fails_closed(tmp_path):
    failed = Outcome("probe", "ERROR", "n9", None, "the probe failed: timeout", "n9", "RERUN")
    result = local_verdict(None, [failed], "FAIL")
    assert prometheus.write_node_check(tmp_path, result) == 0
    found = parse((tmp_path / prometheus.FILE_NAME).read_text())
    assert value(found, "gpuhealth_node_verdict", host="n9", verdict="FAIL") == 1
    assert value(found, "gpuhealth_node_verdict", host="n9", verdict="PASS") == 0
    assert value(found, "gpuhealth_check_status", host="n9", gpu="", check="probe") == 4
    assert not [name for name, _ in found if name.startswith("gpuhealth_gpu_")]
    assert value(found, "gpuhealth_run_duration_seconds") == 2.5
    assert abs(value(found, "gpuhealth_last_run_timestamp_seconds") - (time.time() - 0.5)) < 5
    assert run_info(found, "node-check") == 1


# ---------------------------------------------------------------- a real scrape


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class NodeExporter:
    """Debian's node_exporter with only its textfile collector, on a loopback port."""

    def __init__(self, directory: Path, log: Path) -> None:
        self.directory, self.log = directory, log
        self.port = free_port()
        command = [
            node_exporter_bin(),
            "--collector.disable-defaults",
            "--collector.textfile",
            f"--collector.textfile.directory={directory}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.disable-exporter-metrics",
        ]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def scrape(self) -> str:
        """/metrics, as Prometheus would read it (waits for the exporter to listen)."""
        deadline = time.monotonic() + 10
        while True:
            try:
                url = f"http://127.0.0.1:{self.port}/metrics"
                with urllib.request.urlopen(url, timeout=5) as answer:
                    return str(answer.read().decode())
            except OSError as exc:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    log = self.log.read_text()
                    raise AssertionError(f"node_exporter did not answer: {log}") from exc
                time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[NodeExporter]:
    directory = tmp_path / "textfile"
    directory.mkdir()
    running = NodeExporter(directory, tmp_path / "node_exporter.log")
    try:
        yield running
    finally:
        running.stop()


def scraped(exporter: NodeExporter) -> Series:
    """The exporter's metrics: lint-clean, the textfile read without error, and ours in it."""
    text = exporter.scrape()
    check_metrics(text)
    found = parse(text)
    assert value(found, "node_textfile_scrape_error") == 0, exporter.log.read_text()
    mtimes = named(found, "node_textfile_mtime_seconds")
    assert [dict(k)["file"].rpartition("/")[2] for k in mtimes] == [prometheus.FILE_NAME]
    return found


def one_hot(found: Series, host: str) -> str:
    ones = [
        dict(k)["verdict"]
        for k, v in named(found, "gpuhealth_node_verdict").items()
        if dict(k)["host"] == host and v == 1
    ]
    assert len(ones) == 1, ones
    return ones[0]


def failing(found: Series, host: str) -> set[tuple[str, str]]:
    return {
        (dict(k)["gpu"], dict(k)["check"])
        for k, v in named(found, "gpuhealth_check_status").items()
        if dict(k)["host"] == host and v >= 3
    }


@pytest.mark.parametrize(
    ("scenario", "host", "verdict", "fails"),
    [
        ("healthy-h100x8", "n1", "PASS", set()),
        (
            "ecc-gpu3-recovery-gpu5",
            "n2",
            "FAIL",
            {("3", "ecc_errors"), ("5", "recovery_action")},
        ),
    ],
)
def test_node_check_textfile_through_node_exporter(
    exporter, tmp_path, fake_nvml_lib, scenario, host, verdict, fails
):
    scenario_file = write_scenario(scenario, tmp_path / f"{scenario}.conf")
    env = nvml_env(fake_nvml_lib.parent, scenario_file)
    env["PATH"] = f"{NODE_TOOLS}:{env['PATH']}"
    command = [
        sys.executable, "-m", "gpuhealth.cli", "node-check", "--host", host,
        "--profile", "h100-sxm", "--expected-gpus", "8", "--root", str(TREE),
        "--npd", "--prometheus-textfile-dir", str(exporter.directory),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == (0 if verdict == "PASS" else 1), done.stdout + done.stderr
    assert len(done.stdout.splitlines()) == 1  # NPD's one line, nothing added by the textfile
    found = scraped(exporter)
    assert one_hot(found, host) == verdict
    assert failing(found, host) == fails
    assert run_info(found, "node-check") == 1
    assert value(found, "gpuhealth_run_complete") == 1
    assert abs(value(found, "gpuhealth_last_run_timestamp_seconds") - time.time()) < 60
    assert 0 < value(found, "gpuhealth_run_duration_seconds") < 60
    ecc = named(found, "gpuhealth_gpu_ecc_uncorrected_errors_total")
    assert len(ecc) == 8
    assert value(found, "gpuhealth_gpu_ecc_uncorrected_errors_total", host=host, gpu="3") == (
        2 if host == "n2" else 0
    )
    assert len(named(found, "gpuhealth_gpu_temperature_celsius")) == 8
    assert len(named(found, "gpuhealth_gpu_power_draw_watts")) == 8
    assert value(found, "gpuhealth_check_status", host=host, gpu="0", check="retired_pages") == 2


def not_run(check: str) -> int:
    """The status of a check on a host it could not judge: 4 (could not run), or 2 (not
    evaluated) for a load test below the run's level, which skips before its host is probed."""
    return 4 if registry.check(check).level == "quick" else 2


def ib_section() -> dict[str, Any]:
    """The fabric section of a real H100 node's /sys/class/infiniband (selftest/data)."""
    sections, _ = run_probe("fabric", IB_ROOT, **limits("h100-sxm").values)
    return dict(sections["fabric"])


@pytest.mark.suite
def test_suite_textfile_through_node_exporter_without_history(exporter, tmp_path):
    n1 = healthy_h100()
    n1["fabric"] = ib_section()
    n2 = healthy_h100()
    n2["gpus"][3]["ecc"]["volatile"]["uncorrected"] = 4
    n2["gpus"][3]["ecc"]["aggregate"]["uncorrected"] = 4
    facts = write_facts(tmp_path / "facts", n1=n1, n2=n2)
    (facts / "n3.json").write_text("{ not json")
    run = run_suite(
        tmp_path / "r",
        "--facts", str(facts), "--profile", "h100-sxm", "--expected-gpus", "8",
        "--no-history", "--prometheus-textfile-dir", str(exporter.directory),
        # Every test of n1 and n2; of n3, whose tests all fail alike, a few (each costs).
        "-k", "not n3 or ecc_errors or numactl or dcgm_diag",
    )  # fmt: skip
    assert run.rc == 1, run.output
    assert not (tmp_path / "r" / "history.sqlite").exists()
    found = scraped(exporter)
    verdicts = run.verdicts["nodes"]
    for host in ("n1", "n2", "n3"):
        assert one_hot(found, host) == verdicts[host]["verdict"]
    assert [one_hot(found, h) for h in ("n1", "n2", "n3")] == ["PASS", "FAIL", "FAIL"]
    assert failing(found, "n1") == set()
    assert failing(found, "n2") == {("3", "ecc_errors")}
    # Every check of the host whose document is broken could not run (4); the load tests
    # were not run at this level (2).
    n3 = {
        k: v for k, v in named(found, "gpuhealth_check_status").items() if dict(k)["host"] == "n3"
    }
    assert n3 and all(v == not_run(dict(k)["check"]) for k, v in n3.items())
    # One status per test of the run (the fleet test aside), as JUnit counts them.
    statuses = named(found, "gpuhealth_check_status")
    assert len(statuses) == len(run.outcomes()) - 1
    assert value(found, "gpuhealth_gpu_ecc_uncorrected_errors_total", host="n2", gpu="3") == 4
    temps = named(found, "gpuhealth_gpu_temperature_celsius")
    assert {dict(k)["host"] for k in temps} == {"n1", "n2"}  # n3's facts could not be read
    assert len(temps) == 16
    ports = named(found, "gpuhealth_ib_symbol_errors_total")
    assert ports and {dict(k)["host"] for k in ports} == {"n1"}
    assert run_info(found, "suite") == 1
    assert value(found, "gpuhealth_run_complete") == 1
    assert "Prometheus textfile not written" not in run.output


@pytest.mark.suite
def test_suite_textfile_of_an_unreachable_host(tmp_path):
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    run = run_suite(
        tmp_path / "r",
        "--hosts", "ssh://127.0.0.1:1",
        "--ssh-extra-args=-o BatchMode=yes -o ConnectTimeout=5",
        "--no-history", "--prometheus-textfile-dir", str(textfile),
        "-k", "ecc_errors or numactl or dcgm_diag",
    )  # fmt: skip
    assert run.rc == 1, run.output
    found = parse((textfile / prometheus.FILE_NAME).read_text())
    assert one_hot(found, "127.0.0.1") == "UNREACHABLE"
    statuses = {dict(k)["check"]: v for k, v in named(found, "gpuhealth_check_status").items()}
    assert set(statuses) == {"ecc_errors", "numactl", "dcgm_diag", "dcgm_diag_gpu"}
    assert all(v == not_run(check) for check, v in statuses.items())
    assert not [name for name, _ in found if name.startswith("gpuhealth_gpu_")]


@pytest.mark.suite
def test_suite_refuses_a_textfile_dir_that_is_not_a_directory(tmp_path):
    facts = write_facts(tmp_path / "facts", n1=healthy_h100())
    run = run_suite(
        tmp_path / "r",
        "--facts", str(facts), "--prometheus-textfile-dir", str(tmp_path / "nowhere"),
    )  # fmt: skip
    assert run.rc == 4, run.output
    assert f"--prometheus-textfile-dir {tmp_path / 'nowhere'} is not a directory" in run.output


@pytest.mark.suite
def test_a_textfile_that_cannot_be_written_loses_no_other_report(tmp_path):
    facts = write_facts(tmp_path / "facts", n1=healthy_h100())
    textfile = tmp_path / "textfile"
    (textfile / prometheus.FILE_NAME).mkdir(parents=True)  # rename onto it fails
    run = run_suite(
        tmp_path / "r", "--facts", str(facts), "--profile", "h100-sxm",
        "--prometheus-textfile-dir", str(textfile), "-k", "ecc_errors",
    )  # fmt: skip
    assert run.rc == 0, run.output
    assert f"Prometheus textfile not written to {textfile / prometheus.FILE_NAME}" in run.output
    assert run.verdicts["nodes"]["n1"]["verdict"] == "PASS"
    assert run.outcomes()
    assert sorted(os.listdir(textfile)) == [prometheus.FILE_NAME]


# ---------------------------------------------------------------- the alert rules


def test_alert_rules_are_valid_and_their_unit_tests_pass():
    rules = DEPLOY / "gpuhealth-alerts.yml"
    check = subprocess.run(
        [promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    test = subprocess.run(
        [promtool(), "test", "rules", "gpuhealth-alerts.test.yml"],
        capture_output=True, text=True, timeout=30, cwd=DEPLOY,
    )  # fmt: skip
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


# Wrong rules the unit tests must catch: alerting on a skipped check, on node checks, on a
# passing node, too late, on the wrong kind of run.
MUTANTS = [
    ('gpuhealth_check_status{gpu!=""} >= 3', 'gpuhealth_check_status{gpu!=""} >= 2'),
    ('gpuhealth_check_status{gpu!=""} >= 3', "gpuhealth_check_status >= 3"),
    ('{verdict="FAIL"} == 1', '{verdict=~"FAIL|PASS"} == 1'),
    ("> 3600", "> 86400"),
    ('{mode="suite"}', '{mode=~".+"}'),
]


def test_the_rules_unit_tests_catch_every_wrong_rule(tmp_path):
    text = (DEPLOY / "gpuhealth-alerts.yml").read_text()
    tests = []
    for number, (rule, mutant) in enumerate(MUTANTS):
        assert text.count(rule) == 1, rule
        folder = tmp_path / f"mutant{number}"
        folder.mkdir()
        (folder / "gpuhealth-alerts.yml").write_text(text.replace(rule, mutant))
        tests.append(shutil.copy(DEPLOY / "gpuhealth-alerts.test.yml", folder))
    # One promtool for all of them: it reports each test file in turn.
    done = subprocess.run(
        [promtool(), "test", "rules", *map(str, tests)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
    )  # fmt: skip
    reports = done.stdout.split("Unit Testing:")[1:]
    assert len(reports) == len(MUTANTS), done.stdout
    passed = [MUTANTS[i] for i, report in enumerate(reports) if "FAILED" not in report]
    assert passed == [] and done.returncode != 0, done.stdout


def test_verdicts_and_statuses_rank_as_the_verdicts_do():
    """The textfile's verdicts are verdicts.json's in report.ORDER's rank, and check statuses
    rank alike: a pass, a warning, not evaluated, a failure, could not run."""
    assert prometheus.VERDICTS == ("PASS", "WARN", "NOT_CHECKED", "FAIL", "UNREACHABLE")
    assert sorted(prometheus.STATUS_CODES, key=prometheus.STATUS_CODES.get) == [
        "PASS", "WARN", "SKIP", "FAIL", "ERROR",
    ]  # fmt: skip
