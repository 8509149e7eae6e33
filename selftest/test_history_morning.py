"""The morning answer and the history views: `gpuhealth history regressions` across a fleet,
a node's compact view, usage errors, and the fleet plots (tested by what is drawn: matplotlib's
artists and labels, not pixels).

Each night of a small fleet is judged by the real regression checks on the `history` section
the suite builds from a real SQLite store and written as the reporter writes a run, so what
the views show is what a nightly job would have stored.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.checks import NodeView, evaluate
from gpuhealth.cli import main
from gpuhealth.families.history.checks import regressions_of
from gpuhealth.families.history.limits import HistoryLimits
from gpuhealth.history import morning, plots
from gpuhealth.history.run import History, measured, measured_load, run_record
from gpuhealth.history.store import RunRecord, Store
from gpuhealth.registry import check
from gpuhealth.report import NodeVerdict
from gpuhealth.results import Status
from selftest.facts import healthy_h100, limits

DAY = 86400.0
T0 = 1_790_000_000.0  # 2026-09-21: stamps this large printed as 1.79e+09 once
BUSBW = 476.5
HEALTHY = healthy_h100()
LIMITS = limits("h100-sxm")


def stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def facts(at: float, busbw: float = BUSBW, temps: dict[int, float] | None = None) -> dict:
    """A healthy node's facts collected at `at` with an all_reduce run peaking at `busbw`
    and these GPUs' idle temperatures."""
    found = copy.deepcopy(HEALTHY)
    found["collected_at"] = stamp(at)
    row = {
        "size": 4294967296,
        "out_of_place": {"busbw_gbps": busbw - 1, "wrong": 0},
        "in_place": {"busbw_gbps": busbw, "wrong": 0},
    }
    found["nccl"] = {"nodes": 1, "error": None, "run": {"collective": "all_reduce", "rows": [row]}}
    for index, celsius in (temps or {}).items():
        found["gpus"][index]["temperature_c"] = celsius
    return found


def serials(found: dict[str, Any], host: str) -> dict[str, Any]:
    """Each node's GPUs have their own serials (a fleet of copies of one node would not),
    named after the machine's serial where the facts name one, else the host."""
    machine = (found.get("system") or {}).get("machine") or {}
    name = machine.get("product_serial") or host
    for gpu in found["gpus"]:
        gpu["serial"] = f"{name}-SN{gpu['index']}"
        gpu["uuid"] = f"GPU-{name}-{gpu['index']}"
    return found


