"""Run history: each regression rule on synthetic nights, the store (SQLite and a real
PostgreSQL started here), its migrations, and writers that run at the same time.

Nights are written through the real store and read back the way the suite reads them, so every
rule is tested on what a real run would see.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import pwd
import shutil
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gpuhealth.checks import NodeView, evaluate
from gpuhealth.families.history.checks import notes_of, regressions_of
from gpuhealth.history.run import History, measured, measured_load, new_failures, run_record
from gpuhealth.history.store import METADATA, Store, StoreError, engine_url, head_revision
from gpuhealth.registry import check
from gpuhealth.report import NodeVerdict, Outcome
from gpuhealth.results import Status
from selftest.facts import healthy_h100, limits

DAY = 86400.0
T0 = 1_790_000_000.0  # a fixed "first night"


# ---------------------------------------------------------------- helpers


class Nights:
    """A node's nights in a real store: remember() a night, judge() the next one."""

    def __init__(self, spec: str, base: Path, host: str = "node17", **overrides: Any) -> None:
        self.spec, self.base, self.host = spec, base, host
        self.limits = limits("h100-sxm", **overrides)
        self.count = 0

    def history(self, at: float, policy: str = "fail") -> History:
        history = History(self.spec, self.base, policy, started_at=at)
        history.uid = f"{self.host}-{self.count}-{at}"
        self.count += 1
        return history

    def view(self, facts: dict[str, Any], at: float, policy: str = "fail") -> NodeView:
        history = self.history(at, policy)
        section = history.section(self.host, self.limits)
        history.close()
        return NodeView(self.host, {**facts, "history": section}, self.limits)

    def remember(
        self, facts: dict[str, Any], at: float, verdict: str = "PASS", complete: bool = True
    ) -> None:
        view = NodeView(self.host, facts, self.limits)
        found = measured(view)
        for section in ("nccl", "dcgm"):
            if section in facts:
                found["rows"] += measured_load(view, section)["rows"]
        self.write(at, [NodeVerdict(self.host, verdict)], [], {self.host: found}, complete)

    def write(self, at: float, verdicts, outcomes, measured_by_host, complete: bool = True):
        """A run as the reporter writes it; its store, still open."""
        history = self.history(at)
        record = run_record(
            history,
            complete=complete,
            exit_status=0,
            level="standard",
            source="facts",
            command="pytest",
            inventory=None,
            verdicts=verdicts,
            outcomes=outcomes,
            measured_by_host=measured_by_host,
        )
        store = history.store()
        assert store is not None, history.error
        store.write_run(record)
        return store

    def judge(
        self,
        name: str,
        facts: dict[str, Any],
        at: float,
        index: int | None = None,
        policy: str = "fail",
    ):
        return evaluate(check(name), self.view(facts, at, policy), index)


@pytest.fixture
def nights(tmp_path):
    return Nights("history.sqlite", tmp_path)


def healthy() -> dict[str, Any]:
    return copy.deepcopy(HEALTHY)


HEALTHY = healthy_h100()


def with_nccl(facts: dict[str, Any], busbw: float) -> dict[str, Any]:
    """The facts with a single-node all_reduce run peaking at `busbw` GB/s."""
    row = {
        "size": 4294967296,
        "out_of_place": {"busbw_gbps": busbw - 1, "wrong": 0},
        "in_place": {"busbw_gbps": busbw, "wrong": 0},
    }
    run = {"collective": "all_reduce", "rows": [row]}
    return {**facts, "nccl": {"nodes": 1, "error": None, "run": run}}


def gpu(facts: dict[str, Any], index: int) -> dict[str, Any]:
    return facts["gpus"][index]


# ---------------------------------------------------------------- rules


def test_no_history_yet_skips_every_regression_test(nights):
    for name, index in (("gpu_regression", 0), ("node_regression", None)):
        finding = nights.judge(name, healthy(), T0, index)
        assert finding.status is Status.SKIP
        assert finding.result.message == "no baseline yet (0 runs)"
    assert nights.judge("load_regression", with_nccl(healthy(), 476.5), T0).result.message == (
        "no baseline yet (0 runs)"
    )


