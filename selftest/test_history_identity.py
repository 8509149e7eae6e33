"""History follows the hardware: a node by its machine (DMI serials, system UUID, machine id),
a GPU by its serial, whatever the host is called and wherever the GPU sits.

Each night is judged by the real regression checks on the `history` section the suite builds
from a real store, then written as the reporter writes a run (several hosts in one run where
a test needs it), so identity is resolved exactly as a nightly job resolves it.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from gpuhealth.checks import NodeView, evaluate
from gpuhealth.families.history.checks import machine_notes, notes_of, regressions_of
from gpuhealth.families.system import metrics as system_metrics
from gpuhealth.families.system import probe as system_probe
from gpuhealth.history import store as store_module
from gpuhealth.history.run import measured, new_failures
from gpuhealth.history.store import Store, head_revision
from gpuhealth.registry import check
from gpuhealth.report import NodeVerdict
from gpuhealth.results import Status
from selftest.facts import healthy_h100
from selftest.test_history import Nights, _fresh, postgres  # noqa: F401  (a fixture)

DAY = 86400.0
T0 = 1_790_000_000.0
SERIAL = "7CE312P0QX"  # the chassis' serial (DMI product_serial)
BOARD = "PFXXL0034712"
MACHINE = "3d1219c7c4c5404aaa1f6d2a48adfda4"
REIMAGED = "9a0b77e1f3d24c5e8d6f1b2c3d4e5f60"
HEALTHY = healthy_h100()


def stamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def node(at: float, gpus: str = "", **ids: str | None) -> dict[str, Any]:
    """A healthy node's facts collected at `at`, its GPUs' serials and UUIDs ending in `gpus`
    (another node's GPUs), its machine's identities as given (none given: the facts name no
    machine, as older documents)."""
    found = copy.deepcopy(HEALTHY)
    found["collected_at"] = stamp(at)
    for gpu in found["gpus"]:
        gpu.update(serial=gpu["serial"] + gpus, uuid=gpu["uuid"] + gpus)
    if ids:
        machine = dict.fromkeys(system_metrics.NODE_ID_KINDS)
        machine.update(ids, unavailable={})
        found["system"] = {**found["system"], "machine": machine}
    else:
        found["system"] = {k: v for k, v in found["system"].items() if k != "machine"}
    return found


def grow(facts: dict[str, Any], index: int, corrected: int = 0, remapped: int = 0) -> None:
    """Add correctable ECC errors and rows remapped for correctable errors to a GPU."""
    gpu = facts["gpus"][index]
    gpu["ecc"]["aggregate"]["corrected"] += corrected
    gpu["remapped_rows"]["correctable"] += remapped


def swap(facts: dict[str, Any], index: int, serial: str, uuid: str) -> None:
    facts["gpus"][index].update(serial=serial, uuid=uuid)


class Fleet(Nights):
    """Hosts' nights in one real store: each night judged by the history checks, then kept."""

    def night(self, hosts: dict[str, dict[str, Any]], at: float) -> dict[str, list[Any]]:
        """Judge every host's facts (gpu_regression for every GPU, node_regression) and
        write them as one run started at `at`; each host's findings."""
        history = self.history(at)
        found, verdicts, kept = {}, [], {}
        for host, facts in hosts.items():
            section = history.section(host, self.limits, facts)
            view = NodeView(host, {**facts, "history": section}, self.limits)
            results = [evaluate(check("gpu_regression"), view, g["index"]) for g in facts["gpus"]]
            results.append(evaluate(check("node_regression"), view))
            failed = any(r.status is Status.FAIL for r in results)
            regressions = [entry for r in results for entry in regressions_of(r.result)]
            verdicts.append(
                NodeVerdict(host, "FAIL" if failed else "PASS", regressions=regressions)
            )
            kept[host] = measured(view)
            found[host] = results
        history.close()
        self.write(at, verdicts, [], kept).close()
        return found

    def store(self) -> Store:
        return Store(self.spec, self.base)


@pytest.fixture
def fleet(tmp_path):
    return Fleet("history.sqlite", tmp_path)


def regressions(results: list[Any]) -> list[tuple[int | None, str]]:
    return [(e["gpu"], e["metric"]) for r in results for e in regressions_of(r.result)]


def notes(results: list[Any]) -> list[str]:
    return [n for r in results for n in notes_of(r.result)]


def node_ids(store: Store) -> dict[str, set[str]]:
    """Each host name's machines, as the store's measurements carry them."""
    found: dict[str, set[str]] = {}
    for row in store.series(metric="ecc_corrected_aggregate"):
        found.setdefault(row["host"], set()).add(row["node_id"])
    return found


# ---------------------------------------------------------------- a node by its machine


def _renamed(fleet: Fleet, **ids: str) -> dict[str, list[Any]]:
    """Four nights as n3, then n7 with GPU 2 grown by 5000 correctable ECC errors and two
    remapped rows; the last night's findings."""
    for n in range(4):
        assert regressions(fleet.night({"n3": node(T0 + n * DAY, **ids)}, T0 + n * DAY)["n3"]) == []
    renamed = node(T0 + 4 * DAY, **ids)
    grow(renamed, 2, corrected=5000, remapped=2)
    return fleet.night({"n7": renamed}, T0 + 4 * DAY)


def test_a_renamed_host_keeps_its_history(fleet):
    found = _renamed(fleet, product_serial=SERIAL, board_serial=BOARD, machine_id=MACHINE)["n7"]
    assert sorted(regressions(found)) == [
        (2, "ecc_corrected_aggregate"),
        (2, "remapped_rows_correctable"),
    ]
    gpu2 = found[2].result.message
    assert "correctable ECC errors +5000 since the last run" in gpu2
    assert "rows remapped for correctable errors 0 -> 2" in gpu2
    (rename,) = [n for n in notes(found) if n.startswith("host n7 was")]
    assert rename == (
        f"host n7 was n3 until {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(T0 + 3 * DAY))}: "
        f"its history continues (machine product_serial:{SERIAL})"
    )
    node_regression = found[-1].result
    assert node_regression.status is Status.PASS
    assert "against 4 earlier runs" in node_regression.message
    assert not any("this GPU was in" in n for n in notes(found))  # the same machine
    assert node_ids(fleet.store()) == {
        "n3": {f"product_serial:{SERIAL}"},
        "n7": {f"product_serial:{SERIAL}"},
    }


def test_a_renamed_host_failing_now_is_a_new_failure(fleet):
    """'Passed last run, fails now' finds the last run by the machine, under its old name."""
    ids = {"product_serial": SERIAL, "board_serial": BOARD, "machine_id": MACHINE}
    for n in range(2):
        fleet.night({"n3": node(T0 + n * DAY, **ids)}, T0 + n * DAY)
    facts = node(T0 + 2 * DAY, **ids)
    history = fleet.history(T0 + 2 * DAY)
    section = history.section("n7", fleet.limits, facts)
    kept = {"n7": measured(NodeView("n7", {**facts, "history": section}, fleet.limits))}
    machine = kept["n7"]["identity"]["node_id"]
    assert machine == f"product_serial:{SERIAL}"
    store = fleet.store()
    failing = {"n7": NodeVerdict("n7", "FAIL", failed=[{"check": "ecc_errors", "gpu": 3}])}
    found = new_failures(store.last_states(["n7"], {"n7": machine}), failing, history.nights(kept))
    assert found["n7"]["message"].startswith("n7: new failure: PASS in the last run (")
    assert found["n7"]["message"].endswith("FAIL now: ecc_errors[gpu3]")
    # an unreachable n7 (no facts tonight): the machine its name last had, none yet
    assert store.last_states(["n7"]) == {}
    assert store.last_states(["n3"])["n3"]["verdict"] == "PASS"
    history.close()
    store.close()


def test_the_history_command_names_a_renamed_hosts_earlier_name(fleet, tmp_path, capsys):
    from gpuhealth.cli import main

    _renamed(fleet, product_serial=SERIAL)
    assert main(["history", "n7", "--history", str(tmp_path / "history.sqlite")]) == 0
    until = time.strftime("%Y-%m-%d %H:%M", time.gmtime(T0 + 3 * DAY))
    assert f"n7 was n3 until {until}" in capsys.readouterr().out


def test_a_pin_made_under_the_old_name_holds_after_a_rename(fleet):
    fleet.night({"n3": node(T0, product_serial=SERIAL)}, T0)
    store = fleet.store()
    store.pin("n3", None, None, T0 + 1, "fans replaced")
    store.close()
    history = fleet.history(T0 + DAY)
    section = history.section("n7", fleet.limits, node(T0 + DAY, product_serial=SERIAL))
    history.close()
    assert section["pins"]["node"] == T0 + 1 and section["machine"]["host"] == "n3"


def test_a_renamed_host_without_readable_dmi_is_followed_by_its_machine_id(fleet):
    found = _renamed(fleet, machine_id=MACHINE)["n7"]
    assert len(regressions(found)) == 2
    assert any(n.startswith("host n7 was n3 until") for n in notes(found))


def test_facts_that_name_no_machine_are_judged_by_host_name(fleet):
    """Older facts (no system.machine): the same host name keeps its history, clearly
    labelled; under a new name the node's history is lost (nothing to follow it by), its
    GPUs' is not (their serials)."""
    for n in range(2):
        fleet.night({"n3": node(T0 + n * DAY)}, T0 + n * DAY)
    later = node(T0 + 2 * DAY)
    grow(later, 2, corrected=5000, remapped=2)
    found = fleet.night({"n3": later}, T0 + 2 * DAY)["n3"]
    assert len(regressions(found)) == 2
    assert (
        "the facts name no machine (no DMI serial or machine id): its history follows the "
        "host name" in notes(found)
    )
    renamed = node(T0 + 3 * DAY)
    grow(renamed, 2, corrected=10000, remapped=4)
    found = fleet.night({"n7": renamed}, T0 + 3 * DAY)["n7"]
    assert found[-1].status is Status.SKIP
    assert found[-1].result.message.startswith("no baseline yet (0 runs)")
    assert sorted(regressions(found)) == [
        (2, "ecc_corrected_aggregate"),
        (2, "remapped_rows_correctable"),
    ]
    assert any(n.startswith("this GPU was in n3 gpu2 until") for n in notes_of(found[2].result))


def test_a_host_name_history_continues_when_its_facts_first_name_the_machine(fleet):
    """A store kept by host name (older facts): the host's first night with identities
    continues it, and from then on the machine is followed by them, renamed or not."""
    fleet.night({"n3": node(T0)}, T0)
    found = fleet.night({"n3": node(T0 + DAY, product_serial=SERIAL)}, T0 + DAY)["n3"]
    assert (
        f"its history so far was kept by host name; it now follows its product_serial {SERIAL}"
        in notes(found)
    )
    renamed = node(T0 + 2 * DAY, product_serial=SERIAL)
    grow(renamed, 5, remapped=1)
    found = fleet.night({"n7": renamed}, T0 + 2 * DAY)["n7"]
    assert regressions(found) == [(5, "remapped_rows_correctable")]
    assert node_ids(fleet.store())["n7"] == {"host:n3"}


def test_a_reimaged_host_keeps_its_history(fleet):
    """Re-imaging changes the machine id, not the serials: the history continues, with a note
    naming both machine ids; renamed at the same time, both notes."""
    for n in range(3):
        fleet.night(
            {"n3": node(T0 + n * DAY, board_serial=BOARD, machine_id=MACHINE)}, T0 + n * DAY
        )
    reimaged = node(T0 + 3 * DAY, board_serial=BOARD, machine_id=REIMAGED)
    grow(reimaged, 1, remapped=2)
    found = fleet.night({"n9": reimaged}, T0 + 3 * DAY)["n9"]
    assert regressions(found) == [(1, "remapped_rows_correctable")]
    said = notes(found)
    assert any(n.startswith("host n9 was n3 until") for n in said)
    (note,) = [n for n in said if n.startswith("re-imaged since")]
    assert f"(machine id {MACHINE} -> {REIMAGED}): its board_serial {BOARD} keeps" in note


def test_a_reimaged_host_whose_hardware_cannot_be_read_keeps_its_name_history(fleet):
    for n in range(2):
        fleet.night({"n3": node(T0 + n * DAY, machine_id=MACHINE)}, T0 + n * DAY)
    reimaged = node(T0 + 2 * DAY, machine_id=REIMAGED)
    grow(reimaged, 1, remapped=2)
    found = fleet.night({"n3": reimaged}, T0 + 2 * DAY)["n3"]
    assert regressions(found) == [(1, "remapped_rows_correctable")]
    assert any("so its history follows the host name" in n for n in notes(found))


def test_another_machine_given_a_used_host_name_starts_its_own_history(fleet):
    """A replacement chassis named like the old one: its serial differs, so the old one's
    counters are not its past (no false 'went down', no shared history)."""
    old = node(T0, product_serial=SERIAL, machine_id=MACHINE)
    grow(old, 2, corrected=9000, remapped=3)
    fleet.night({"n3": old}, T0)
    found = fleet.night({"n3": node(T0 + DAY, "R", product_serial="7CE400ABCD")}, T0 + DAY)["n3"]
    assert regressions(found) == []
    assert found[-1].status is Status.SKIP
    assert node_ids(fleet.store())["n3"] == {
        f"product_serial:{SERIAL}",
        "product_serial:7CE400ABCD",
    }


def test_an_identity_two_hosts_give_in_one_run_is_ignored(fleet):
    """Hosts imaged from one image that kept its machine id: never one machine."""
    fleet.night({"a": node(T0, machine_id=MACHINE), "b": node(T0, "B", machine_id=MACHINE)}, T0)
    a, b = node(T0 + DAY, machine_id=MACHINE), node(T0 + DAY, "B", machine_id=MACHINE)
    grow(b, 2, remapped=1)
    found = fleet.night({"a": a, "b": b}, T0 + DAY)
    assert regressions(found["a"]) == [] and regressions(found["b"]) == [
        (2, "remapped_rows_correctable")
    ]
    assert node_ids(fleet.store()) == {"a": {"host:a"}, "b": {"host:b"}}


def test_an_identity_two_hosts_give_in_two_runs_of_one_night_is_ignored(fleet):
    """The same clones judged as shards (`--shard K/N`: each shard its own run) a minute
    apart, two nights: each keeps its own history, neither is taken for the other renamed."""
    for n in range(2):
        at = T0 + n * DAY
        a = notes(fleet.night({"a": node(at, machine_id=MACHINE)}, at)["a"])
        b = notes(fleet.night({"b": node(at + 60, "B", machine_id=MACHINE)}, at + 60)["b"])
        assert not [x for x in a + b if x.startswith("host ") or "another GPU" in x]
    found = node_ids(fleet.store())
    assert len(found["a"]) == len(found["b"]) == 1 and found["a"] != found["b"]


def test_a_host_renamed_and_judged_again_the_same_night_keeps_its_machine_id(fleet):
    """Its serial decides: the machine id is no clone's, and stays one to follow it by."""
    fleet.night({"n3": node(T0, product_serial=SERIAL, machine_id=MACHINE)}, T0)
    found = fleet.night({"n7": node(T0 + 3600, product_serial=SERIAL, machine_id=MACHINE)}, T0)
    assert any(n.startswith("host n7 was n3 until") for n in notes(found["n7"]))
    store = fleet.store()
    with store.engine.connect() as conn:
        assert not conn.execute(sa.text("SELECT count(*) FROM aliases WHERE shared")).scalar()
    store.close()


@pytest.mark.parametrize(
    ("kind", "value", "usable"),
    [
        ("product_serial", "To Be Filled By O.E.M.", None),
        ("product_serial", "0000000000", None),
        ("product_serial", " 7CE312P0QX\n", "7CE312P0QX"),
        ("product_uuid", "03000200-0400-0500-0006-000700080009", None),
        ("product_uuid", "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", None),
        (
            "product_uuid",
            "4C4C4544-0042-3510-8052-B4C04F4E3732",
            "4c4c4544-0042-3510-8052-b4c04f4e3732",
        ),
        ("board_serial", "Default string", None),
        ("machine_id", "uninitialized", None),
        ("machine_id", MACHINE.upper(), MACHINE),
    ],
)
def test_placeholders_are_no_identity(kind, value, usable):
    assert system_metrics.real_id(kind, value) == usable


def test_the_kinds_the_store_ranks_are_the_probes():
    probed = tuple(kind for kind, _ in system_probe.MACHINE_IDS)
    assert store_module.ID_KINDS == system_metrics.NODE_ID_KINDS == probed


def test_the_probe_reads_the_machine_ids(tmp_path):
    dmi = tmp_path / "sys/class/dmi/id"
    dmi.mkdir(parents=True)
    (dmi / "product_serial").write_text(SERIAL + "\n")
    (dmi / "product_uuid").write_text("")
    (dmi / "board_serial").mkdir()  # unreadable as a file
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/machine-id").write_text("x" * 100)
    found = system_probe.machine_ids(str(tmp_path))
    assert found["product_serial"] == SERIAL
    assert found["product_uuid"] is None and found["board_serial"] is None
    assert found["machine_id"] is None
    why = found["unavailable"]
    assert why["product_uuid"] == {
        "kind": "not_supported",
        "detail": "/sys/class/dmi/id/product_uuid is empty",
    }
    assert why["board_serial"]["kind"] == "error"
    assert why["machine_id"]["detail"] == "/etc/machine-id: not an identity (100 characters)"
    (tmp_path / "etc/machine-id").unlink()
    missing = system_probe.machine_ids(str(tmp_path))["unavailable"]["machine_id"]
    assert missing == {
        "kind": "not_supported",
        "detail": "/etc/machine-id: No such file or directory",
    }


def test_machine_notes_of_a_section_without_a_store():
    assert machine_notes({"skipped": "run history off (--no-history)"}, "n3") == []


# ---------------------------------------------------------------- a GPU by its serial


def test_a_gpu_moved_between_slots_keeps_its_series(fleet):
    for n in range(2):
        fleet.night({"n3": node(T0 + n * DAY, product_serial=SERIAL)}, T0 + n * DAY)
    moved = node(T0 + 2 * DAY, product_serial=SERIAL)
    one, four = copy.deepcopy(moved["gpus"][1]), copy.deepcopy(moved["gpus"][4])
    moved["gpus"][1] = {**four, "index": 1, "pci_bus_id": one["pci_bus_id"]}
    moved["gpus"][4] = {**one, "index": 4, "pci_bus_id": four["pci_bus_id"]}
    expected = one["remapped_rows"]["correctable"] + 2
    grow(moved, 4, remapped=2)  # GPU 1's serial, now in slot 4
    found = fleet.night({"n3": moved}, T0 + 2 * DAY)["n3"]
    assert regressions(found) == [(4, "remapped_rows_correctable")]
    assert "this GPU was gpu1 then" in " ".join(notes(found))
    by_serial: dict[str, list[tuple[int, float]]] = {}
    for row in fleet.store().series(host="n3", metric="remapped_rows_correctable"):
        by_serial.setdefault(row["gpu_key"], []).append((row["gpu"], row["value"]))
    assert by_serial[one["serial"]][-2:] == [(1, expected - 2), (4, expected)]


def test_a_gpu_moved_to_another_node_keeps_its_series(fleet):
    a, b = node(T0, product_serial="A-1"), node(T0, "B", product_serial="B-2")
    fleet.night({"a": a, "b": b}, T0)
    traveller = copy.deepcopy(a["gpus"][2])
    a, b = node(T0 + DAY, product_serial="A-1"), node(T0 + DAY, "B", product_serial="B-2")
    swap(a, 2, "1650124088888", "GPU-00000000-0000-4000-8000-0000000000a2")  # a's new GPU
    b["gpus"][5].update(serial=traveller["serial"], uuid=traveller["uuid"])
    grow(b, 5, corrected=5000, remapped=2)
    found = fleet.night({"a": a, "b": b}, T0 + DAY)
    assert regressions(found["a"]) == []  # a's new GPU: no earlier value, no false regression
    assert sorted(regressions(found["b"])) == [
        (5, "ecc_corrected_aggregate"),
        (5, "remapped_rows_correctable"),
    ]
    said = " ".join(notes(found["b"]))
    assert "this GPU was in a gpu2 until" in said and "its counters continue from there" in said


def test_a_swapped_gpu_starts_its_own_series(fleet):
    """The new GPU has fewer errors than the one it replaced: no 'went down' (a shared line
    would say the counter is wrong), no baseline from its predecessor, its own series."""
    worn = node(T0, product_serial=SERIAL)
    grow(worn, 2, corrected=90000, remapped=6)
    fleet.night({"n3": worn}, T0)
    fresh = node(T0 + DAY, product_serial=SERIAL)
    swap(fresh, 2, "1650124077777", "GPU-00000000-0000-4000-8000-000000000002")
    found = fleet.night({"n3": fresh}, T0 + DAY)["n3"]
    assert regressions(found) == []
    gpu2 = found[2]
    assert gpu2.status is Status.SKIP and gpu2.result.message.startswith("no baseline yet (0 runs)")
    assert any("gpu2 is another GPU since the last run" in n for n in notes_of(gpu2.result))
    keys = {row["gpu_key"] for row in fleet.store().series(host="n3", gpu=2)}
    assert keys == {worn["gpus"][2]["serial"], "1650124077777"}


def test_a_gpu_serial_two_hosts_give_in_one_run_is_followed_on_its_node_only(fleet):
    """Stand-in GPUs with one serial on every node (a test bed) are not one GPU moving."""
    fleet.night({"a": node(T0, product_serial="A-1"), "b": node(T0, product_serial="B-2")}, T0)
    worn = node(T0 + DAY, product_serial="A-1")
    grow(worn, 2, remapped=3)
    fleet.night({"a": worn}, T0 + DAY)
    found = fleet.night({"b": node(T0 + 2 * DAY, product_serial="B-2")}, T0 + 2 * DAY)["b"]
    assert regressions(found) == []  # not "went down" against a's gpu2
    assert not any("this GPU was in" in n for n in notes(found))


def test_an_older_night_judged_again_after_a_rename_is_not_called_renamed(fleet):
    _renamed(fleet, product_serial=SERIAL)
    again = fleet.night({"n3": node(T0 + 2 * DAY, product_serial=SERIAL)}, T0 + 5 * DAY)["n3"]
    assert not any(n.startswith("host n3 was") for n in notes(again))
    assert any("judged again" in n for n in notes(again))


# ---------------------------------------------------------------- the store


def _upgraded_store_continues(spec: str, base: Path) -> None:
    """A store at schema 0002 (nights keyed by host name) opens at head: its nights are each
    their host's machine, and a night with identities continues them."""
    engine = sa.create_engine(store_module.engine_url(spec, base))
    with engine.begin() as conn:
        command.upgrade(store_module._alembic(conn), "0002")
        conn.execute(
            sa.text(
                "INSERT INTO runs (uid, started_at, finished_at, complete, level, source, "
                "command, profiles, controller, version) VALUES "
                "('old', :t, :t, :yes, 'quick', 'live', 'pytest', 'h100-sxm', 'c', '0.1')"
            ),
            {"t": T0, "yes": True},
        )
        run = "(SELECT id FROM runs WHERE uid = 'old')"
        conn.execute(
            sa.text(f"INSERT INTO nodes (run_id, host, verdict) VALUES ({run}, 'n3', 'PASS')")
        )
        conn.execute(
            sa.text(
                "INSERT INTO measurements (run_id, host, gpu, gpu_key, metric, value) VALUES "
                f"({run}, 'n3', 2, :key, 'remapped_rows_correctable', 0)"
            ),
            {"key": HEALTHY["gpus"][2]["serial"]},
        )
        conn.execute(
            sa.text(f"INSERT INTO gpus (run_id, host, idx, serial) VALUES ({run}, 'n3', 2, :key)"),
            {"key": HEALTHY["gpus"][2]["serial"]},
        )
    engine.dispose()
    store = Store(spec, base)
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT node_id FROM nodes")).scalar() == "host:n3"
        alias = conn.execute(
            sa.text("SELECT kind, value, node_id, last_at, shared FROM aliases")
        ).one()
    assert tuple(alias) == ("host", "n3", "host:n3", T0, False)
    assert store.machine("n3", {"board_serial": BOARD})["id"] == "host:n3"
    store.close()
    fleet = Fleet(spec, base)
    later = node(T0 + DAY, board_serial=BOARD)
    later["gpus"][2]["remapped_rows"]["correctable"] = 1
    found = fleet.night({"n3": later}, T0 + DAY)["n3"]
    assert regressions(found) == [(2, "remapped_rows_correctable")]


def test_a_store_from_before_identities_is_upgraded_and_continues(tmp_path):
    _upgraded_store_continues("old.sqlite", tmp_path)


def test_a_postgresql_store_from_before_identities_is_upgraded(postgres, tmp_path):  # noqa: F811
    _upgraded_store_continues(_fresh(postgres, "upgrade"), tmp_path)


def test_resolution_on_postgresql(postgres, tmp_path):  # noqa: F811
    fleet = Fleet(_fresh(postgres, "identity"), tmp_path)
    found = _renamed(fleet, product_serial=SERIAL, machine_id=MACHINE)["n7"]
    assert len(regressions(found)) == 2
    store = fleet.store()
    assert store.postgresql and store.machine("n3", {"product_serial": SERIAL})["host"] == "n7"
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == (
            head_revision()
        )
        shared = conn.execute(sa.text("SELECT count(*) FROM aliases WHERE shared")).scalar()
    assert shared == 0
    store.close()


def test_an_identity_with_a_control_character_is_none_on_postgresql(postgres, tmp_path):  # noqa: F811
    """Saved facts may carry a serial the probe would have refused (a NUL from firmware, a
    hand-edited document): it is no identity, and PostgreSQL, which stores no NUL in a text,
    keeps the night by the other identities instead of failing the run's write."""
    fleet = Fleet(_fresh(postgres, "control"), tmp_path)
    assert system_metrics.real_id("product_serial", "AB\x00CD") is None
    assert system_metrics.real_id("board_serial", "AB\tCD") is None
    fleet.night({"n3": node(T0, product_serial="AB\x00CD", machine_id=MACHINE)}, T0)
    store = fleet.store()
    assert node_ids(store) == {"n3": {f"machine_id:{MACHINE}"}}
    store.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_nul_in_a_gpu_serial_of_saved_facts_costs_the_store_no_run(backend, request, tmp_path):
    """PostgreSQL stores no NUL in a text: the run is kept, the NUL written as U+FFFD (on
    SQLite too, so both stores hold the same)."""
    spec = (
        _fresh(request.getfixturevalue("postgres"), "nul")
        if backend == "postgresql"
        else "history.sqlite"
    )
    fleet = Fleet(spec, tmp_path)
    facts = node(T0, product_serial=SERIAL)
    facts["gpus"][1]["serial"] = "PB\x00123"
    fleet.night({"n3": facts}, T0)
    store = fleet.store()
    serials = {row.serial for row in store.read(sa.select(store_module.GPUS.c.serial))}
    assert "PB\ufffd123" in serials
    store.close()