class Fleet:
    """A fleet's nights in a real store: each night one run judging every host."""

    def __init__(self, base: Path, hosts: list[str], policy: str = "fail") -> None:
        self.base, self.hosts, self.policy = base, hosts, policy
        self.spec = str(base / "history.sqlite")
        self.runs = 0

    def night(
        self,
        at: float,
        facts_of: Callable[[str, float], dict[str, Any]],
        inventory: str | None = "ansible://gpu_nodes",
        hosts: list[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Judge the night's facts of every host and keep them as one run; its regressions."""
        history = History(self.spec, self.base, self.policy, started_at=at + 60)
        history.uid = f"run{self.runs:04d}-{int(at)}"
        self.runs += 1
        verdicts, kept, found = [], {}, []
        for host in hosts or self.hosts:
            data = serials(facts_of(host, at), host)
            view = NodeView(host, {**data, "history": history.section(host, LIMITS, data)}, LIMITS)
            results = [evaluate(check("gpu_regression"), view, n) for n in range(8)]
            results += [evaluate(check(n), view) for n in ("node_regression", "load_regression")]
            regressions = [r for f in results for r in regressions_of(f.result)]
            bad = any(f.status in (Status.FAIL, Status.WARN) for f in results)
            verdict = ("FAIL" if self.policy == "fail" else "WARN") if bad else "PASS"
            verdicts.append(NodeVerdict(host, verdict, regressions=regressions))
            kept[host] = measured(view)
            kept[host]["rows"] += measured_load(view, "nccl")["rows"]
            found += regressions
        record = run_record(
            history,
            complete=True,
            exit_status=0,
            level="standard",
            source="facts",
            command="pytest",
            inventory=inventory,
            verdicts=verdicts,
            outcomes=[],
            measured_by_host=kept,
        )
        store = history.store()
        assert store is not None, history.error
        store.write_run(record)
        history.close()
        return found


def hot(host_hot: str, gpu: int, start: int, per_night: float = 0.0, step: float = 0.0):
    """Facts where one GPU of one host runs hotter from night `start` on."""

    def facts_of(host: str, at: float) -> dict[str, Any]:
        night = round((at - T0) / DAY)
        temps = {}
        if host == host_hot and night >= start:
            temps[gpu] = 30 + step + per_night * (night - start + 1)
        return facts(at, temps={n: temps.get(n, 30.0) for n in range(8)})

    return facts_of


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Fleet:
    """Six nodes over ten nights; node05's gpu5 idles 20 C hotter from night 8 on."""
    base = tmp_path_factory.mktemp("fleet")
    found = Fleet(base, [f"node{n:02d}" for n in range(6)])
    for night in range(10):
        found.night(T0 + night * DAY, hot("node05", 5, 8, step=20.0))
    return found


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    status = main(["history", *argv])
    out, err = capsys.readouterr()
    return status, out, err


# ---------------------------------------------------------------- the morning answer


def test_regressions_of_the_last_run_one_line_each_and_exit_by_policy(fleet, capsys):
    status, out, _ = run_cli(capsys, "regressions", "--history", fleet.spec)
    assert status == 1
    lines = out.splitlines()
    assert lines[0].startswith("1 regressions on 1 of 6 nodes judged in the last run run0009-")
    assert "ansible://gpu_nodes" in lines[0]
    header, row = lines[1].split(), lines[2].split()
    assert header[:2] == ["night", "(UTC)"]
    night = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(T0 + 9 * DAY))
    assert " ".join(row[:2]) == night
    assert row[2:10] == [
        "node05",
        "5",
        "node05-SN5",
        "idle_temperature_c",
        "[C]",
        "50",  # the value
        "30",  # the reference
        "30",  # the rolling baseline
    ]
    assert "10 C above the rolling baseline (regression_idle_temp_rise_c)" in lines[2]
    assert run_cli(capsys, "regressions", "--regressions", "warn", "--history", fleet.spec)[0] == 0


def test_regressions_as_json(fleet, capsys):
    status, out, _ = run_cli(capsys, "regressions", "--json", "--history", fleet.spec)
    assert status == 1
    doc = json.loads(out)
    assert doc["nodes_judged"] == 6 and doc["policy"] == "fail"
    (entry,) = doc["regressions"]
    assert {k: entry[k] for k in ("host", "gpu", "serial", "metric", "unit", "key")} == {
        "host": "node05",
        "gpu": 5,
        "serial": "node05-SN5",
        "metric": "idle_temperature_c",
        "unit": "C",
        "key": "regression_idle_temp_rise_c",
    }
    assert (entry["value"], entry["reference"], entry["rolling"]) == (50.0, 30.0, 30.0)
    assert entry["night"] == T0 + 9 * DAY and entry["night_utc"] == "2026-09-30 14:13:20"


def test_regressions_since_a_time_include_earlier_nights(fleet, capsys):
    since = time.strftime("%Y-%m-%dT%H:%M", time.gmtime(T0 + 7 * DAY + 3600))
    status, out, _ = run_cli(capsys, "regressions", "--since", since, "--history", fleet.spec)
    assert status == 1
    assert out.splitlines()[0].startswith("2 regressions on 1 of 6 nodes judged in nights since")
    # Night 8 and 9 both: a warned or failed night never becomes the baseline.
    assert [line.split()[0:2] for line in out.splitlines()[2:]] == [
        time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(T0 + n * DAY)).split() for n in (8, 9)
    ]


def test_no_night_in_the_window_is_no_answer(fleet, capsys):
    status, _, err = run_cli(capsys, "regressions", "--since", "2d", "--history", fleet.spec)
    assert status == 2 and "nothing was judged, so no answer" in err
    empty = fleet.base / "empty.sqlite"
    Store(str(empty)).close()
    assert run_cli(capsys, "regressions", "--history", str(empty))[0] == 2


def test_a_trend_regression_names_both_baselines(tmp_path, capsys):
    """A GPU warming 2 C a night: flagged by its trend while its level is within 10 C of
    both baselines; the line shows the reference (where it started) and the rolling one."""
    found = Fleet(tmp_path, ["a1", "a2"])
    flagged = []
    for night in range(14):
        flagged.append(found.night(T0 + night * DAY, hot("a2", 1, 3, per_night=2.0)))
    first = next(n for n, regs in enumerate(flagged) if regs)
    (entry,) = flagged[first]
    assert "steadily" in entry["message"]
    store = Store(found.spec)
    scope = morning.Scope("", 2, since=T0 + first * DAY)
    reported = morning.regressions(store, scope)[0]
    assert reported.rule.startswith("trend: rises >= 1 C a run")
    assert reported.key == "regression_idle_temp_trend_c_per_run"
    assert reported.reference == 30.0 and reported.rolling is not None and reported.rolling > 30
    store.close()