def test_counters_that_must_not_grow_fail_on_any_growth(nights):
    nights.remember(healthy(), T0)
    now = healthy()
    gpu(now, 2)["remapped_rows"]["correctable"] = 2
    gpu(now, 3)["ecc"]["aggregate"]["uncorrected"] = 1
    found = nights.judge("gpu_regression", now, T0 + DAY, 2)
    assert found.status is Status.FAIL
    assert "rows remapped for correctable errors 0 -> 2 since the last run" in found.text
    (entry,) = regressions_of(found.result)
    assert entry == {
        "check": "gpu_regression",
        "gpu": 2,
        "metric": "remapped_rows_correctable",
        "baseline": 0.0,
        "value": 2.0,
        "message": entry["message"],
        "action": "INSPECT",
    }
    assert entry["message"].startswith("node17 gpu2 (GPU-")  # names host, GPU, serial
    assert f"serial {gpu(now, 2)['serial']}" in entry["message"]
    three = nights.judge("gpu_regression", now, T0 + DAY, 3)
    assert [r["metric"] for r in regressions_of(three.result)] == ["ecc_uncorrected_aggregate"]
    assert nights.judge("gpu_regression", now, T0 + DAY, 0).status is Status.PASS


def test_growth_allowance_is_a_profile_key(tmp_path):
    nights = Nights("h.sqlite", tmp_path, regression_remapped_rows_growth=2)
    nights.remember(healthy(), T0)
    now = healthy()
    gpu(now, 2)["remapped_rows"]["correctable"] = 2
    assert nights.judge("gpu_regression", now, T0 + DAY, 2).status is Status.PASS
    gpu(now, 2)["remapped_rows"]["correctable"] = 3
    assert nights.judge("gpu_regression", now, T0 + DAY, 2).status is Status.FAIL
    off = Nights("h.sqlite", tmp_path, regression_remapped_rows_growth=None)
    assert off.judge("gpu_regression", now, T0 + DAY, 2).status is Status.PASS  # null: off


@pytest.mark.parametrize(
    ("growth", "after_s", "status"),
    [
        (900, 3600, Status.PASS),  # under a day counts as a day: 900 < 1000
        (5000, 3600, Status.FAIL),
        (5000, 10 * DAY, Status.PASS),  # 500 a day
        (25000, 10 * DAY, Status.FAIL),
    ],
)
def test_slow_counters_are_judged_per_day(nights, growth, after_s, status):
    before = healthy()
    gpu(before, 1)["ecc"]["aggregate"]["corrected"] = 100
    nights.remember(before, T0)
    now = copy.deepcopy(before)
    gpu(now, 1)["ecc"]["aggregate"]["corrected"] = 100 + growth
    found = nights.judge("gpu_regression", now, T0 + after_s, 1)
    assert found.status is status, found.text
    if status is Status.FAIL:
        assert f"correctable ECC errors +{growth} since the last run" in found.text


def test_a_counter_that_resets_counts_from_zero(nights):
    nights.remember(healthy(), T0)  # PCIe replays 67 on every GPU
    now = healthy()
    gpu(now, 0)["pcie"]["replay_count"] = 10  # rebooted since: 10 new replays
    assert nights.judge("gpu_regression", now, T0 + DAY, 0).status is Status.PASS
    gpu(now, 0)["pcie"]["replay_count"] = 500
    found = nights.judge("gpu_regression", now, T0 + DAY, 0)
    assert "PCIe replays +433 since the last run" in found.text


def test_a_lifetime_counter_going_down_is_never_a_pass(nights):
    before = healthy()
    gpu(before, 5)["ecc"]["aggregate"]["corrected"] = 100
    nights.remember(before, T0)
    found = nights.judge("gpu_regression", healthy(), T0 + DAY, 5)
    assert found.status is Status.FAIL
    assert "went down from 100 to 0 on the same GPU" in found.text


