"""Fuzzing every parser and `gpuhealth triage` with mutated real samples (hypothesis).

Properties: a parser returns facts or raises ParseError, nothing else, within a bounded time
(a 120 KB line costs milliseconds, not the minutes a quadratic pattern would); triage exits 0,
1 or 2, never 3 (a traceback); and a mutation that only destroys the evidence of a fault never
turns the check that judges it into PASS.

`make test` runs GPUHEALTH_FUZZ_EXAMPLES (default 700) cases per target with a fixed seed, about
11,000 in all (the count is printed at the end of the run); `make fuzz` runs a longer
campaign with fresh random cases. A failure prints the minimal input hypothesis found: make it
a regular test next to the parser's others.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuhealth import cli, evidence, registry
from gpuhealth.checks import NodeView, judged
from gpuhealth.config import Expectations, Platform, ProfileSet, resolve_limits
from gpuhealth.documents import FactsError, facts_from_text
from gpuhealth.families.dcgm import parse_dcgm, parse_dcgm_table
from gpuhealth.families.fabric import parse_fi_info, parse_ibstat, parse_rdma
from gpuhealth.families.gpu import parse_nvlink, parse_smi_table, parse_smi_text, parse_smi_xml
from gpuhealth.families.gpu.scope import GPU
from gpuhealth.families.gpud import parse_gpud
from gpuhealth.families.history.schema import HISTORY_SECTION
from gpuhealth.families.imex import parse_imex_ctl
from gpuhealth.families.kernel import parse_kernel_log
from gpuhealth.families.nccl import parse_nccl_tests
from gpuhealth.families.storage import parse_mounts
from gpuhealth.families.system import parse_numactl, parse_proc
from gpuhealth.history.run import History, measured, run_record
from gpuhealth.integrations.prometheus import readings
from gpuhealth.parsing import ParseError
from gpuhealth.report import NodeVerdict
from gpuhealth.results import Status
from selftest.facts import healthy_h100
from selftest.facts import limits as facts_limits
from selftest.mutations import garbled, mutated, mutated_facts, mutated_json

DATA = Path(__file__).parent / "data"
EXAMPLES = int(os.environ.get("GPUHEALTH_FUZZ_EXAMPLES", "700"))
# Fixed cases in `make test` (the same run every time); `make fuzz` draws fresh ones.
FRESH = os.environ.get("GPUHEALTH_FUZZ_FRESH") == "1"
PER_CASE = timedelta(seconds=5)  # bounded time: a linear parser needs milliseconds
PROFILES = ProfileSet()


def texts(*patterns: str) -> list[str]:
    found = sorted(p for pattern in patterns for p in DATA.glob(pattern) if p.is_file())
    assert found, patterns
    return [p.read_text(errors="replace") for p in found]


def fuzz(
    strategy: st.SearchStrategy[str],
    prop: Callable[[str], None],
    examples: int,
    deadline: timedelta = PER_CASE,
) -> int:
    """Run `prop` on `examples` cases drawn from `strategy`; the number of cases run."""
    runs = 0

    @settings(
        max_examples=examples,
        deadline=deadline,
        database=None,
        derandomize=not FRESH,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(strategy)
    def case(text: str) -> None:
        nonlocal runs
        runs += 1
        prop(text)

    case()
    return runs


def parses_or_refuses(*parsers: Callable[[str], Any]) -> Callable[[str], None]:
    """The property: every parser gives facts or a ParseError for the text."""

    def prop(text: str) -> None:
        for parser in parsers:
            with contextlib.suppress(ParseError):
                parser(text)

    return prop


def _fi_info(text: str) -> Any:
    return parse_fi_info.summary(parse_fi_info.parse(text))


def _gpud(text: str) -> Any:
    doc = parse_gpud.load(text, "fuzz")
    kind = parse_gpud.kind(doc)
    if kind == "events":
        return parse_gpud.events(doc)
    return parse_gpud.states(doc)


def _rdma(text: str) -> Any:
    for parser in (parse_rdma.parse_enum, parse_rdma.parse_rate, parse_rdma.parse_counter):
        with contextlib.suppress(ParseError):
            parser(text)


IB = "efa/h100-ib-root/sys/class/infiniband/*/ports/1/"
TARGETS: dict[str, tuple[list[str], Callable[[str], None], bool]] = {
    "nvidia-smi -q": (
        texts("nvidia-smi/gpud_h100*.txt", "nvidia-smi/gpud_titanv*.txt"),
        parses_or_refuses(parse_smi_text.parse),
        False,
    ),
    "nvidia-smi -q -x": (texts("nvidia-smi/*.xml"), parses_or_refuses(parse_smi_xml.parse), False),
    "nvidia-smi nvlink": (
        texts("nvidia-smi/gpud_a100_nvlink_status.txt"),
        parses_or_refuses(parse_nvlink.parse_status),
        False,
    ),
    "nvidia-smi nvlink pasted": (
        texts("nvidia-smi/gpud_a100_nvlink_status.txt", "nvidia-smi/nvlink-*.txt"),
        parses_or_refuses(parse_nvlink.looks_like_pasted, parse_nvlink.parse_pasted),
        False,
    ),
    "nvidia-smi table": (
        texts("nvidia-smi/table_*.txt"),
        parses_or_refuses(parse_smi_table.parse),
        False,
    ),
    "nvidia-smi -q sections": (
        texts("nvidia-smi/q-fragment_*.txt"),
        parses_or_refuses(parse_smi_text.looks_like_fragment, parse_smi_text.parse_fragment),
        False,
    ),
    "kernel log": (
        texts("dmesg/*dmesg*.log", "dmesg/*kmsg*.log", "dmesg/*journal*.log"),
        parses_or_refuses(parse_kernel_log.detect, parse_kernel_log.parse),
        False,
    ),
    "fabric manager log": (
        texts("dmesg/*fabricmanager*.log"),
        parses_or_refuses(
            parse_kernel_log.detect_fabric_manager, parse_kernel_log.parse_fabric_manager
        ),
        False,
    ),
    "fi_info": (texts("efa/*.txt"), parses_or_refuses(_fi_info), False),
    "rdma sysfs": (texts(IB + "state", IB + "rate", IB + "phys_state"), _rdma, False),
    "ibstat, ibv_devinfo": (
        texts("efa/*ibstat*.txt", "efa/*ibv_devinfo*.txt"),
        parses_or_refuses(
            parse_ibstat.looks_like_ibstat, parse_ibstat.looks_like_ibv_devinfo, parse_ibstat.parse
        ),
        False,
    ),
    "numactl": (texts("system/numactl/*"), parses_or_refuses(parse_numactl.parse_hardware), False),
    "/proc": (
        texts("system/*/proc/meminfo", "system/*/proc/modules"),
        parses_or_refuses(parse_proc.meminfo, parse_proc.modules, parse_proc.cpulist),
        False,
    ),
    "/proc/mounts": (texts("system/*/proc/mounts"), parses_or_refuses(parse_mounts.parse), False),
    "nccl-tests": (
        texts("nccl-tests/*.txt", "nccl-tests/*.log"),
        parses_or_refuses(parse_nccl_tests.looks_like, parse_nccl_tests.parse),
        False,
    ),
    "dcgmi diag": (
        texts("dcgm/*diag*.json"),
        parses_or_refuses(parse_dcgm.parse_diag),
        True,
    ),
    "dcgmi health": (texts("dcgm/*health*.json"), parses_or_refuses(parse_dcgm.parse_health), True),
    "dcgmi diag table": (
        texts("dcgm/*diag*table*.txt"),
        parses_or_refuses(parse_dcgm_table.looks_like_diag, parse_dcgm_table.parse_diag),
        False,
    ),
    "dcgmi health table": (
        texts("dcgm/*health_c_table*.txt"),
        parses_or_refuses(parse_dcgm_table.looks_like_health, parse_dcgm_table.parse_health),
        False,
    ),
    "gpud": (texts("gpud/*.json"), parses_or_refuses(_gpud), True),
    "nvidia-imex-ctl -N": (texts("imex/*.txt"), parses_or_refuses(parse_imex_ctl.parse), False),
}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_parsers_give_facts_or_a_parse_error(target, record_property):
    seeds, prop, is_json = TARGETS[target]
    strategy = st.sampled_from(seeds).flatmap(mutated)
    if is_json:  # line damage and wrong shapes both
        strategy = st.one_of(strategy, st.sampled_from(seeds).flatmap(mutated_json))
    record_property("fuzz_cases", fuzz(strategy, prop, EXAMPLES))


# ---------------------------------------------------------------- gpuhealth triage


def triage(text: str, *args: str) -> tuple[int, str, str]:
    """`gpuhealth triage --json FILE ARGS` in this process: (exit status, stdout, stderr)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "evidence.txt"
        path.write_text(text, errors="surrogateescape")
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(["triage", str(path), "--json", *args])
        return rc, out.getvalue(), err.getvalue()


