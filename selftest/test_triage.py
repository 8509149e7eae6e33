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