def test_busbw_drop_waits_for_enough_good_runs(nights):
    for night in range(2):
        nights.remember(with_nccl(healthy(), 476.5), T0 + night * DAY)
    found = nights.judge("load_regression", with_nccl(healthy(), 405.0), T0 + 2 * DAY)
    assert found.status is Status.SKIP
    assert found.result.message == (
        "no baseline yet (2 runs); not judged: single-node all_reduce busbw: a baseline needs "
        "3 good runs, has 2"
    )
    nights.remember(with_nccl(healthy(), 200.0), T0 + 2 * DAY, verdict="FAIL")  # not good
    found = nights.judge("load_regression", with_nccl(healthy(), 405.0), T0 + 3 * DAY)
    assert "has 2" in found.text
    nights.remember(with_nccl(healthy(), 470.0), T0 + 3 * DAY)
    found = nights.judge("load_regression", with_nccl(healthy(), 405.0), T0 + 4 * DAY)
    assert found.status is Status.FAIL
    assert (
        "single-node all_reduce busbw 405 GB/s is 15.0% below its baseline 476.5 GB/s "
        "(median of 3 good runs)" in found.text
    )
    (entry,) = regressions_of(found.result)
    assert (entry["metric"], entry["baseline"], entry["value"], entry["gpu"]) == (
        "nccl_busbw_gbps",
        476.5,
        405.0,
        None,
    )
    ok = nights.judge("load_regression", with_nccl(healthy(), 440.0), T0 + 4 * DAY)
    assert ok.status is Status.PASS  # 7.7 % below: within the 10 %


def test_a_dcgm_result_with_no_earlier_value_is_said_not_judged(nights):
    for night in range(3):
        nights.remember(with_nccl(healthy(), 476.5), T0 + night * DAY)
    now = with_nccl(healthy(), 470.0)
    result = {"gpus": [1], "entity": None, "status": "Pass"}
    now["dcgm"] = {"error": None, "diag": {"tests": [{"name": "Memory", "results": [result]}]}}
    found = nights.judge("load_regression", now, T0 + 3 * DAY)
    assert found.status is Status.PASS  # the busbw was judged ...
    # ... and the GPU's DCGM results, first seen now, are named as not judged.
    assert "; not judged: " in found.text
    assert "; failed DCGM diagnostic results: no earlier value" in found.text


def test_a_driver_change_restarts_the_baselines_and_is_named(nights):
    for night in range(3):
        nights.remember(with_nccl(healthy(), 476.5), T0 + night * DAY)
    upgraded = with_nccl(healthy(), 300.0)
    upgraded["driver"] = {**upgraded["driver"], "version": "575.51.03"}
    found = nights.judge("load_regression", upgraded, T0 + 3 * DAY)
    assert found.status is Status.SKIP and "has 0" in found.text
    node = nights.judge("node_regression", upgraded, T0 + 3 * DAY)
    assert "driver changed since the last run: 570.86.15 -> 575.51.03" in notes_of(node.result)[0]


def test_a_replaced_gpu_is_a_note_and_its_baseline_restarts(nights):
    before = healthy()
    gpu(before, 4)["remapped_rows"]["correctable"] = 7
    nights.remember(before, T0)
    now = healthy()
    gpu(now, 4)["serial"] = "1650124099999"
    found = nights.judge("gpu_regression", now, T0 + DAY, 4)
    assert found.status is Status.SKIP
    assert found.result.message.startswith("no baseline yet (0 runs)")
    (note,) = notes_of(found.result)
    assert note.startswith("gpu4 is another GPU since the last run: serial 1650124099999, was ")
    assert note.endswith("(a new GPU); its baseline restarts")


def test_gpus_are_followed_by_serial_when_they_move(nights):
    before = healthy()
    gpu(before, 4)["remapped_rows"]["correctable"] = 7
    nights.remember(before, T0)
    now = healthy()
    a, b = gpu(now, 4), gpu(now, 5)
    for key in ("serial", "uuid"):
        a[key], b[key] = b[key], a[key]
    b["remapped_rows"]["correctable"] = 7  # the GPU with 7 rows now sits at index 5
    found = nights.judge("gpu_regression", now, T0 + DAY, 5)
    assert found.status is Status.PASS, found.text
    assert "this GPU was gpu4 then" in notes_of(found.result)[0]


