"""Run history over whole series of nights: slow decay, noise, steps, re-judged nights, pins.

Each night is judged by the real regression checks on the `history` section the suite builds
from a real SQLite store, then written to it as the reporter writes a run (the node's verdict
from what the checks found, its regressions, what it measured), so every rule sees what a
nightly job would see, including which nights count for its baselines. Nights are dated by
their facts' `collected_at`.
"""

from __future__ import annotations

import copy
import random
import time
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.checks import NodeView, evaluate
from gpuhealth.families.history.checks import notes_of, regressions_of
from gpuhealth.history.run import History, measured, measured_load, run_record, store_usage_error
from gpuhealth.history.store import Store
from gpuhealth.registry import check
from gpuhealth.report import NodeVerdict
from gpuhealth.results import Status
from selftest.facts import healthy_h100, limits

DAY = 86400.0
T0 = 1_790_000_000.0
BUSBW = 476.5
HOT_GPU = 6


def stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def facts(at: float, busbw: float | None = None, idle_c: float | None = None) -> dict[str, Any]:
    """A healthy node's facts collected at `at`, with this all_reduce busbw and GPU 6's idle
    temperature."""
    found = copy.deepcopy(HEALTHY)
    found["collected_at"] = stamp(at)
    if busbw is not None:
        row = {
            "size": 4294967296,
            "out_of_place": {"busbw_gbps": busbw - 1, "wrong": 0},
            "in_place": {"busbw_gbps": busbw, "wrong": 0},
        }
        run = {"collective": "all_reduce", "rows": [row]}
        found["nccl"] = {"nodes": 1, "error": None, "run": run}
    if idle_c is not None:
        found["gpus"][HOT_GPU]["temperature_c"] = idle_c
    return found


HEALTHY = healthy_h100()


class Series:
    """A node's nights in a real store: each judged by the history checks, then kept."""

    def __init__(self, base: Path, policy: str = "fail", host: str = "node17") -> None:
        self.base, self.policy, self.host = base, policy, host
        self.limits = limits("h100-sxm")
        self.runs = 0

    def _history(self, started: float, read_only: bool = False) -> History:
        history = History("history.sqlite", self.base, self.policy, started_at=started)
        history.read_only = read_only
        history.uid = f"{self.host}-{self.runs}"
        self.runs += 1
        return history

    def night(self, found: dict[str, Any], judged_at: float | None = None) -> list[dict[str, Any]]:
        """Judge one night's facts and keep it (the run started at `judged_at`, by default
        its facts' night); the regressions reported."""
        started = judged_at if judged_at is not None else time.time()
        history = self._history(started)
        view = NodeView(
            self.host,
            {**found, "history": history.section(self.host, self.limits, found)},
            self.limits,
        )
        results = [evaluate(check("gpu_regression"), view, HOT_GPU)]
        results += [evaluate(check(name), view) for name in ("node_regression", "load_regression")]
        regressions = [r for f in results for r in regressions_of(f.result)]
        verdict = "PASS"
        if any(f.status is Status.FAIL for f in results):
            verdict = "FAIL"
        elif any(f.status is Status.WARN for f in results):
            verdict = "WARN"
        kept = measured(view)
        if "nccl" in found:
            kept["rows"] += measured_load(view, "nccl")["rows"]
        node = NodeVerdict(self.host, verdict, regressions=regressions)
        node.notes = [n for f in results for n in notes_of(f.result)]
        record = run_record(
            history,
            complete=True,
            exit_status=1 if verdict == "FAIL" else 0,
            level="standard",
            source="facts",
            command="pytest",
            inventory=None,
            verdicts=[node],
            outcomes=[],
            measured_by_host={self.host: kept},
        )
        store = history.store()
        assert store is not None, history.error
        store.write_run(record)
        history.close()
        self.last = node
        return regressions

    def store(self) -> Store:
        return Store("history.sqlite", self.base)


def first_flagged(series: Series, nights: list[dict[str, Any]]) -> int | None:
    """The first night (index) with a regression, judging every night of the list."""
    flagged = [n for n, found in enumerate(nights) if series.night(found)]
    return flagged[0] if flagged else None


