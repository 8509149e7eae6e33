"""`gpuhealth triage` as users call it: real samples in, findings and exit codes out."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data" / "nvidia-smi"


def triage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuhealth.cli", "triage", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def findings(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout)


def test_h100_hw_slowdown_sample_fails_throttle_on_all_gpus_and_driver_gate():
    proc = triage(str(DATA / "gpud_h100x8_535.161.08_query.txt"), "--json")
    assert proc.returncode == 1, proc.stderr
    doc = findings(proc)
    assert doc["verdict"] == "FAIL"
    throttle = [f for f in doc["findings"] if f["check"] == "throttle"]
    assert [f["gpu"] for f in throttle] == list(range(8))
    assert {f["status"] for f in throttle} == {"FAIL"}
    driver = next(f for f in doc["findings"] if f["check"] == "driver_version")
    assert driver["status"] == "FAIL" and "535.161.08" in driver["message"]
    assert set(doc["findings"][0]) >= {"check", "status", "host", "gpu", "message"}


def test_no_data_in_evidence_is_reported_not_evaluated_never_passed():
    doc = findings(triage(str(DATA / "gpud_h100x8_535.161.08_query.txt"), "--json"))
    nvlink = [f for f in doc["findings"] if f["check"] == "nvlink"]
    assert {f["status"] for f in nvlink} == {"SKIP"}
    assert all("not evaluated" in f["message"] for f in nvlink)


def test_rtx3060_on_570_passes_with_the_default_profile():
    proc = triage(str(DATA / "telegraf_rtx3060_570.124.04_v12.xml"), "--json")
    assert proc.returncode == 0
    doc = findings(proc)
    assert doc["verdict"] == "PASS"
    recovery = next(f for f in doc["findings"] if f["check"] == "recovery_action")
    assert recovery["status"] == "PASS"


def test_profile_and_expected_gpus_options_change_the_judgement():
    sample = str(DATA / "telegraf_rtx3060_570.124.04_v12.xml")
    doc = findings(triage(sample, "--json", "--expected-gpus", "8"))
    count = next(f for f in doc["findings"] if f["check"] == "gpu_count")
    assert count["status"] == "FAIL" and "expected 8 GPUs, found 1" in count["message"]
    doc = findings(triage(sample, "--json", "--profile", "l40s"))
    ecc = next(f for f in doc["findings"] if f["check"] == "ecc_errors")
    assert ecc["status"] == "FAIL"


def test_human_output_lists_problems_and_the_verdict():
    proc = triage(str(DATA / "telegraf_tesla-t4_515.105.01_v11.xml"))
    assert proc.returncode == 1
    assert "FAIL  driver_version" in proc.stdout
    assert "pid 5762 (python, 1005 MiB)" in proc.stdout
    assert proc.stdout.rstrip().endswith("verdict: FAIL")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("hello world\n", "not a kind of evidence gpuhealth reads"),
        ('<?xml version="1.0" ?>\n<nvidia_smi_log>\n<gpu id="x">\n', "line"),
        ("", "not a kind of evidence"),
    ],
)
def test_unreadable_evidence_exits_2_naming_the_file(tmp_path, content, message):
    path = tmp_path / "evidence.txt"
    path.write_text(content)
    proc = triage(str(path))
    assert proc.returncode == 2
    assert str(path) in proc.stderr and message in proc.stderr


def test_missing_file_and_bad_arguments_exit_2(tmp_path):
    proc = triage(str(tmp_path / "nope.xml"))
    assert proc.returncode == 2 and "nope.xml: cannot read" in proc.stderr
    proc = triage(str(DATA / "telegraf_tesla-t4_515.105.01_v11.xml"), "--profile", "nope")
    assert proc.returncode == 2 and "unknown profile 'nope'" in proc.stderr
    proc = triage()
    assert proc.returncode == 2


def test_xml_entity_bombs_are_refused(tmp_path):
    bomb = tmp_path / "bomb.xml"
    bomb.write_text(
        '<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaaaa">'
        '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><nvidia_smi_log>&b;</nvidia_smi_log>'
    )
    proc = triage(str(bomb))
    assert proc.returncode == 2


@pytest.mark.parametrize("args", [(), ("--profile", "default")], ids=["h100-profile", "no-count"])
def test_output_cut_after_two_of_eight_gpus_is_incomplete_never_a_pass_or_an_rma(tmp_path, args):
    text = (DATA / "gpud_h100x8_535.161.08_query.txt").read_text()
    third = text.index("\nGPU 00000000:", text.index("\nGPU 00000000:3B:00.0") + 1)
    cut = tmp_path / "cut.txt"
    cut.write_text(text[:third])
    proc = triage(str(cut), "--json", *args)
    assert proc.returncode == 1, proc.stderr
    (count,) = [f for f in findings(proc)["findings"] if f["check"] == "gpu_count"]
    assert (count["status"], count["action"]) == ("FAIL", "RERUN")
    assert (
        "the evidence is incomplete: it says 8 GPUs are attached but holds records of 2"
        in (count["message"])
    )


def test_the_terminal_lists_what_was_judged_and_counts_what_was_not():
    proc = triage(str(DATA / "gpud_h100_535.183.01_query_truncated.txt"))
    assert "not evaluated" not in "".join(proc.stdout.splitlines()[:-2])
    hidden = re.search(r"(\d+) not evaluated for want of evidence; -v lists them", proc.stdout)
    assert hidden and int(hidden.group(1)) > 100  # 8 GPUs' worth of absent sections
    verbose = triage(str(DATA / "gpud_h100_535.183.01_query_truncated.txt"), "-v")
    assert verbose.stdout.count("not evaluated:") == int(hidden.group(1))


# ---------------------------------------------------------------- tickets: several outputs

TICKETS = Path(__file__).parent / "data" / "tickets"
H100_TICKET = TICKETS / "ticket_h100_gsp-heartbeat_table_dmesg_ibstat_nccl.txt"
A100_TICKET = TICKETS / "ticket_a100_xid79_journal-excerpts_nvlink.txt"


def triage_stdin(text: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "gpuhealth.cli", "triage", *args],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_ticket_is_split_into_its_outputs_and_each_finding_names_its_part():
    proc = triage(str(H100_TICKET), "--json")
    assert proc.returncode == 1, proc.stderr
    doc = findings(proc)
    assert doc["verdict"] == "FAIL"
    by_check = {f["check"]: f for f in doc["findings"] if f["gpu"] is None}
    kernel = by_check["kernel_log"]
    assert kernel["status"] == "FAIL" and "GSP firmware heartbeat timed out" in kernel["message"]
    assert kernel["evidence"] == f"{H100_TICKET} part 2 (dmesg, lines 55-64)"
    assert (
        by_check["driver_version"]["evidence"] == f"{H100_TICKET} part 1 (nvidia-smi, lines 4-51)"
    )
    assert by_check["nccl_data_integrity"]["evidence"].endswith(
        "part 4 (nccl-tests output, lines 224-247)"
    )
    ports = [f for f in doc["findings"] if f["check"].startswith("ib_")]
    assert ports and all(f["evidence"].endswith("part 3 (ibstat, lines 68-220)") for f in ports)


def test_the_ticket_text_report_names_parts_and_the_lines_not_read():
    proc = triage(str(H100_TICKET))
    head = proc.stdout.splitlines()[0]
    assert (
        f"{H100_TICKET} part 1 (nvidia-smi, lines 4-51), part 2 (dmesg, lines 55-64), "
        "part 3 (ibstat, lines 68-220), part 4 (nccl-tests output, lines 224-247); "
        "lines 1-2, 53, 66, 222, 249 not read" in head
    )
    assert f"from: {H100_TICKET} part 2 (dmesg, lines 55-64)" in proc.stdout
    assert proc.stdout.rstrip().endswith("verdict: FAIL")


def test_prose_is_never_judged_and_log_excerpts_are_one_log():
    """The person's lines are left out (reading them changes nothing); two journal excerpts
    with an nvlink output between them are one kernel log, not two refused as duplicates."""
    proc = triage(str(A100_TICKET), "--json")
    assert proc.returncode == 1, proc.stderr
    doc = findings(proc)
    kernel = next(f for f in doc["findings"] if f["check"] == "kernel_log")
    assert kernel["status"] == "FAIL" and "Xid 79" in kernel["message"]
    assert "fallen_off_bus" in kernel["message"]  # from the second excerpt
    assert kernel["evidence"] == f"{A100_TICKET} part 1 (journalctl -k, lines 3-5, 113-115)"
    text = triage(str(A100_TICKET)).stdout.splitlines()[0]
    assert "part 2 (nvidia-smi nvlink -s / -e, lines 7-111); lines 1, 117 not read" in text


def test_stdin_is_read_as_a_file_named_stdin():
    proc = triage_stdin(H100_TICKET.read_text(), "-", "--json")
    assert proc.returncode == 1, proc.stderr
    doc = findings(proc)
    assert list(doc["nodes"]) == ["stdin"]
    kernel = next(f for f in doc["findings"] if f["check"] == "kernel_log")
    assert kernel["evidence"] == "stdin part 2 (dmesg, lines 55-64)"
    proc = triage_stdin((DATA / "table_h100x8_550.90.07_gpud.txt").read_text(), "--node", "n7", "-")
    assert proc.stdout.startswith("n7: stdin (nvidia-smi); driver 550.90.07")
    proc = triage_stdin("", "-", "-")
    assert proc.returncode == 2 and "can be read once" in proc.stderr


@pytest.mark.parametrize(
    ("content", "closest"),
    [
        ("Our node is broken.\n$ ibstat\nibstat: command not found\n", "runs ibstat, but no"),
        ("Cut:\n+" + "-" * 40 + "+\n| NVIDIA-SMI 550.9\n", "line 2 begins nvidia-smi output"),
        ("dmesg showed nothing useful, sorry\n", "it names dmesg"),
        ("hello\n", "no line of it begins an output of any kind"),
    ],
)
def test_a_ticket_no_kind_reads_is_refused_naming_the_closest_kind(tmp_path, content, closest):
    path = tmp_path / "ticket.txt"
    path.write_text(content)
    proc = triage(str(path))
    assert proc.returncode == 2
    assert f"{path}: not a kind of evidence gpuhealth reads (closest: " in proc.stderr
    assert closest in proc.stderr


def test_two_outputs_of_one_kind_in_a_ticket_are_refused_like_two_files(tmp_path):
    table = (DATA / "table_h100x8_550.90.07_gpud.txt").read_text()
    dmesg = (DATA.parent / "dmesg" / "gpud_kmsgtest_gb200_xid149_154.log").read_text()
    path = tmp_path / "ticket.txt"
    path.write_text(f"$ nvidia-smi\n{table}\n{dmesg}\n$ nvidia-smi\n{table}")
    proc = triage(str(path))
    assert proc.returncode == 2
    assert "part 3 (nvidia-smi, lines" in proc.stderr and "already came from" in proc.stderr


def test_node_state_in_use_skips_idle_rules_and_is_reported():
    """The A40 table lists a job's processes: judged idle they fail idle_processes, power and
    temperature; judged in use only its faults (the ERR! GPU's ECC) fail."""
    sample = str(DATA / "table_a40x8_525.60.13_gpu4-err_open-gpu-kernel-modules-446.txt")
    idle, busy = (findings(triage(sample, "--json", "--node-state", s)) for s in ("idle", "in-use"))
    failed = [{f["check"] for f in d["findings"] if f["status"] == "FAIL"} for d in (idle, busy)]
    assert {"idle_processes", "power", "temperature", "ecc_errors"} <= failed[0]
    assert "ecc_errors" in failed[1] and not {"idle_processes", "power", "temperature"} & failed[1]
    assert [d["nodes"][n]["node_state"] for d in (idle, busy) for n in d["nodes"]] == [
        "idle",
        "in-use",
    ]
    text = triage(sample).stdout
    assert "node idle" in text.splitlines()[0] and "--node-state in-use" in text
    assert "node in-use" in triage(sample, "--node-state", "in-use").stdout.splitlines()[0]