def test_idle_temperature_rise_and_a_vbios_change(tmp_path):
    nights = Nights("h.sqlite", tmp_path, history_min_runs=3)
    for night in range(3):
        nights.remember(healthy(), T0 + night * DAY)
    hot = healthy()
    idle = gpu(hot, 6)["temperature_c"]
    gpu(hot, 6)["temperature_c"] = idle + 16
    found = nights.judge("gpu_regression", hot, T0 + 3 * DAY, 6)
    assert (
        f"idle temperature {idle + 16} C is 16 C above its baseline {idle} C (median of 3 "
        "good runs); more than 10 C is a regression" in found.text
    )
    busy = copy.deepcopy(hot)
    gpu(busy, 6)["utilization_gpu_pct"] = 90  # not idle: not compared
    assert nights.judge("gpu_regression", busy, T0 + 3 * DAY, 6).status is Status.PASS
    gpu(hot, 6)["vbios_version"] = "96.00.99.00.01"
    found = nights.judge("gpu_regression", hot, T0 + 3 * DAY, 6)
    assert found.status is Status.PASS
    assert "VBIOS changed since the last run" in notes_of(found.result)[0]


def _stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def test_new_fatal_xids_since_the_last_run(nights):
    before = healthy()
    before["kernel_log"] = {**before["kernel_log"], "until": _stamp(T0)}
    nights.remember(before, T0)  # read its kernel log up to T0
    now = healthy()
    xid = {"kind": "xid", "bus_id": gpu(now, 3)["pci_bus_id"], "code": 79, "count": 2}
    old = {**xid, "first": _stamp(T0 - 600), "last": _stamp(T0 - 60)}  # seen last time
    now["kernel_log"] = {**now["kernel_log"], "until": _stamp(T0 + DAY), "counts": [old]}
    assert nights.judge("node_regression", now, T0 + DAY).status is Status.PASS
    new = {**xid, "first": _stamp(T0 + 60), "last": _stamp(T0 + 120)}
    now["kernel_log"]["counts"] = [old, new]
    found = nights.judge("node_regression", now, T0 + DAY)
    assert found.status is Status.FAIL
    assert "XID events of kinds that fail a node: 2 new since the last run" in found.text
    assert f"XID 79 on {xid['bus_id']} at {_stamp(T0 + 120)}" in found.text


def test_warn_policy_warns(nights):
    nights.remember(healthy(), T0)
    now = healthy()
    gpu(now, 2)["remapped_rows"]["correctable"] = 2
    found = nights.judge("gpu_regression", now, T0 + DAY, 2, policy="warn")
    assert found.status is Status.WARN and regressions_of(found.result)


def test_a_node_that_passed_and_fails_now_is_a_new_failure():
    now = NodeVerdict("n1", "FAIL", actions=["RESET_GPU"])
    now.failed = [
        {"check": "ecc_errors", "gpu": 3},
        {"check": "gpu_regression", "gpu": 2},
        {"check": "storage_paths", "gpu": None},
    ]
    last = {"n1": {"verdict": "PASS", "at": T0, "failed": set()}}
    (entry,) = new_failures(last, {"n1": now}).values()
    assert entry["message"].endswith("FAIL now: ecc_errors[gpu3], storage_paths")
    assert (entry["baseline"], entry["value"], entry["action"]) == ("PASS", "FAIL", "RESET_GPU")
    assert new_failures({"n1": {**last["n1"], "verdict": "FAIL"}}, {"n1": now}) == {}
    only = NodeVerdict("n1", "FAIL", failed=[{"check": "gpu_regression", "gpu": 2}])
    assert new_failures(last, {"n1": only}) == {}  # a regression is no new failure


# ---------------------------------------------------------------- the store


def test_migrations_build_the_schema_the_code_uses(tmp_path):
    store = Store("h.sqlite", tmp_path)
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn)
        assert context.get_current_revision() == head_revision()
        assert compare_metadata(context, METADATA) == []