def test_the_rule_names_the_baseline_that_tripped():
    """Read from the message the checks write (judge_drift, judge_trend, judge_counter)."""
    lim = LIMITS.get(HistoryLimits)
    temp, busbw = morning.lookup("idle_temperature_c"), morning.lookup("nccl_busbw_gbps")
    said = "idle temperature 43 C is 13 C above its reference 30 C (median of the first 5"
    assert morning._rule(temp, said, lim) == ("10 C above the reference", temp.key)
    said = "single-node all_reduce busbw 420 GB/s is 11.9% below its baseline 476.5 GB/s"
    assert morning._rule(busbw, said, lim) == ("10% below the rolling baseline", busbw.key)
    ecc = morning.lookup("ecc_corrected_aggregate")
    assert morning._rule(ecc, "correctable ECC errors +5000", lim)[0] == "> 1000 a day"
    assert morning._rule(None, "n1: new failure: PASS", lim)[1] is None


# ---------------------------------------------------------------- usage errors


def test_an_unknown_host_or_subcommand_is_a_usage_error_naming_what_exists(fleet, capsys):
    status, out, err = run_cli(capsys, "show", "--history", fleet.spec)
    assert status == 2 and out == ""
    assert "'show' is neither a subcommand (regressions, prune, pin) nor a host" in err
    assert "node00, node01" in err
    status, _, err = run_cli(capsys, "node5", "--history", fleet.spec)
    assert status == 2 and "hosts like it: node05" in err
    assert run_cli(capsys, "pin", "nodeX", "--history", fleet.spec)[0] == 2
    status, _, err = run_cli(capsys, "node05", "--json", "--history", fleet.spec)
    assert status == 2 and "--json and --last-run go with `regressions`" in err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [("--last", "0", ">= 1"), ("--last", "-1", ">= 1"), ("--gpu", "-1", ">= 0")],
)
def test_a_count_below_its_least_is_a_usage_error(fleet, capsys, option, value, message):
    """`--last -1` showed every night but the newest (a negative slice), `--last 0` the
    default 8 nights, `--gpu -1` nothing, each with exit 0."""
    with pytest.raises(SystemExit) as exited:
        run_cli(capsys, "node05", f"{option}={value}", "--history", fleet.spec)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: '{value}' is not a whole number {message}" in err


def test_a_store_that_does_not_exist_is_a_usage_error(tmp_path, capsys):
    missing = tmp_path / "typo" / "history.sqlite"
    for argv in (["regressions"], [], ["node01"], ["pin", "node01"]):
        status, _, err = run_cli(capsys, *argv, "--history", str(missing))
        assert status == 2 and f"no run store at {missing}" in err
    assert not missing.parent.exists()


# ---------------------------------------------------------------- the compact node view


def test_a_node_is_shown_regressions_first_one_line_per_metric(fleet, capsys):
    status, out, _ = run_cli(capsys, "node05", "--history", fleet.spec)
    assert status == 0
    lines = out.splitlines()
    assert len(lines) < 40, out  # was about 135 lines per node
    assert lines[0].startswith("node05: 10 nights measured, 2026-09-21 ")
    assert lines[2].startswith("regressions since ") and lines[2].endswith(": 2")
    assert "node05-SN5" in lines[4] and "idle_temperature_c" in lines[4]
    temp = next(line for line in lines if line.startswith("idle_temperature_c [C]"))
    assert "8 GPUs" in temp and "30..50" in temp
    assert "gpu5 node05-SN5: 50 (reference 30, rolling 30" in temp
    still = next(line for line in lines if line.startswith("no growth over the nights shown:"))
    assert "ecc_uncorrected_aggregate" in still
    assert "e+09" not in out  # no stamp in exponent notation
    # Per night on request, the columns to the second.
    status, out, _ = run_cli(capsys, "node05", "--gpu", "5", "--last", "3", "--history", fleet.spec)
    table = out.split("node05 gpu5 (node05-SN5)")[1].splitlines()
    assert len(table[1].split()) == 1 + 2 * 3
    assert table[1].split()[-1] == time.strftime("%H:%M:%S", time.gmtime(T0 + 9 * DAY))
    # Where the kernel log reading ended is a time, shown as one (it once read 1.79091e+09).
    out = run_cli(capsys, "node05", "--last", "3", "--history", fleet.spec)[1]
    until = next(line for line in out.splitlines() if line.startswith("kernel_log_until"))
    assert re.fullmatch(r"kernel_log_until(\s+\d\d-\d\d \d\d:\d\d:\d\d){3}", until), until