# ---------------------------------------------------------------- slow decay, noise


def test_busbw_falling_one_percent_a_night_is_flagged_within_twelve_nights(tmp_path):
    nights = [facts(T0 + n * DAY, busbw=BUSBW * 0.99**n) for n in range(20)]
    series = Series(tmp_path)
    flagged = [n for n, found in enumerate(nights) if series.night(found)]
    assert flagged and flagged[0] < 12, flagged
    # ... and every night after it: a flagged night never enters a baseline.
    assert flagged == list(range(flagged[0], 20))
    (entry,) = series.last.regressions
    assert entry["metric"] == "nccl_busbw_gbps"
    # The level rule reaches it too in the end: against the reference, which stayed put.
    assert "below its reference" in entry["message"] or "below its baseline" in entry["message"]


def test_busbw_falling_three_percent_a_night_is_flagged_well_before_sixteen_percent(tmp_path):
    """After a healthy week, busbw falling 3 % a night is flagged by the fourth night of the
    fall (11.5 % down), where the issue saw it flagged only at 16.7 % down."""
    values = [BUSBW] * 7 + [BUSBW * 0.97**n for n in range(1, 9)]
    nights = [facts(T0 + n * DAY, busbw=v) for n, v in enumerate(values)]
    first = first_flagged(Series(tmp_path), nights)
    assert first is not None and 1 - values[first] / BUSBW < 0.12, first


def test_busbw_falling_one_percent_a_night_after_a_healthy_fortnight(tmp_path):
    """A decay that starts after the baselines have formed: the trend sees it at about
    6 % down, where the rolling median alone never would."""
    values = [BUSBW] * 14 + [BUSBW * 0.99**n for n in range(1, 21)]
    nights = [facts(T0 + n * DAY, busbw=v) for n, v in enumerate(values)]
    first = first_flagged(Series(tmp_path), nights)
    assert first is not None and first - 13 <= 8, first


def test_busbw_noise_of_four_percent_is_no_regression_in_thirty_nights(tmp_path):
    rng = random.Random(20261206)
    values = [BUSBW * (1 + rng.uniform(-0.04, 0.04)) for _ in range(30)]
    series = Series(tmp_path)
    for n, value in enumerate(values):
        assert series.night(facts(T0 + n * DAY, busbw=value)) == [], (n, value)


def test_idle_temperature_rising_two_degrees_a_night_is_flagged_before_44c(tmp_path):
    series = Series(tmp_path)
    for n in range(8):
        found = series.night(facts(T0 + n * DAY, idle_c=30 + 2 * n))
        if found:
            break
    assert found, "never flagged"
    (entry,) = found
    assert entry["metric"] == "idle_temperature_c" and entry["value"] < 44
    assert "idle temperature rises steadily: 2.0 C a run" in entry["message"]


# ---------------------------------------------------------------- steps, policies


@pytest.mark.parametrize("policy", ["fail", "warn"])
def test_a_step_held_for_six_nights_is_flagged_every_night(tmp_path, policy):
    series = Series(tmp_path, policy)
    for n in range(7):
        assert series.night(facts(T0 + n * DAY, idle_c=30)) == []
    for n in range(7, 13):
        (entry,) = series.night(facts(T0 + n * DAY, idle_c=42))
        assert entry["baseline"] == 30 and entry["value"] == 42, (n, entry)
        assert series.last.verdict == ("FAIL" if policy == "fail" else "WARN")
    runs = series.store().host_history("node17", 20)
    assert [s["regressions"] for s in runs[:6]] == [1] * 6  # each warned night kept as such


# ---------------------------------------------------------------- nights judged again