def test_a_store_from_a_newer_gpuhealth_is_refused(tmp_path):
    Store("h.sqlite", tmp_path).close()
    with sqlite3.connect(tmp_path / "h.sqlite") as db:
        db.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(StoreError, match="written by a newer gpuhealth; upgrade"):
        Store("h.sqlite", tmp_path)


def test_an_unusable_store_is_one_clear_error(tmp_path):
    (tmp_path / "h.sqlite").write_text("not a database")
    history = History("h.sqlite", tmp_path)
    assert history.section("n1", limits())["skipped"].startswith("run history unavailable: ")
    assert "file is not a database" in str(history.error)


def test_an_interrupted_run_is_no_baseline(nights):
    nights.remember(healthy(), T0)
    broken = healthy()
    gpu(broken, 2)["remapped_rows"]["correctable"] = 2
    nights.remember(broken, T0 + 10, complete=False)
    found = nights.judge("gpu_regression", broken, T0 + DAY, 2)
    assert "0 -> 2 since the last run" in found.text  # compared with the complete run


def _write_runs(spec: str, base: str, writer: int, count: int) -> None:
    nights = Nights(spec, Path(base), host=f"w{writer}")
    for night in range(count):
        nights.remember(healthy(), T0 + night)


def _two_writers(spec: str, base: Path, count: int = 15) -> None:
    """Two processes append runs at the same time while the parent reads."""
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_write_runs, args=(spec, str(base), w, count)) for w in (1, 2)
    ]
    for worker in workers:
        worker.start()
    reader = Nights(spec, base, host="w1")
    while any(w.is_alive() for w in workers):
        reader.view(healthy(), T0)  # reads never fail while others write
    for worker in workers:
        worker.join()
        assert worker.exitcode == 0
    store = Store(spec, base)
    runs = store.runs()
    assert len(runs) == 2 * count
    assert sorted({h for r in runs for h in r["nodes"]}) == ["w1", "w2"]
    assert all(len(store.host_history(h, 100)) == count for h in ("w1", "w2"))
    store.close()


def test_two_writers_at_once_on_sqlite(tmp_path):
    _two_writers("h.sqlite", tmp_path)
    with sqlite3.connect(tmp_path / "h.sqlite") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_prune_keeps_the_recent_runs(nights, tmp_path):
    for night in range(5):
        nights.remember(healthy(), T0 + night * DAY)
    store = Store("history.sqlite", tmp_path)
    assert store.prune(T0 + 3 * DAY) == 3
    assert [r["started_at"] for r in store.runs()] == [T0 + 3 * DAY, T0 + 4 * DAY]
    assert {len(r["nodes"]) for r in store.runs()} == {1}
    assert len(store.series(host="node17", metric="pcie_replays")) == 2 * 8