def test_the_fleet_view_tells_two_runs_in_the_same_minute_apart(tmp_path, capsys):
    found = Fleet(tmp_path, ["a1", "b1"])
    found.night(T0, lambda h, at: facts(at), inventory="ansible://group_a", hosts=["a1"])
    found.night(T0 + 20, lambda h, at: facts(at), inventory="ansible://group_b", hosts=["b1"])
    status, out, _ = run_cli(capsys, "--history", found.spec)
    assert status == 0
    runs = [line for line in out.splitlines() if " run run000" in line]
    assert len(runs) == 2 and runs[0] != runs[1]
    assert runs[0].split()[1] != runs[1].split()[1]  # seconds
    assert "group_a" in runs[0] and "group_b" in runs[1]
    # The morning answer covers both: a fleet judged as shards or CI groups is several runs.
    status, out, _ = run_cli(capsys, "regressions", "--history", found.spec)
    assert status == 0
    assert out.startswith("0 regressions on 0 of 2 nodes judged in the last night's 2 runs: ")


def test_a_renamed_host_is_shown_with_its_nights_before_the_rename(tmp_path, capsys):
    """History follows the machine (its DMI serial), so the new name's view holds the nights
    under the old name, and its hot GPU's baselines come from them."""
    found = Fleet(tmp_path, [])

    def chassis(host: str, at: float) -> dict[str, Any]:
        data = hot("r2", 2, 5, step=20.0)(host, at)
        data["system"] = {**data["system"], "machine": {"product_serial": "7CE312P0QX"}}
        return data

    for night in range(6):
        found.night(T0 + night * DAY, chassis, hosts=["r1" if night < 4 else "r2"])
    status, out, _ = run_cli(capsys, "r2", "--history", found.spec)
    assert status == 0
    assert out.startswith("r2: 6 nights measured, 2026-09-21 14:13:20 .. 2026-09-26 14:13:20 UTC")
    temp = next(line for line in out.splitlines() if line.startswith("idle_temperature_c"))
    assert "gpu2 7CE312P0QX-SN2: 50 (reference 30, rolling 30" in temp
    assert len(out.split("its last 6 nights:")[1].strip().splitlines()) == 6
    status, out, _ = run_cli(capsys, "regressions", "--json", "--history", found.spec)
    (entry,) = json.loads(out)["regressions"]
    assert (entry["host"], entry["reference"], entry["rolling"]) == ("r2", 30.0, 30.0)


# ---------------------------------------------------------------- plots


def test_a_port_counter_is_one_panel_with_a_series_per_port(tmp_path, capsys):
    """`--metric 'ib.*'` on a fleet: each counter is one panel over every port of every node
    (named `host device.port`), not a panel per port."""
    store = Store(str(tmp_path / "ib.sqlite"))
    for night in range(3):
        at = T0 + night * DAY
        run = RunRecord(
            f"ib-{night}", at, at + 60, True, 0, "quick", "live", "pytest", None, "", "c", "v"
        )
        for host in ("n1", "n2"):
            run.nodes.append({"host": host, "verdict": "PASS", "collected_at": at})
            for port in ("mlx5_0.1", "mlx5_1.1"):
                for counter in ("symbol_error", "link_downed"):
                    name = f"ib.{port}.{counter}"
                    value = 10.0 * night if (host, port) == ("n2", "mlx5_1.1") else 0.0
                    run.measurements.append(
                        {"host": host, "gpu": None, "gpu_key": None, "metric": name, "value": value}
                    )
        store.write_run(run)
    rows = plots.values(store, plots.names_like(store, "ib.*"))
    store.close()
    assert sorted(rows) == ["ib.*.link_downed", "ib.*.symbol_error"]
    found = plots.collect(rows["ib.*.symbol_error"], set(), "ib.*.symbol_error")
    assert sorted(s.label for s in found.values()) == [
        "n1 mlx5_0.1",
        "n1 mlx5_1.1",
        "n2 mlx5_0.1",
        "n2 mlx5_1.1",
    ]
    assert found[("n2", "mlx5_1.1")].values == [10.0, 10.0]  # per day
    made = plots.figure(rows, set(), ["ib.*.symbol_error"], "t", count=1)
    axis = made.axes[0]
    assert axis.get_ylabel().replace("\n", " ") == "symbol errors per day"
    assert axis.get_title() == "ib.*.symbol_error: 1 worst of 4 series"
    assert "n2 mlx5_1.1" in [t.get_text() for t in axis.get_legend().get_texts()]
    png = tmp_path / "ib.png"
    spec = str(tmp_path / "ib.sqlite")
    assert run_cli(capsys, "--plot", str(png), "--metric", "ib.*", "--history", spec)[0] == 0