def test_a_rejudged_night_is_no_new_night_and_repeats_no_regression(tmp_path):
    """Correctable ECC grows 100 a night; night 3 also gains 2 remapped rows (a regression).
    Night 3's facts judged again, after night 5: judged against nights 0-2 only (no counter
    'went down' against later nights), the remapped rows a note, not a regression again;
    the store keeps it as a re-judgement; night 6 does not report the rows a second time."""
    series = Series(tmp_path)

    def night(n: int) -> dict[str, Any]:
        found = facts(T0 + n * DAY)
        found["gpus"][HOT_GPU]["ecc"]["aggregate"]["corrected"] = 100 * n
        found["gpus"][HOT_GPU]["remapped_rows"]["correctable"] = 2 if n >= 3 else 0
        return found

    for n in range(6):
        found = series.night(night(n))
        assert [r["metric"] for r in found] == (["remapped_rows_correctable"] if n == 3 else [])
    again = series.night(night(3))
    assert again == [] and series.last.verdict == "PASS"
    assert any(note.startswith("already reported for this night: ") for note in series.last.notes)
    assert any("judged again (first by run node17-3)" in note for note in series.last.notes)
    store = series.store()
    runs = store.runs()
    assert len(runs) == 7 and runs[-1]["rejudged"] == {"node17": T0 + 3 * DAY}
    assert len(store.host_history("node17", 50)) == 6  # still six nights
    assert series.night(night(6)) == []  # the rows grew on night 3, reported once
    assert store.last_states(["node17"])["node17"]["at"] == T0 + 6 * DAY


def test_facts_without_a_collection_time_are_dated_by_the_run(tmp_path):
    series = Series(tmp_path)
    undated = facts(T0)
    del undated["collected_at"]
    series.night(undated, judged_at=T0 + 5)
    (sample,) = series.store().host_history("node17", 5)
    assert sample["at"] == T0 + 5


# ---------------------------------------------------------------- pins


def test_pin_after_a_repair_resets_the_reference(tmp_path, monkeypatch, capsys):
    """GPU 6 idles at 30 C for 7 nights, then at 41 C after its fan is replaced by another
    model (flagged); once pinned, its baselines restart from its next night at the new level."""
    from gpuhealth.cli import main

    start = time.time() - 10 * DAY
    series = Series(tmp_path)
    for n in range(7):
        assert series.night(facts(start + n * DAY, idle_c=30)) == []
    (entry,) = series.night(facts(start + 7 * DAY, idle_c=41))
    assert entry["baseline"] == 30
    monkeypatch.chdir(tmp_path)
    pin = ["history", "pin", "node17", "--gpu", str(HOT_GPU), "--reason", "new fan"]
    assert main([*pin, "--history", "history.sqlite"]) == 0
    assert "pinned node17 gpu6 (" in capsys.readouterr().out
    later = [series.night(facts(time.time() + (1 + n) * DAY, idle_c=41)) for n in range(5)]
    assert later == [[]] * 5
    gpu6 = evaluate(
        check("gpu_regression"),
        NodeView(
            "node17",
            {
                **facts(time.time() + 6 * DAY, idle_c=41),
                "history": History("history.sqlite", tmp_path).section(
                    "node17", series.limits, facts(time.time() + 6 * DAY)
                ),
            },
            series.limits,
        ),
        HOT_GPU,
    )
    assert gpu6.status is Status.PASS, gpu6.text
    (kept,) = series.store().pins("node17")
    assert (kept["gpu"], kept["reason"]) == (HOT_GPU, "new fan")


# ---------------------------------------------------------------- the store's path


def test_a_history_path_that_names_no_store_is_a_usage_error(tmp_path):
    Store("kept.sqlite", tmp_path).close()
    assert store_usage_error("kept.sqlite", tmp_path, False, False) is None
    problem = store_usage_error("kpet.sqlite", tmp_path, False, False)
    assert problem is not None and f"no run store at {tmp_path / 'kpet.sqlite'}" in problem
    assert "--history-create" in problem
    assert store_usage_error("kpet.sqlite", tmp_path, True, False) is None
    assert store_usage_error("reports/history.sqlite", tmp_path, False, False) is None  # default
    assert "no run store" in str(store_usage_error("kpet.sqlite", tmp_path, False, True))
    assert store_usage_error("postgresql://u@db/gpuhealth", tmp_path, False, False) is None
    assert not (tmp_path / "kpet.sqlite").exists()