# ---------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL cluster on a Unix socket in a temp dir (no TCP), started as the
    `postgres` user when run as root (PostgreSQL refuses root), stopped afterwards."""
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    assert bins, "PostgreSQL is not installed: apt-get install postgresql (make test does)"
    bindir = bins[-1].parent
    root = Path(tempfile.mkdtemp(prefix="ghpg-", dir="/tmp"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(root, account.pw_uid, account.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, sock = root / "data", root

    def run(*cmd: str) -> None:
        proc = subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr

    run(str(bindir / "initdb"), "-D", str(data), "-U", "gpuhealth", "-A", "trust", "--no-sync")
    options = f"-k {sock} -c listen_addresses='' -F"
    run(
        str(bindir / "pg_ctl"),
        "-D",
        str(data),
        "-o",
        options,
        "-l",
        str(root / "log"),
        "-w",
        "start",
    )
    try:
        yield f"postgresql://gpuhealth@/postgres?host={sock}"
    finally:
        run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


def _fresh(url: str, name: str) -> str:
    """A new database in the cluster for one test."""
    store = Store(url)  # the default database, migrated: proves the URL works
    with store.engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    store.close()
    return url.replace("/postgres?", f"/{name}?")


def test_postgresql_store_runs_the_rules(postgres, tmp_path):
    nights = Nights(_fresh(postgres, "rules"), tmp_path)
    for night in range(3):
        nights.remember(with_nccl(healthy(), 476.5), T0 + night * DAY)
    now = with_nccl(healthy(), 405.0)
    gpu(now, 2)["remapped_rows"]["correctable"] = 2
    assert nights.judge("load_regression", now, T0 + 3 * DAY).status is Status.FAIL
    assert nights.judge("gpu_regression", now, T0 + 3 * DAY, 2).status is Status.FAIL
    store = Store(nights.spec)
    assert store.postgresql
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn)
        assert context.get_current_revision() == head_revision()
        assert compare_metadata(context, METADATA) == []
    assert store.prune(T0 + DAY) == 1
    assert len(store.host_history("node17", 10)) == 2
    store.close()


def test_two_writers_at_once_on_postgresql(postgres, tmp_path):
    _two_writers(_fresh(postgres, "writers"), tmp_path)


def test_reading_a_postgresql_database_without_a_store_creates_nothing(postgres, capsys):
    from gpuhealth.cli import main

    url = _fresh(postgres, "nostore")
    assert main(["history", "regressions", "--history", url]) == 2
    assert "the database holds no run store (no gpuhealth tables" in capsys.readouterr().err
    engine = sa.create_engine(engine_url(url, Path.cwd()))
    with engine.connect() as conn:
        assert sa.inspect(conn).get_table_names() == []
    engine.dispose()


def test_an_unreachable_postgresql_is_one_clear_error(tmp_path):
    history = History(f"postgresql://nobody@/none?host={tmp_path}", tmp_path)
    assert history.store() is None
    assert str(history.error).startswith("history store postgresql+psycopg://nobody@/none")
    assert "No such file" in str(history.error) or "connection" in str(history.error)


def test_outcomes_are_kept_for_the_next_run(nights, tmp_path):
    outcome = Outcome("ecc_errors", "FAIL", "n1", 3, "volatile 2 > 0", "n1 gpu3", "RESET_GPU")
    store = nights.write(T0, [NodeVerdict("n1", "FAIL")], [outcome], {})
    assert store.last_states(["n1", "n9"]) == {
        "n1": {"run_id": 1, "at": T0, "verdict": "FAIL", "failed": {("ecc_errors", 3)}}
    }


def test_the_history_command_shows_plots_and_prunes(nights, tmp_path, capsys):
    """The CLI's plumbing on a real store: a node's table per night, a plot, prune, and a
    store that is missing or empty (test_history_morning has the views themselves)."""
    from gpuhealth.cli import main

    for night in range(3):
        now = healthy()
        gpu(now, 3)["ecc"]["aggregate"]["corrected"] = 100 * night
        nights.remember(now, T0 + night * DAY)
    store = str(tmp_path / "history.sqlite")
    assert main(["history", "node17", "--gpu", "3", "--last", "3", "--history", store]) == 0
    out = capsys.readouterr().out
    assert "ecc_corrected_aggregate  " in out.split("node17 gpu3 (")[0]  # the line per metric
    table = out.split("node17 gpu3 (")[1].splitlines()
    assert table[1].split()[0] == "metric" and len(table[1].split()) == 1 + 2 * 3  # 3 runs
    row = next(line for line in table if line.startswith("ecc_corrected_aggregate"))
    assert row.split()[1:] == ["0", "100", "200"]
    png = tmp_path / "trend.png"
    assert main(["history", "--plot", str(png), "--metric", "ecc_*", "--history", store]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert main(["history", "prune", "--keep", "1d", "--history", store]) == 0
    assert "pruned 3 runs older than 1 days" in capsys.readouterr().out  # T0 is years ago
    missing = tmp_path / "none" / "x.sqlite"
    assert main(["history", "--history", str(missing)]) == 2  # reading never creates a store
    assert f"no run store at {missing}" in capsys.readouterr().err
    assert not missing.parent.exists()
    Store("empty.sqlite", tmp_path).close()
    assert main(["history", "--history", str(tmp_path / "empty.sqlite")]) == 0
    assert "0 hosts, 0 runs in sqlite:///" in capsys.readouterr().out