def test_a_plot_that_cannot_be_written_is_a_usage_error(fleet, capsys, tmp_path):
    """A typo'd folder ended in a traceback and 'internal error' (exit 3)."""
    png = tmp_path / "typo" / "fleet.png"
    status, _, err = run_cli(capsys, "--plot", str(png), "--history", fleet.spec)
    assert status == 2 and f"--plot {png}: cannot write it: No such file or directory" in err


def test_the_fleet_plot_draws_the_band_the_worst_and_the_limits(fleet):
    store = Store(fleet.spec)
    rows = plots.values(store, ["idle_temperature_c"])
    regressed = plots.regressed_nights(store, None)
    store.close()
    made = plots.figure(rows, regressed, ["idle_temperature_c"], "t", count=3)
    axis = made.axes[0]
    assert axis.get_ylabel() == "idle temperature (C)"
    assert axis.get_title() == "idle_temperature_c: 3 worst of 48 series"
    labels = [t.get_text() for t in axis.get_legend().get_texts()]
    # The hot GPU is drawn, though the last node's (the first 40 series by name once were).
    assert "node05 gpu5" in labels
    assert {"fleet median", "fleet 10th-90th percentile", "fleet reference"} <= set(labels)
    assert "beyond the limit (regression_idle_temp_rise_c)" in labels
    assert "regression reported (2)" in labels
    hot_line = next(line for line in axis.get_lines() if line.get_label() == "node05 gpu5")
    assert list(hot_line.get_ydata())[-3:] == [30.0, 50.0, 50.0]
    marks = next(c for c in axis.collections if c.get_label() == "regression reported (2)")
    assert sorted(y for _, y in marks.get_offsets()) == [50.0, 50.0]
    # The limit band starts at the fleet's reference + 10 C, up to the top.
    band = next(p for p in axis.patches if p.get_label().startswith("beyond the limit"))
    assert band.get_y() == pytest.approx(40.0)
    assert band.get_y() + band.get_height() == pytest.approx(axis.get_ylim()[1])
    # The legend sits beside the data, not on it.
    made.canvas.draw()
    legend = axis.get_legend().get_window_extent()
    assert legend.x0 >= axis.get_window_extent().x1
    made.clear()


def test_counters_are_drawn_as_their_rule_judges_them(tmp_path):
    """Correctable ECC as growth per day, remapped rows as growth per night: never lifetime
    totals."""
    nights = (T0, T0 + DAY, T0 + 3 * DAY)  # a night left out: 3000 more over two days
    rows = [
        (at, "n1", 3, "SN3", value, "ecc_corrected_aggregate")
        for at, value in zip(nights, (1000, 1500, 4500), strict=True)
    ]
    found = plots.collect(rows, set(), "ecc_corrected_aggregate")
    assert found[("n1", "SN3")].values == [500.0, 1500.0]
    found = plots.collect(rows, set(), "remapped_rows_correctable")
    assert found[("n1", "SN3")].values == [500.0, 3000.0]
    made = plots.figure({"ecc_corrected_aggregate": rows}, set(), ["ecc_corrected_aggregate"], "t")
    axis = made.axes[0]
    assert axis.get_ylabel() == "correctable ECC errors per day"
    made = plots.figure(
        {"remapped_rows_correctable": rows}, set(), ["remapped_rows_correctable"], "t"
    )
    label = made.axes[0].get_ylabel().replace("\n", " ")
    assert label == "rows remapped for correctable errors: growth since the night before"
    assert axis.get_title() == "ecc_corrected_aggregate: all 1 series"
    band = next(p for p in axis.patches if p.get_label().startswith("beyond the limit"))
    assert band.get_y() == pytest.approx(1000.0)  # the daily allowance
    assert not [line for line in axis.get_lines() if line.get_label() == "fleet reference"]
    # A counter that resets (PCIe replays, after a reboot) counts from zero.
    reset = [(T0, "n1", 0, "SN0", 900.0, "x"), (T0 + DAY, "n1", 0, "SN0", 40.0, "x")]
    assert plots.collect(reset, set(), "pcie_replays")[("n1", "SN0")].values == [40.0]


def test_the_trend_png_of_the_report(fleet):
    store = Store(fleet.spec)
    data = plots.trends_png(store, T0 - DAY)
    store.close()
    assert data is not None and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_numbers_never_print_in_exponent_notation():
    assert morning.number(1_790_910_000.0) == "1790910000"
    assert morning.number(476.54) == "476.5"
    assert morning.number(None) == "-"
    assert morning.stamp(T0) == "2026-09-21 14:13:20"