def never_a_traceback(text: str) -> None:
    rc, _, err = triage(text)
    assert rc in (0, 1, 2), err
    if rc == 2:
        assert "evidence.txt" in err  # the message names the file


def test_triage_never_exits_with_a_traceback(record_property):
    seeds = [
        text
        for target, (found, _, _) in TARGETS.items()
        if target != "rdma sysfs"
        for text in found
    ]
    strategy = st.sampled_from(seeds).flatmap(mutated)
    record_property("fuzz_cases", fuzz(strategy, never_a_traceback, EXAMPLES // 2))


# Sentences people write between the outputs they paste into a ticket.
PROSE = (
    "Hi, node 17 dropped out of the job last night. nvidia-smi says:",
    "and dmesg:",
    "$ ibstat",
    "```",
    "Thanks!",
    "",
)


@st.composite
def tickets(draw: st.DrawFn, seeds: list[str]) -> str:
    """Two to four real outputs one after another, a person's line between them, mutated."""
    chosen = draw(st.lists(st.sampled_from(seeds), min_size=2, max_size=4))
    text = "\n".join(f"{draw(st.sampled_from(PROSE))}\n{seed}" for seed in chosen)
    return draw(mutated(text)) if draw(st.booleans()) else text


def split_and_triage(text: str) -> None:
    found = evidence.split(text)
    assert all(part.spans and part.text for part in found.parts)
    never_a_traceback(text)


def test_tickets_of_several_outputs_split_and_triage_without_a_traceback(record_property):
    """Concatenated real samples, with and without mutations: the splitter never raises, its
    parts hold text, and triage exits 0, 1 or 2. A ticket runs every kind's detector over up
    to 8 MB (two of the mutations' 4 MB indentation staircases): 0.6 s per MB measured, so
    its deadline is 15 s, not 5; a quadratic splitter took 13 s on 2,000 such lines."""
    seeds = [
        text
        for target, (found, _, _) in TARGETS.items()
        if target not in ("rdma sysfs", "/proc", "/proc/mounts", "numactl")
        for text in found
        if len(text) < 200_000
    ]
    cases = fuzz(tickets(seeds), split_and_triage, EXAMPLES // 2, 3 * PER_CASE)
    record_property("fuzz_cases", cases)


# ---------------------------------------------------------------- never a false pass


def _h100_clean() -> str:
    """The H100 sample with its HW slowdowns cleared (its driver, 535, fails driver_version
    with --profile h100-sxm: the exit status alone does not say the fault was seen, so the
    fault's own check is held to "not PASS" too)."""
    text = (DATA / "nvidia-smi/gpud_h100x8_535.161.08_query.txt").read_text()
    for label in ("HW Slowdown                       ", "HW Power Brake Slowdown       "):
        text = text.replace(f"{label}: Active", f"{label}: Not Active")
    return text


def _on_gpu2(text: str, old: str, new: str) -> str:
    """`old` -> `new` inside the block of gpu2 (bus 4C, minor number 2) only."""
    start = text.index("\nGPU 00000000:4C:00.0")
    end = text.index("\nGPU 00000000:", start + 1)
    block = text[start:end]
    assert old in block
    return text[:start] + block.replace(old, new, 1) + text[end:]


def _table_with_uncorrected_ecc() -> str:
    """The healthy H100 table with 2 volatile uncorrected ECC errors on gpu2."""
    text = (DATA / "nvidia-smi/table_h100x8_550.90.07_gpud.txt").read_text()
    row = "|   2  NVIDIA H100 80GB HBM3          On  |   00000000:4C:00.0 Off |"
    assert row + "                    0 |" in text
    return text.replace(row + "                    0 |", row + "                    2 |")


def _imex_node_down() -> str:
    """The 18-node IMEX domain with node #5 down, as IMEX shows a peer whose daemon is gone:
    UNAVAILABLE, and I for every connection to and from it."""
    text = (DATA / "imex/imex-ctl-N-p6e-gb200-18node-awsparallelcluster.txt").read_text()
    text = text.replace("172.31.50.44    - READY      ", "172.31.50.44    - UNAVAILABLE")
    lines = text.splitlines(keepends=True)
    top = next(i for i, line in enumerate(lines) if "Nodes From\\To" in line) + 1
    for row in range(18):
        cells = lines[top + row].split()
        cells[1 + 5] = "I"
        if row == 5:
            cells[1:] = ["I"] * 18
        lines[top + row] = f"{cells[0]:>8}        " + "   ".join(cells[1:]) + "\n"
    return "".join(lines)


def _faults() -> dict[str, tuple[str, tuple[str, ...], str, str | None]]:
    """name -> (evidence with one fault, triage arguments, the check that fails on it, and
    for a kernel log the text of the fault's line, which mutations may spoil but not delete:
    a kernel log has no end marker, so without its fault line it is a clean log)."""
    clean = _h100_clean()
    one_node = (DATA / "nccl-tests/nccltests_issue290_1node_8xH100_nvls_all_reduce.txt").read_text()
    # A corrupt row and the footer that says so, as nccl-tests prints them together.
    corrupt_row = one_node.replace("382.99      0", "382.99      5", 1).replace(
        "Out of bounds values : 0 OK", "Out of bounds values : 5 FAILED"
    )
    return {
        "hw-slowdown-gpu2": (
            _on_gpu2(
                clean,
                "HW Slowdown                       : Not Active",
                "HW Slowdown                       : Active",
            ),
            ("--profile", "h100-sxm"),
            "throttle",
            None,
        ),
        "uncorrected-ecc-gpu2": (
            _on_gpu2(
                clean, "DRAM Uncorrectable            : 0", "DRAM Uncorrectable            : 2"
            ),
            ("--profile", "h100-sxm"),
            "ecc_errors",
            None,
        ),
        "xid48": (
            (DATA / "dmesg/gpud_dmesg_xid48_63_94_peermem.log").read_text(),
            (),
            "kernel_log",
            # With the comma: a code cut right after "48" and run into other text ("482") is
            # another, unknown XID (a WARN), not the fault's line destroyed.
            "NVRM: Xid (PCI:0000:19:00): 48,",
        ),
        # GPU faults without an Xid line (kernel_faults): the fault's words are its evidence.
        "gpu-off-bus-no-xid": (
            (DATA / "dmesg/nvsentinel155_dmesg_fallen_off_bus_no_xid.log").read_text(),
            (),
            "kernel_log",
            "fallen off the bus",
        ),
        "gsp-heartbeat-no-xid": (
            (DATA / "dmesg/ogkm1230_dmesg_gsp_heartbeat_memsys_timeout.log").read_text(),
            (),
            "kernel_log",
            "Heartbeat timed out",
        ),
        "talos-rminitadapter": (
            (DATA / "dmesg/talos6206_dmesg_rminitadapter_failed.log").read_text(),
            (),
            "kernel_log",
            "RmInitAdapter failed",
        ),
        "nccl-wrong": (corrupt_row, ("--nodes", "1"), "nccl_data_integrity", None),
        "nccl-out-of-bounds": (
            (DATA / "nccl-tests/nccltests_issue37_8xV100_all_gather_legacy.txt").read_text(),
            ("--nodes", "1"),
            "nccl_data_integrity",
            None,
        ),
        "imex-node-not-ready": (_imex_node_down(), (), "imex_domain", None),
        "nccl-aborted": (
            (
                DATA / "nccl-tests/nccltests_issue264_8xH100_aborted_system_not_yet_initialized.txt"
            ).read_text(),
            ("--nodes", "1"),
            "nccl_data_integrity",
            None,
        ),
        "dcgm-diag-table-fail": (
            (DATA / "dcgm/nccltests_issue264_dcgmi_diag_r3_table_gpu_memory_fail.txt").read_text(),
            (),
            "dcgm_diag",
            None,
        ),
        "table-uncorrected-ecc-gpu2": (
            _table_with_uncorrected_ecc(),
            ("--profile", "h100-sxm"),
            "ecc_errors",
            None,
        ),
        "q-sections-hw-slowdown": (
            (DATA / "nvidia-smi/q-fragment_v100_throttle-reasons-and-clocks_l4rz.txt").read_text(),
            (),
            "throttle",
            None,
        ),
        "nvlink-links-inactive": (
            (DATA / "nvidia-smi/nvlink-s_v100_links-inactive_azhpc-diagnostics-73.txt").read_text(),
            ("--profile", "default"),
            "nvlink",
            None,
        ),
        # Tickets: several outputs and a person's lines; the faulty part's fault line is kept.
        "ticket-gsp-heartbeat": (
            (DATA / "tickets/ticket_h100_gsp-heartbeat_table_dmesg_ibstat_nccl.txt").read_text(),
            (),
            "kernel_log",
            "Heartbeat timed out",
        ),
        "ticket-xid79-excerpts": (
            (DATA / "tickets/ticket_a100_xid79_journal-excerpts_nvlink.txt").read_text(),
            (),
            "kernel_log",
            "NVRM: Xid (PCI:0000:01:00): 79,",
        ),
        "gpud-unhealthy": (
            (DATA / "gpud/gpud_docs_v1_states_xid74_unhealthy_element.json").read_text(),
            (),
            "gpud_health",
            None,
        ),
    }


FAULTS = _faults()


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_destroying_the_evidence_of_a_fault_never_gives_pass(fault, record_property):
    text, args, check, protect = FAULTS[fault]
    rc, out, err = triage(text, *args)
    statuses = {f["status"] for f in json.loads(out)["findings"] if f["check"] == check}
    assert rc == 1 and "FAIL" in statuses, (out, err)  # the seed itself fails

    def never_pass(mutant: str) -> None:
        rc, out, err = triage(mutant, *args)
        assert rc in (1, 2), (rc, out, err)  # never a traceback, never an overall pass
        if rc == 1:
            found = [f for f in json.loads(out)["findings"] if f["check"] == check]
            assert not found or {f["status"] for f in found} != {"PASS"}, found

    record_property("fuzz_cases", fuzz(garbled(text, protect), never_pass, EXAMPLES // 4))


# ---------------------------------------------------------------- saved facts documents


def _with_evidence(facts: dict[str, Any], *files: str) -> dict[str, Any]:
    """`facts` with the sections real saved outputs give (GPUd, DCGM, InfiniBand, IMEX,
    nccl-tests, kernel and fabric manager logs) added, as a probe that read them would."""
    for name in files:
        found = evidence.facts_from_file(DATA / name)[1]
        facts.update((key, value) for key, value in found.items() if key not in _TOP)
    return facts


# The document's own top-level keys, which the evidence's must not replace.
_TOP = {*healthy_h100()} - {"kernel_log", "fabric_manager", "fabric", "gpud", "imex"}


def _facts_seeds() -> dict[str, dict[str, Any]]:
    """Real facts documents: the healthy H100 node as the live probe returns it, the same
    node with every other family's section from real saved outputs, and a B200 from its
    `nvidia-smi -q -x` (NVLink fabric fields)."""

    def _live(facts: dict[str, Any]) -> dict[str, Any]:
        facts["source"] = "nvml"
        facts["driver"]["loaded"] = True
        return facts

    rich = _with_evidence(
        healthy_h100(),
        "gpud/gpud_docs_v1_states_xid74_unhealthy_element.json",
        "dcgm/vc_dcgmi_diag_r2.json",
        "efa/gpud_ibstat_47.0_h100_all_active.txt",
        "imex/imex-ctl-N-p6e-gb200-18node-awsparallelcluster.txt",
        "nccl-tests/awsome_2x_p5.48xlarge_efa_all_reduce_srun.txt",
        "dmesg/gpud_dmesg_xid48_63_94_peermem.log",
        "dmesg/gpud_fabricmanager_nvswitch_nonfatal.log",
    )
    return {
        "healthy-h100": healthy_h100(),
        "h100-every-section": rich,
        "gb200-xml": _live(
            evidence.facts_from_file(DATA / "nvfabric/nvsmi-qx-gb200-k8stestinfra.xml")[1]
        ),
    }


def _past(host: str, facts: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The `history` section the suite gives `host`: five nights of `facts`, measured and
    written through the real store, read back as the plugin reads them."""
    lim = facts_limits("h100-sxm")
    for night in range(5):
        history = History(str(folder / "history.sqlite"), folder, started_at=T0 + night * 86400)
        found = measured(NodeView(host, facts, lim))
        store = history.store()
        assert store is not None
        store.write_run(
            run_record(
                history,
                complete=True,
                exit_status=0,
                level="quick",
                source="facts",
                command="pytest",
                inventory=None,
                verdicts=[NodeVerdict(host, "PASS")],
                outcomes=[],
                measured_by_host={host: found},
            )
        )
        history.close()
    history = History(str(folder / "history.sqlite"), folder, started_at=T0 + 5 * 86400)
    section = history.section(host, lim)
    history.close()
    return section


T0 = 1_790_000_000.0


def judge_saved(text: str, host: str, past: dict[str, Any]) -> dict[str, Any]:
    """A saved facts document judged the way `pytest --facts` judges it: loaded and
    validated, its limits resolved (profile h100-sxm, as an inventory names it), every check
    on every GPU slot, then what the run store and the Prometheus textfile keep of it.
    {"error": message} for a refused document, else {"findings", "measured", "readings"}."""
    try:
        facts = facts_from_text(text, f"facts of {host}")
    except FactsError as exc:
        return {"error": str(exc)}
    lim = resolve_limits(Expectations("h100-sxm", None, {}), PROFILES, Platform.of(facts))
    view = NodeView(host, {**facts, HISTORY_SECTION: past}, lim)
    found = judged(list(registry.checks().values()), view, GPU.slots(view))
    return {"findings": found, "measured": measured(view), "readings": readings(view)}


def _storable(value: Any) -> bool:
    """What every sink stores: a finite float, a bounded string, or null."""
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, str) and len(value) <= 4096


def judged_or_refused(host: str, past: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """The property: a mutated document is one clear error naming its host and the field, or
    every check gives a verdict, and what the sinks keep of it is storable."""

    def prop(doc: dict[str, Any]) -> None:
        got = judge_saved(json.dumps(doc), host, past)
        if "error" in got:
            assert got["error"].startswith(f"facts of {host}: "), got["error"]
            assert len(got["error"]) < 400, got["error"]
            return
        assert {f.status for f in got["findings"]} <= set(Status)
        kept = got["measured"]
        assert all(_storable(row["value"]) for row in kept["rows"] + got["readings"]), kept
        identity = kept["identity"]
        assert all(_storable(identity[key]) for key in ("driver", "profile")), identity
        assert all(
            _storable(value)
            for gpu in identity["gpus"]
            for value in gpu.values()
            if not isinstance(value, int) or isinstance(value, bool)
        ), identity
        json.dumps(kept, allow_nan=False)

    return prop


FACTS_SEEDS = _facts_seeds()


@pytest.mark.parametrize("seed", sorted(FACTS_SEEDS))
def test_mutated_facts_documents_give_a_verdict_or_a_clear_error(seed, tmp_path, record_property):
    """Saved facts damaged in value and structure (wrong types, 2**64, NaN, deleted keys, deep
    nesting): judged through the real path of `pytest --facts`, never an exception."""
    doc = FACTS_SEEDS[seed]
    prop = judged_or_refused("n17", _past("n17", doc, tmp_path))
    record_property("fuzz_cases", fuzz(mutated_facts(doc), prop, EXAMPLES // 2))


def _facts_faults() -> dict[str, tuple[dict[str, Any], tuple[Any, ...], str, int | None]]:
    """name -> (a saved document with one fault, the path of the fault's evidence, the check
    that fails on it, the GPU slot it judges)."""
    ecc = healthy_h100()
    ecc["gpus"][2]["ecc"]["volatile"]["uncorrected"] = 2
    lost = healthy_h100()
    lost["gpus"][5]["lost"] = {"call": "nvmlDeviceGetTemperature", "error": "GPU is lost"}
    pending = healthy_h100()
    pending["gpus"][3]["remapped_rows"]["pending"] = True
    old_driver = healthy_h100()
    old_driver["driver"]["version"] = "470.57.02"
    return {
        "ecc-uncorrected-gpu2": (
            ecc,
            ("gpus", 2, "ecc", "volatile", "uncorrected"),
            "ecc_errors",
            2,
        ),
        "gpu5-lost": (lost, ("gpus", 5, "lost"), "gpu_lost", 5),
        "row-remap-pending-gpu3": (
            pending,
            ("gpus", 3, "remapped_rows", "pending"),
            "row_remapping",
            3,
        ),
        "driver-too-old": (old_driver, ("driver", "version"), "driver_version", None),
    }


FACTS_FAULTS = _facts_faults()


@pytest.mark.parametrize("fault", sorted(FACTS_FAULTS))
def test_mutating_other_fields_of_a_faulty_document_never_gives_pass(
    fault, tmp_path, record_property
):
    """The fault's own field left alone, anything else damaged: still FAIL, or the document
    refused; never PASS (a refused document fails its node with RERUN)."""
    doc, evidence_at, check, index = FACTS_FAULTS[fault]
    past = _past("n17", doc, tmp_path)

    def status(found: dict[str, Any]) -> Status | None:
        if "error" in found:
            return None
        return next(f.status for f in found["findings"] if f.check == check and f.gpu == index)

    assert status(judge_saved(json.dumps(doc), "n17", past)) is Status.FAIL

    def never_pass(mutant: dict[str, Any]) -> None:
        assert status(judge_saved(json.dumps(mutant), "n17", past)) is not Status.PASS

    strategy = mutated_facts(doc, evidence_at)
    record_property("fuzz_cases", fuzz(strategy, never_pass, EXAMPLES // 4))
