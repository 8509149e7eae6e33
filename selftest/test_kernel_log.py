"""Kernel-log family: the parser on the real logs, the checks, the probe against stand-in
journalctl/dmesg, triage of the saved logs, and the suite on facts that carry them."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.families.kernel import evidence
from gpuhealth.families.kernel import parse_kernel_log as parser
from gpuhealth.parsing import ParseError
from gpuhealth.transport import parse_output, probe_call
from selftest.facts import healthy_h100, judge, probe, probe_config
from selftest.suite import fake_tool, run_suite, shell_probe

DATA = Path(__file__).parent / "data" / "dmesg"
XID48 = DATA / "gpud_dmesg_xid48_63_94_peermem.log"
XID13 = DATA / "gpud_dmesg_decode_iso_xid13_43.log"
PEERMEM = DATA / "gpud_dmesg_peermem_errors.log"
FABRIC = DATA / "gpud_fabricmanager_nvswitch_nonfatal.log"
KMSG = DATA / "gpud_kmsg_nvswitch_open.log"
GPU0_BUS = "00000000:19:00.0"  # gpu0 of the H100 sample, where the XID 48/63/94 log points


def live(section: dict[str, Any]) -> dict[str, Any]:
    """A saved-log section as the probe would have returned it right after its newest entry."""
    until = section["until"] or parser.stamp(time.time())
    return {**section, "anchored_at": "collection", "until": until, "window_h": 24}


def facts_with(log: Path | None = None, fabric: Path | None = None) -> dict[str, Any]:
    """The healthy H100 facts plus kernel_log/fabric_manager sections from saved logs."""
    facts = healthy_h100()
    text = log.read_text() if log else "\n"
    facts["kernel_log"] = live(evidence.kernel_log_evidence(text)["kernel_log"])
    fm = evidence.fabric_manager_evidence(fabric.read_text()) if fabric else None
    facts["fabric_manager"] = live(fm["fabric_manager"]) if fm else {"log": "x", "present": False}
    return facts


# ---------------------------------------------------------------- parser


@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        (XID48, "dmesg --time-format=iso"),
        (XID13, "dmesg --decode --time-format=iso"),
        (PEERMEM, "dmesg --decode --time-format=iso"),
        (KMSG, "/dev/kmsg"),
    ],
)
def test_formats_are_recognised_by_content(path, fmt):
    text = path.read_text()
    assert parser.detect(text) == fmt
    assert parser.parse(text)["format"] == fmt
    assert not parser.detect_fabric_manager(text)


def test_xid48_63_94_log():
    parsed = parser.parse(XID48.read_text())
    assert parsed["newest"] == "2024-11-15T12:02:15.950445Z"
    xids = [e for e in parsed["events"] if e["kind"] == "xid"]
    assert [e["code"] for e in xids] == [48, 63] + [94] * 9
    assert {e["bus_id"] for e in xids} == {GPU0_BUS}
    dbe = xids[0]
    assert dbe["time"] == "2024-11-15T12:02:03.470068Z"
    assert (dbe["pid"], dbe["process"]) == (None, None)  # pid='<unknown>', name=<unknown>
    assert dbe["text"].startswith("An uncorrectable double bit error (DBE)")
    assert (xids[3]["pid"], xids[3]["process"], xids[3]["text"]) == (
        1248209,
        "python3.10",
        "Ch 00000008",
    )
    assert sum(e["kind"] == "peermem" for e in parsed["events"]) == 30


def test_xid13_43_counts_are_exact_while_the_sample_is_capped():
    summary = parser.summarise(parser.parse(XID13.read_text())["events"])
    counts = {(g["code"], g["bus_id"]): g["count"] for g in summary["counts"]}
    assert counts == {(13, "00000000:38:00.0"): 629, (43, "00000000:38:00.0"): 7}
    assert len(summary["events"]) == 10 + 7 and summary["dropped"] == 619
    xid43 = next(g for g in summary["counts"] if g["code"] == 43)
    assert xid43["processes"][0] == "pt_main_thread[2815167]"
    assert (xid43["first"], xid43["last"]) == (
        "2025-01-21T02:21:33.502278Z",
        "2025-01-21T04:41:44.287197Z",
    )


def test_peermem_errors_counted_and_other_lines_ignored():
    parsed = parser.parse(PEERMEM.read_text())
    assert [e["kind"] for e in parsed["events"]] == ["peermem"] * 7
    assert parsed["newest"] == "2025-02-10T16:28:07.570939Z"  # the final "test" line


def test_kmsg_records_are_benign():
    parsed = parser.parse(KMSG.read_text())
    assert parsed["events"] == []
    assert (parsed["newest"], parsed["newest_uptime_s"]) == (None, 57631.398464)


def test_fabric_manager_log():
    text = FABRIC.read_text()
    assert parser.detect_fabric_manager(text) and parser.detect(text) is None
    parsed = parser.parse_fabric_manager(text)
    assert parsed["newest"] == "2025-02-27T15:10:02"  # local time, no zone in FM logs
    assert parsed["events"] == [
        {
            "kind": "fabric_manager",
            "time": "2025-02-27T15:10:02",
            "uptime_s": None,
            "code": 12028,
            "bus_id": "00000000:86:00.0",
            "fatal": False,
            "text": "detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id "
            "00000000:86:00.0 physical id 3 port 61",
        }
    ]


XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python3, GPU has fallen off the bus."


@pytest.mark.parametrize(
    ("line", "fmt", "when", "uptime"),
    [
        (f"[ 1234.567890] {XID79}", "dmesg", None, 1234.56789),
        (f"[Wed Jul 31 11:22:39 2024] {XID79}", "dmesg -T", "2024-07-31T11:22:39", None),
        (
            f"2024-07-31T11:22:39,123456+02:00 {XID79}",
            "dmesg --time-format=iso",
            "2024-07-31T09:22:39.123456Z",
            None,
        ),
        (
            f"kern  :warn  : [ 1234.567890] {XID79}",
            "dmesg",
            None,
            1234.56789,
        ),
        (f"6,3964,206764307,-;{XID79}", "/dev/kmsg", None, 206.764307),
        (
            f"Jul 31 11:22:39 node17 kernel: {XID79}",
            "journalctl -k",
            "2024-07-31T11:22:39",
            None,
        ),
        (
            f"Jul 31 11:22:39 node17 kernel: [ 966.503025] {XID79}",
            "journalctl -k",
            "2024-07-31T11:22:39",
            966.503025,
        ),
        (
            f"2024-07-31T11:22:39+0000 node17 kernel: {XID79}",
            "journalctl -k -o short-iso",
            "2024-07-31T11:22:39Z",
            None,
        ),
        (
            f"2024-07-31T11:22:39.500000-0500 node17 kernel: {XID79}",
            "journalctl -k -o short-iso",
            "2024-07-31T16:22:39.500000Z",
            None,
        ),
    ],
)
def test_every_kernel_log_format_gives_the_same_xid(line, fmt, when, uptime):
    now = parser.epoch("2024-08-15T00:00:00Z")  # places the year-less syslog line in 2024
    parsed = parser.parse(f"{line}\n", now=now)
    assert parsed["format"] == fmt
    assert parsed["events"] == [
        {
            "kind": "xid",
            "bus_id": "00000000:3B:00.0",
            "code": 79,
            "pid": 4242,
            "process": "python3",
            "text": "GPU has fallen off the bus.",
            "time": when,
            "uptime_s": uptime,
        }
    ]


def test_year_less_lines_from_last_december_read_in_january():
    now = parser.epoch("2025-01-02T00:00:00Z")
    parsed = parser.parse(f"Dec 31 23:59:59 n1 kernel: {XID79}\n", now=now)
    assert parsed["events"][0]["time"] == "2024-12-31T23:59:59"


def test_old_driver_xid_without_pci_prefix_or_pid():
    line = "Nov 22 18:29:55 n1 kernel: [ 966.503025] NVRM: Xid (0000:01:00): 31, Ch 0000000b\n"
    event = parser.parse(line)["events"][0]
    assert (event["bus_id"], event["code"], event["pid"], event["text"]) == (
        "00000000:01:00.0",
        31,
        None,
        "Ch 0000000b",
    )


def test_sxid_counts_once_with_its_severity():
    text = (
        "[ 10.0] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up\n"
        "[ 10.0] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Severity 5 Engine instance 30\n"
        "[ 10.0] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Data {0x50610002, 0x10100030}\n"
        "[ 11.0] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20009, Non-fatal, Link 28 RX Short\n"
    )
    events = parser.parse(text)["events"]
    assert [(e["code"], e["fatal"], e["bus_id"], e["device"]) for e in events] == [
        (20034, True, "00000000:05:00.0", "nvidia-nvswitch3"),
        (20009, False, "00000000:C3:00.0", "nvidia-nvswitch0"),
    ]


@pytest.mark.parametrize(
    ("raw", "nvml"),
    [
        ("0000:19:00", "00000000:19:00.0"),
        ("0000:3b:00.1", "00000000:3B:00.1"),
        ("00000000:DB:00.0", "00000000:DB:00.0"),
        ("3b:00", "00000000:3B:00.0"),
        ("19:00", "00000000:19:00.0"),
        # What is no bus id is kept as printed (found by fuzzing: these raised before).
        (".", "."),
        ("1:2:3:4", "1:2:3:4"),
    ],
)
def test_bus_ids_take_nvml_form(raw, nvml):
    assert parser.bus_id(raw) == nvml


def test_empty_and_gpu_free_logs_have_no_events():
    assert parser.parse("")["events"] == []
    assert parser.parse("[ 1.0] Linux version 6.1\n[ 2.0] usb 1-1: new device\n")["events"] == []


@pytest.mark.parametrize("text", ["hello world\n12 + 3 = 15\n", "{'json': 1}\n"])
def test_text_in_no_kernel_log_format_is_a_parse_error(text):
    with pytest.raises(ParseError, match="line 1: not a kernel log line"):
        parser.parse(text)
    assert parser.detect(text) is None


def test_an_xid_line_without_timestamp_is_dmesg_t_not_refused():
    """Once refused as no kernel log: `dmesg -t` prints exactly this line."""
    text = "hello world\nNVRM: Xid (PCI:0000:19:00): 48, no timestamp\n"
    assert [e["code"] for e in parser.parse(text)["events"]] == [48]
    assert parser.detect(text) == "dmesg -t"


@pytest.mark.parametrize("text", ["usb 1-1: new device\nverdict: PASS\n", "key: value\n"])
def test_timestamp_free_lines_without_the_nvidia_driver_are_no_kernel_log(text):
    """`subsystem: message` lines alone could be any text: never a clean kernel log."""
    with pytest.raises(ParseError, match="none is the NVIDIA driver's"):
        parser.parse(text)
    assert parser.detect(text) is None


def test_garbage_fabric_manager_log_is_a_parse_error():
    with pytest.raises(ParseError, match="line 1: not a fabric manager log line"):
        parser.parse_fabric_manager("no brackets here\n")


# ---------------------------------------------------------------- checks


def test_dbe_row_remap_and_contained_ecc_fail_the_gpu_at_19_00():
    facts = facts_with(XID48)
    result = judge("xid_errors", facts, 0)
    assert result.status == "FAIL"
    message = result.text
    assert message.startswith("node17 gpu0 (GPU-ee7954ec-da95-fd7a-ddfd-c6b32cc2f8aa")
    for part in (
        "Xid 48 (double-bit ECC error, DBE) x1 [2024-11-15T12:02:03.470068Z]",
        "Xid 63 (row remap / page retirement recorded, pending reset) x1",
        "Xid 94 (contained ECC error) x9 [2024-11-15T12:02:03.506595Z .. "
        "2024-11-15T12:02:03.638794Z], processes python3.10[1248209]",
        '"Row Remapper: New row (0x00000012bac1c3e0) marked for remapping',
    ):
        assert part in message
    assert "RMA the GPU if DBEs recur" in result.advice and "reset the GPU" in result.advice
    assert {judge("xid_errors", facts, i).status for i in range(1, 8)} == {"PASS"}
    node = judge("kernel_log", facts)  # the XIDs are gpu0's; the peermem errors are the node's
    assert node.status == "WARN"
    assert "nvidia-peermem errors x30" in node.text and "Xid" not in node.text


def test_application_xids_only_warn_with_exact_counts():
    facts = facts_with(XID13)
    facts["gpus"][2]["pci_bus_id"] = "00000000:38:00.0"
    result = judge("xid_errors", facts, 2)
    assert result.status == "WARN"
    assert "Xid 13 (graphics engine exception) x629" in result.text
    assert "Xid 43 (GPU stopped processing, channel reset) x7" in result.text
    assert "check the user application" in result.advice
    assert judge("kernel_log", facts).status == "PASS"


def test_xids_older_than_the_window_do_not_fail():
    facts = facts_with(XID48)
    facts["kernel_log"]["until"] = "2024-11-16T12:02:04Z"  # read a day and a second later
    result = judge("xid_errors", facts, 0)
    assert result.status == "PASS"
    assert "since 2024-11-15T12:02:04Z (24 h window" in result.text
    assert judge("xid_errors", facts, 0, xid_window_h=48).status == "FAIL"
    assert judge("xid_errors", facts, 0, xid_window_h=0).status == "FAIL"  # since boot


def test_window_cuts_a_group_at_its_start():
    facts = facts_with(XID48)
    facts["kernel_log"]["until"] = "2024-11-15T12:30:00Z"
    result = judge("kernel_log", facts, xid_window_h=1)
    assert "nvidia-peermem errors x20 [2024-11-15T12:02:15.737526Z .." in result.text


def test_xid_on_a_bus_no_gpu_has_fails_the_node():
    facts = facts_with()
    now = parser.stamp(time.time())
    section = parser.summarise(
        parser.parse(f"[ 5.0] {XID79.replace('3b:00', 'aa:00')}\n")["events"]
    )
    section["events"][0]["time"] = section["counts"][0]["first"] = now
    section["counts"][0]["last"] = now
    facts["kernel_log"] = {**facts["kernel_log"], **section, "until": now}
    result = judge("kernel_log", facts)
    assert result.status == "FAIL"
    assert "Xid 79 (GPU has fallen off the bus) on 00000000:AA:00.0, which is none of" in (
        result.text
    )
    assert "reseat the GPU" in result.advice


def test_unknown_xid_warns():
    facts = facts_with(XID48)
    for group in facts["kernel_log"]["counts"]:
        group["code"] = 999 if group["kind"] == "xid" else None
    result = judge("xid_errors", facts, 0)
    assert result.status == "WARN" and "Xid 999 (not in gpuhealth's XID table)" in result.text


def test_sxids_fatal_fail_and_non_fatal_warn():
    facts = facts_with()
    text = (
        "[ 10.0] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up\n"
        "[ 11.0] nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 20009, Non-fatal, Link 28 RX Short\n"
    )
    section = evidence.kernel_log_evidence(text)["kernel_log"]
    facts["kernel_log"] = section
    facts["source"] = "evidence-file"
    result = judge("kernel_log", facts)
    assert result.status == "FAIL"
    assert "NVSwitch SXid 20034 (fatal) on 00000000:05:00.0" in result.text
    assert "NVSwitch SXid 20009 (non-fatal)" in result.text
    assert "before the log's last entry 11.0 s after boot" in result.text
    section["counts"] = [g for g in section["counts"] if not g["fatal"]]
    assert judge("kernel_log", facts).status == "WARN"


def test_fabric_manager_non_fatal_warns_fatal_fails_and_absent_skips():
    facts = facts_with(fabric=FABRIC)
    result = judge("fabric_manager", facts)
    assert result.status == "WARN"
    assert "fabric manager error 12028 on NVSwitch 00000000:86:00.0 x1" in result.text
    facts["fabric_manager"]["counts"][0]["fatal"] = True
    assert judge("fabric_manager", facts).status == "FAIL"
    absent = judge("fabric_manager", facts_with())
    assert absent.status == "SKIP" and "no fabric manager log at x" in absent.text


def test_unreadable_kernel_log_fails_with_how_to_fix():
    facts = facts_with()
    why = {"kind": "error", "detail": "dmesg: exit 1: read kernel buffer failed"}
    facts["kernel_log"].update(counts=None, events=None, unavailable={"counts": why})
    for result in (judge("kernel_log", facts), judge("xid_errors", facts, 3)):
        assert result.status == "FAIL"
        assert "could not read the kernel log (dmesg: exit 1" in result.text
        assert "run the probe as root, or allow dmesg" in result.advice


def test_no_nvidia_node_skips():
    facts = facts_with()
    facts.update(gpus=[], driver={"loaded": False}, pci={"nvidia_gpus": []})
    for name in ("kernel_log", "fabric_manager"):
        result = judge(name, facts, profile=None)
        assert result.status == "SKIP" and "no NVIDIA GPU/driver on node17" in result.text


def test_healthy_sections_pass():
    facts = facts_with(KMSG)
    assert judge("kernel_log", facts).status == "PASS"
    assert {judge("xid_errors", facts, i).status for i in range(8)} == {"PASS"}


# ---------------------------------------------------------------- probe


@pytest.fixture
def bare_python(tmp_path: Path) -> str:
    """An interpreter with no site-packages: a node without gpuhealth or nvidia-ml-py."""
    wrapper = tmp_path / "bare-python3"
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


@pytest.fixture
def node_root(tmp_path: Path) -> Path:
    """A root prefix whose /proc/uptime puts the boot before the fixtures' dates."""
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    boot = parser.epoch("2024-11-01T00:00:00Z")
    (root / "proc/uptime").write_text(f"{time.time() - boot:.2f} 1000.00\n")
    return root


def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **bodies: str) -> Path:
    """Stand-in commands (name -> sh body) as the only ones on PATH, plus a log of their argv.

    With nothing else on PATH, the bodies name their own tools by absolute path."""
    folder = tmp_path / "bin"
    for name, body in bodies.items():
        fake_tool(folder, name, f'echo "{name} $*" >> {tmp_path}/argv.log\n{body}')
    monkeypatch.setenv("PATH", str(folder))
    return folder


def collect(root: Path, window_h: float = 0, **expect: Any) -> tuple[dict, list]:
    sections, errors = probe("kernel", root, xid_window_h=window_h, **expect)
    return sections["kernel_log"], errors


def test_probe_reads_journalctl_since_the_window(tmp_path, monkeypatch, node_root):
    tools(tmp_path, monkeypatch, journalctl=f"/bin/cat {XID48}\n")
    section, errors = collect(node_root)
    assert errors == [] and section["source"] == "journalctl -k -o short-iso"
    counts = {g["code"]: g["count"] for g in section["counts"] if g["kind"] == "xid"}
    assert counts == {48: 1, 63: 1, 94: 9}
    boot = parser.epoch("2024-11-01T00:00:00Z")
    assert abs(parser.epoch(section["since"]) - boot) < 60  # window 0: since boot
    argv = (tmp_path / "argv.log").read_text()
    assert "journalctl -k -b -o short-iso --no-pager --since @" in argv
    section, _ = collect(node_root, window_h=24)  # the same log a year later: nothing counts
    assert section["counts"] == [] and section["window_h"] == 24


def test_probe_falls_back_to_dmesg_when_the_journal_is_empty(tmp_path, monkeypatch, node_root):
    tools(
        tmp_path,
        monkeypatch,
        journalctl="echo 'No journal files were found.' >&2\necho '-- No entries --'\n",
        dmesg=f'[ "$1" = --time-format=iso ] && exec /bin/cat {XID13}\nexit 1\n',
    )
    section, _ = collect(node_root)
    assert section["source"] == "dmesg --time-format=iso"
    assert section["notes"] == [
        "journalctl -k -o short-iso: no journal files (journald keeps no log here)"
    ]
    assert sorted(g["count"] for g in section["counts"]) == [7, 629]
    assert section["dropped"] == 619 and len(section["events"]) == 17


def test_plain_dmesg_times_come_from_proc_uptime(tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc/uptime").write_text("2000.00 100.00\n")
    tools(
        tmp_path,
        monkeypatch,
        dmesg=f"[ \"$1\" = --time-format=iso ] && {{ echo 'dmesg: unrecognized option' >&2; "
        f"exit 1; }}\necho '[ 1234.500000] {XID79}'\necho '[ 1999.000000] eth0: link up'\n",
    )
    before = time.time()
    section, _ = collect(root, window_h=24)
    assert section["source"] == "dmesg"
    event = section["events"][0]
    assert event["uptime_s"] == 1234.5
    assert abs(parser.epoch(event["time"]) - (before - 2000 + 1234.5)) < 5


def test_kmsg_is_the_last_resort(tmp_path, monkeypatch, node_root):
    tools(tmp_path, monkeypatch)
    (node_root / "dev").mkdir()
    (node_root / "dev/kmsg").write_bytes(KMSG.read_bytes())
    section, errors = collect(node_root)
    assert (section["source"], section["counts"], errors) == ("/dev/kmsg", [], [])
    assert section["notes"][0] == "journalctl -k -o short-iso: journalctl: command not found"


def test_no_readable_kernel_log_is_recorded_and_fails_the_checks(tmp_path, monkeypatch, node_root):
    denied = "echo 'dmesg: read kernel buffer failed: Operation not permitted' >&2\nexit 1\n"
    tools(tmp_path, monkeypatch, dmesg=denied)
    section, errors = collect(node_root)
    assert section["counts"] is None and section["unavailable"]["counts"]["kind"] == "error"
    assert errors[0]["probe"] == "kernel_log"
    assert "Operation not permitted" in errors[0]["error"]
    facts = facts_with()
    facts["kernel_log"] = section
    result = judge("kernel_log", facts)
    assert result.status == "FAIL" and "Operation not permitted" in result.text


def test_hung_journalctl_is_killed_within_its_timeout(tmp_path, monkeypatch, node_root):
    tools(tmp_path, monkeypatch, journalctl="/bin/sleep 600\n", dmesg=f"/bin/cat {PEERMEM}\n")
    started = time.monotonic()
    section, _ = collect(node_root, kernel_log_timeout_s=1)
    assert time.monotonic() - started < 5
    assert section["source"] == "dmesg --time-format=iso"
    assert "timed out after 1 s" in section["notes"][0]
    assert section["counts"][0]["count"] == 7


def test_fabric_manager_log_under_the_root_prefix(tmp_path, monkeypatch, node_root):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    try:
        (node_root / "var/log").mkdir(parents=True)
        (node_root / "var/log/fabricmanager.log").write_bytes(FABRIC.read_bytes())
        sections, errors = probe("kernel", node_root, xid_window_h=0)
        section = sections["fabric_manager"]
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert section["present"] and errors == []
    assert [(g["code"], g["fatal"], g["first"]) for g in section["counts"]] == [
        (12028, False, "2025-02-27T15:10:02Z")
    ]
    absent = probe("kernel", tmp_path, xid_window_h=0)[0]["fabric_manager"]
    assert (absent["present"], absent["counts"]) == (False, [])


def test_shipped_probe_carries_the_sections(tmp_path, bare_python, node_root):
    fake_tool(tmp_path / "bin", "journalctl", f"cat {XID48}\n")
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    config = probe_config(node_root, xid_window_h=0)
    doc = parse_output(shell_probe(probe_call(config, python=bare_python), env).stdout)
    assert doc["kernel_log"]["source"] == "journalctl -k -o short-iso"
    assert {g["code"] for g in doc["kernel_log"]["counts"]} == {48, 63, 94, None}
    assert doc["fabric_manager"]["present"] is False
    assert doc["memory_reclaim"]["skipped"].startswith("NVML was not available")


# ---------------------------------------------------------------- triage and the suite


def triage(*args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpuhealth.cli", "triage", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, json.loads(proc.stdout)


def finding(doc: dict, check: str) -> dict:
    return next(f for f in doc["findings"] if f["check"] == check)


@pytest.mark.parametrize(
    ("path", "verdict", "check", "status", "words"),
    [
        (XID48, "FAIL", "kernel_log", "FAIL", "Xid 48 (double-bit ECC error, DBE) on 00000000"),
        (XID13, "WARN", "kernel_log", "WARN", "Xid 13 (graphics engine exception) on"),
        (PEERMEM, "WARN", "kernel_log", "WARN", "nvidia-peermem errors x7"),
        (FABRIC, "WARN", "fabric_manager", "WARN", "fabric manager error 12028"),
        (KMSG, "PASS", "kernel_log", "PASS", "no SXIDs, GPU faults, peermem errors or XIDs"),
    ],
)
def test_triage_of_each_saved_log(path, verdict, check, status, words):
    rc, doc = triage(str(path))
    assert rc == (1 if verdict == "FAIL" else 0)
    assert doc["verdict"] == verdict
    found = finding(doc, check)
    assert found["status"] == status and words in found["message"]
    assert "before the log's last entry" in found["message"]


def test_triage_of_a_node_with_its_kernel_and_fabric_manager_logs(tmp_path):
    rc, doc = triage("--node", "n1", str(XID13), str(FABRIC))
    assert rc == 0 and doc["verdict"] == "WARN"
    assert finding(doc, "kernel_log")["status"] == "WARN"
    assert finding(doc, "fabric_manager")["status"] == "WARN"


@pytest.mark.suite
def test_suite_on_facts_with_the_xid_log(tmp_path):
    facts = facts_with(XID48, FABRIC)
    folder = tmp_path / "facts"
    folder.mkdir()
    (folder / "n1.json").write_text(json.dumps(facts))
    run = run_suite(tmp_path / "r", "--facts", str(folder), "--profile", "h100-sxm")
    outcomes = run.outcomes()
    assert outcomes["test_xid_errors[n1-gpu0]"] == "failed"
    assert {outcomes[f"test_xid_errors[n1-gpu{i}]"] for i in range(1, 8)} == {"passed"}
    assert outcomes["test_kernel_log[n1]"] == "passed"  # WARN: passes with a warning
    assert outcomes["test_fabric_manager[n1]"] == "passed"
    node = run.verdicts["nodes"]["n1"]
    assert node["verdict"] == "FAIL"
    assert any("Xid 48 (double-bit ECC error, DBE) x1" in reason for reason in node["reasons"])
    warned = {w["check"]: w["message"] for w in node["warnings"]}
    assert "nvidia-peermem errors x30" in warned["kernel_log"]
    assert "fabric manager error 12028" in warned["fabric_manager"]


# Each once a false pass: a stamp that moved the window, an order that hid an XID.
XID48_LINE = "2024-11-15T12:02:03,470068+00:00 NVRM: Xid (PCI:0000:19:00): 48"


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        # One line from a later year, in the middle of the log: not where the log ends.
        ("2025-06-01T00:00:00,000000+00:00 usb 1-1: new device\n", 5),
        # A line dated after now, even at the end: kept, never the anchor.
        ("2099-01-01T00:00:00,000000+00:00 clocksource: bogus\n", None),
    ],
    ids=["later-year-mid-log", "future-at-end"],
)
def test_one_absurd_timestamp_does_not_move_the_window_past_the_xids(tmp_path, extra, where):
    lines = [line + "\n" for line in XID48.read_text().splitlines()]
    lines.insert(len(lines) if where is None else where, extra)
    log = tmp_path / "dmesg.log"
    log.write_text("".join(lines))
    rc, doc = triage(str(log))
    found = finding(doc, "kernel_log")
    assert rc == 1 and found["status"] == "FAIL" and "Xid 48" in found["message"]
    assert "before the log's last entry 2024-11-15T12:02:15" in found["message"]
    if where is None:
        assert "1 line(s) dated after now" in found["message"]


def test_an_older_copy_after_an_in_window_xid_does_not_hide_it(tmp_path):
    lines = XID48.read_text().splitlines(keepends=True)
    old_copy = lines[10].replace("2024-11-15T12:02:03", "2024-11-01T09:00:00")
    assert lines[10].startswith(XID48_LINE)
    log = tmp_path / "dmesg.log"
    log.write_text("".join([*lines[:11], old_copy, *lines[11:]]))
    rc, doc = triage(str(log))
    found = finding(doc, "kernel_log")
    assert rc == 1 and "Xid 48 (double-bit ECC error, DBE)" in found["message"]
    assert "x1 [2024-11-15T12:02:03.470068Z]" in found["message"]  # the old copy is outside


def test_a_log_without_usable_timestamps_is_judged_whole():
    section = evidence.kernel_log_evidence(
        "[ 12.5] NVRM: Xid (PCI:0000:19:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    )["kernel_log"]
    section.update(until=None, until_uptime_s=None)
    facts = healthy_h100()
    facts["kernel_log"] = section
    result = judge("xid_errors", facts, 0)
    assert result.status.value == "FAIL"
    assert "in the whole log (it has no timestamp to end a window at)" in result.result.message


@pytest.mark.parametrize(
    "line",
    [
        "6," + "9" * 400 + ",-;NVRM: Xid (PCI:0000:19:00): 79, pid=1, name=x, gone",
        "[" + "9" * 400 + ".5] NVRM: Xid (PCI:0000:19:00): 79, pid=1, name=x, gone",
        "2024-13-45T12:02:03,470068+00:00 NVRM: Xid (PCI:0000:19:00): 79, pid=1, name=x, gone",
    ],
    ids=["kmsg-400-digits", "uptime-400-digits", "month-13"],
)
def test_an_impossible_timestamp_is_no_timestamp_never_a_crash(line):
    with pytest.raises(ParseError, match="line 1: not a kernel log line"):
        parser.parse(line + "\n")


# ---------------------------------------------------------------- Blackwell: XIDs 144-154

GB200 = DATA / "gpud_kmsgtest_gb200_xid149_154.log"
GB200_BUSES = ("00000009:01:00.0", "00000008:01:00.0", "00000018:01:00.0", "00000019:01:00.0")


def gb200_facts(text: str) -> dict[str, Any]:
    """A 4-GPU tray in PCI domains 0009/0008/0018/0019 with `text` as its kernel log."""
    facts = healthy_h100()
    facts["gpus"] = facts["gpus"][:4]
    for gpu, bus in zip(facts["gpus"], GB200_BUSES, strict=True):
        gpu["pci_bus_id"] = bus
    facts["gpu_count"] = 4
    facts["kernel_log"] = live(evidence.kernel_log_evidence(text)["kernel_log"])
    return facts


def test_gb200_nvlink5_and_recovery_xids_are_read_for_what_they_say():
    section = parser.summarise(parser.parse(GB200.read_text())["events"])
    groups = {(g["bus_id"], g["code"]): g for g in section["counts"]}
    assert groups[("00000009:01:00.0", 149)]["count"] == 3
    assert groups[("00000009:01:00.0", 149)]["fatal"] is True
    assert groups[("00000008:01:00.0", 149)]["count"] == 2
    # XID 154: the action each GPU's latest change left pending
    assert {bus: groups[(bus, 154)]["recovery"] for bus in GB200_BUSES} == {
        "00000009:01:00.0": 4,  # 0x0 (None) -> 0x4 (Drain and Reset)
        "00000008:01:00.0": 1,  # 0x4 -> 0x1 (GPU Reset Required)
        "00000018:01:00.0": 1,
        "00000019:01:00.0": 1,
    }


def test_gb200_log_fails_each_gpu_with_its_pending_recovery_action():
    facts = gb200_facts(GB200.read_text())
    results = [judge("xid_errors", facts, index) for index in range(4)]
    assert [r.status for r in results] == ["FAIL"] * 4
    gpu0 = results[0].text  # 0009: fatal NVLink5 links and Drain and Reset pending
    assert "Xid 149 (NVLink5 error) x3" in gpu0
    assert "Xid 154 (GPU recovery action changed, pending DRAIN_AND_RESET (4)) x1" in gpu0
    assert results[0].action == "REBOOT_NODE"  # the fatal NVLink5 error ranks first
    gpu2 = results[2].text  # 0018: only a reset left to do
    assert "Xid 154 (GPU recovery action changed, pending GPU_RESET (1))" in gpu2
    assert results[2].action == "RESET_GPU" and "reset the GPU" in results[2].advice


def test_nonfatal_nvlink5_xids_warn_and_a_recovery_back_to_none_warns():
    text = (
        "[171167.620236] NVRM: Xid (PCI:0009:01:00): 149, NETIR_LINK_EVT  Nonfatal   XC0 i0 "
        "Link 01 (0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)\n"
        "[171167.621162] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x0 "
        "(None) to 0x1 (GPU Reset Required)\n"
        "[171169.000000] NVRM: Xid (PCI:0009:01:00): 154, GPU recovery action changed from 0x1 "
        "(GPU Reset Required) to 0x0 (None)\n"
    )
    result = judge("xid_errors", gb200_facts(text), 0)
    assert result.status == "WARN", result.text
    assert "Xid 149 (NVLink5 error, Nonfatal) x1" in result.text
    assert "Xid 154 (GPU recovery action changed, back to NONE) x2" in result.text


@pytest.mark.parametrize(
    ("line", "status"),
    [
        # no severity word on an NVLink5 XID: unknown is never harmless
        ("149, NETIR_LINK_EVT XC0 i0 Link 01 (0x0)", "FAIL"),
        # an unreadable recovery change: the XID table's verdict stands
        ("154, GPU recovery action changed somehow", "FAIL"),
        # a recovery action newer than gpuhealth's table drains
        ("154, GPU recovery action changed from 0x0 (None) to 0x9 (Something New)", "FAIL"),
    ],
)
def test_blackwell_xid_lines_that_cannot_be_read_fully_fail(line, status):
    text = f"[171167.620236] NVRM: Xid (PCI:0009:01:00): {line}\n"
    assert judge("xid_errors", gb200_facts(text), 0).status == status


def test_triage_of_the_gb200_log_drains_and_resets():
    done = subprocess.run(
        [sys.executable, "-m", "gpuhealth.cli", "triage", str(GB200), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["verdict"] == "FAIL"
    failed = [f for f in doc["findings"] if f["status"] == "FAIL"]
    assert any("pending DRAIN_AND_RESET (4)" in f["message"] for f in failed), failed


# ---------------------------------------------------------------- GPU faults without an Xid

OFF_BUS = DATA / "nvsentinel155_dmesg_fallen_off_bus_no_xid.log"
GSP = DATA / "ogkm1230_dmesg_gsp_heartbeat_memsys_timeout.log"
WPR2 = DATA / "ogkm1230_dmesg_rminitadapter_gsp_wpr2.log"
README_T = DATA / "nvidia_readme_knownissues_dmesg_t_xid79_rminit.log"
SYMBOLS_T = DATA / "talos12108_dmesg_t_nvidia_unknown_symbol.log"
TALOS_BAD = DATA / "talos6206_dmesg_rminitadapter_failed.log"
TALOS_OK = DATA / "talos7043_dmesg_boot_extensions.log"
POPOS = DATA / "popos3363_journal_xid79_fallen_off_bus.log"


def faults_of(path: Path) -> list[tuple[str, str | None, str | None]]:
    """(fault, bus id, driver GPU number) of every kernel fault a saved log reports."""
    events = parser.parse(path.read_text())["events"]
    return [(e["fault"], e["bus_id"], e["gpu"]) for e in events if e["kind"] == "fault"]


@pytest.mark.parametrize(
    ("path", "fmt", "found"),
    [
        (
            OFF_BUS,
            "dmesg",
            [("fallen_off_bus", "00000000:B3:00.0", None), ("probe_failed", None, None)],
        ),
        (
            GSP,
            "dmesg",
            [("gsp_heartbeat", None, "GPU6")] * 2
            + [("memory_subsystem", None, "GPU6"), ("gsp_timeout", None, "GPU6")],
        ),
        (WPR2, "dmesg", [("rm_init_failed", "00000000:A1:00.0", None)] * 3),
        (
            README_T,
            "dmesg -t",
            [
                ("fallen_off_bus", "00000000:09:00.0", None),
                ("rm_init_failed", "00000000:09:00.0", None),
            ],
        ),
        (SYMBOLS_T, "dmesg -t", []),
        (TALOS_BAD, "talosctl dmesg", [("rm_init_failed", "00000000:01:00.0", None)]),
        (TALOS_OK, "talosctl dmesg", []),
        (POPOS, "journalctl -k", [("fallen_off_bus", "00000000:01:00.0", None)]),
    ],
    ids=lambda value: value.name if isinstance(value, Path) else None,
)
def test_kernel_faults_in_the_real_samples(path, fmt, found):
    text = path.read_text()
    assert parser.detect(text) == fmt and parser.parse(text)["format"] == fmt
    assert faults_of(path) == found


def test_a_gpu_off_the_bus_at_driver_load_with_no_xid_fails(tmp_path):
    """Once a false PASS: no `NVRM: Xid` line, so nothing was judged."""
    rc, doc = triage(str(OFF_BUS))
    found = finding(doc, "kernel_log")
    assert rc == 1 and found["status"] == "FAIL" and found["action"] == "REBOOT_NODE"
    assert (
        "GPU has fallen off the bus (kernel fault fallen_off_bus, no Xid) on 00000000:B3:00.0"
        in found["message"]
    )
    assert "nvidia driver's probe of the GPU failed" in found["message"]
    assert "reseat the GPU" in found["advice"]
    # With the node's GPUs known, the GPU at b3:00 fails too, and the node names it.
    facts = healthy_h100()
    facts["gpus"][3]["pci_bus_id"] = "00000000:B3:00.0"
    facts["kernel_log"] = live(evidence.kernel_log_evidence(OFF_BUS.read_text())["kernel_log"])
    gpu3 = judge("xid_errors", facts, 3)
    assert gpu3.status == "FAIL" and gpu3.action == "REBOOT_NODE"
    assert gpu3.text.startswith("node17 gpu3") and "fallen_off_bus" in gpu3.text
    assert "x1" in gpu3.text and '"The NVIDIA GPU 0000:b3:00.0' not in gpu3.text
    assert judge("xid_errors", facts, 2).status == "PASS"
    node = judge("kernel_log", facts)
    assert node.status == "FAIL" and "on 00000000:B3:00.0 (gpu3)" in node.text


def test_gsp_heartbeat_memory_subsystem_and_gsp_timeout_without_xid_fail():
    """Once a false PASS: GPU6's GSP stopped answering, and no Xid line said so."""
    rc, doc = triage(str(GSP))
    found = finding(doc, "kernel_log")
    assert rc == 1 and found["status"] == "FAIL" and found["action"] == "RESET_GPU"
    for part in (
        "GSP firmware heartbeat timed out (kernel fault gsp_heartbeat, no Xid) on the driver's "
        "GPU6 (its number, not nvidia-smi's index; the log gives no bus id for it) x2 "
        "[24 s after boot]",
        "GPU memory subsystem error (kernel fault memory_subsystem, no Xid) on the driver's GPU6",
        "GSP RPC timeout (kernel fault gsp_timeout, no Xid) on the driver's GPU6",
        '"NVRM: GPU6 _kgspIsHeartbeatTimedOut: Heartbeat timed out, currentTimeMs',
    ):
        assert part in found["message"], found["message"]
    assert "reset the GPU" in found["advice"]


def test_the_driver_gpu_number_takes_the_bus_id_an_xid_gave_it():
    text = (
        "[ 10.0] NVRM: GPU4 _kgspIsHeartbeatTimedOut: Heartbeat timed out, diff 6070\n"
        "[ 11.0] NVRM: Xid (PCI:0000:9b:00): 119, pid=1, name=python, Timeout after 45s of "
        "waiting for RPC response from GPU4 GSP! Expected function 76 (GSP_RM_CONTROL)\n"
    )
    events = parser.parse(text)["events"]
    assert [(e["kind"], e["bus_id"]) for e in events] == [
        ("fault", "00000000:9B:00.0"),
        ("xid", "00000000:9B:00.0"),
    ]


def test_faults_in_the_window_are_counted_per_gpu_and_kind():
    section = parser.summarise(parser.parse(GSP.read_text())["events"])
    groups = [(g["kind"], g["fault"], g["gpu"], g["count"]) for g in section["counts"]]
    assert groups == [
        ("fault", "gsp_heartbeat", "GPU6", 2),
        ("fault", "memory_subsystem", "GPU6", 1),
        ("fault", "gsp_timeout", "GPU6", 1),
    ]


@pytest.mark.parametrize(
    ("path", "status"),
    [(TALOS_BAD, "FAIL"), (TALOS_OK, "PASS"), (README_T, "FAIL"), (SYMBOLS_T, "PASS")],
    ids=lambda value: value.name if isinstance(value, Path) else value,
)
def test_triage_of_talos_and_timestamp_free_logs(path, status):
    rc, doc = triage(str(path))
    assert rc == (1 if status == "FAIL" else 0)
    assert finding(doc, "kernel_log")["status"] == status


def test_the_fault_table_is_valid_and_every_entry_has_a_source():
    from gpuhealth.families.kernel.checks import fault_table
    from gpuhealth.families.kernel.parse_kernel_faults import FAULTS

    assert set(fault_table()) == {f["name"] for f in FAULTS}
    assert all(f["source"] for f in FAULTS)


def test_the_probe_reads_kernel_faults_from_dmesg(tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc/uptime").write_text("2000.00 100.00\n")
    tools(
        tmp_path, monkeypatch, dmesg=f'[ "$1" = --time-format=iso ] && exit 1\n/bin/cat {OFF_BUS}\n'
    )
    section, errors = collect(root)
    assert section["source"] == "dmesg" and errors == []
    found = [(g["fault"], g["bus_id"], g["count"]) for g in section["counts"]]
    assert found == [("fallen_off_bus", "00000000:B3:00.0", 1), ("probe_failed", None, 1)]


# ---------------------------------------------------------------- kernel lines as pasted

NOW_2024 = parser.epoch("2024-08-15T00:00:00Z")


@pytest.mark.parametrize(
    ("text", "fmt", "when", "uptime"),
    [
        (f"kernel: {XID79}", "journalctl -k (time cut off)", None, None),
        (f"node17 kernel: {XID79}", "journalctl -k (time cut off)", None, None),
        (f"kernel: [ 966.503025] {XID79}", "journalctl -k (time cut off)", None, 966.503025),
        (f"{XID79}", "dmesg -t", None, None),
        (f"[Jul31 11:22] {XID79}", "dmesg -H", "2024-07-31T11:22:00", None),
        (
            f"[Jul31 11:22] usb 1-1: new device\n[  +1.500000] eth0: up\n[  +0.250000] {XID79}",
            "dmesg -H",
            "2024-07-31T11:22:01.750000",
            None,
        ),
        (f"[  +0.000004] {XID79}", "dmesg -H", None, None),  # its base line was cut off
        (
            f"10.0.20.203: kern: warning: [2024-07-31T11:22:39.922855838Z]: {XID79}",
            "talosctl dmesg",
            "2024-07-31T11:22:39.922856Z",
            None,
        ),
        (
            f"Jul 31 11:22:39.123456 node17 kernel: {XID79}",
            "journalctl -k",
            "2024-07-31T11:22:39.123456",
            None,
        ),
        (
            f"Wed 2024-07-31 11:22:39 UTC node17 kernel: {XID79}",
            "journalctl -k",
            "2024-07-31T11:22:39Z",
            None,
        ),
    ],
    ids=[
        "kernel-prefix",
        "host-kernel-prefix",
        "kernel-prefix-uptime",
        "dmesg-t",
        "dmesg-H",
        "dmesg-H-relative",
        "dmesg-H-no-base",
        "talos",
        "short-precise",
        "short-full",
    ],
)
def test_pasted_kernel_line_forms_give_the_same_xid(text, fmt, when, uptime):
    parsed = parser.parse(text + "\n", now=NOW_2024)
    assert parsed["format"] == fmt and parser.detect(text + "\n") == fmt
    (event,) = [e for e in parsed["events"] if e["kind"] == "xid"]
    assert (event["code"], event["bus_id"], event["time"], event["uptime_s"]) == (
        79,
        "00000000:3B:00.0",
        when,
        uptime,
    )


def test_a_multi_line_dmesg_record_keeps_its_time_on_every_line():
    parsed = parser.parse(OFF_BUS.read_text())
    (fault, _) = parsed["events"]
    assert (fault["uptime_s"], fault["text"]) == (
        1843.308145,
        "NVRM: fallen off the bus and is not responding to commands.",
    )


@pytest.mark.parametrize(
    "line",
    [
        "kernel: " + "[" * 200_000,
        "a kernel: [ " + " " * 200_000 + "x",
        "10.0.0.1: kern: warning: [" + "9" * 200_000,
        "n: kern:" + " " * 200_000 + "x",
        "[Nov26 " + " " * 200_000,
        "[ +" + " " * 200_000 + "1.0]",
        "a" * 200_000 + ": x",
        "a " + "b" * 200_000 + ":",
        "NVRM: GPU" + "1" * 200_000 + " Heartbeat",
        "Timeout waiting for RPC from GPU" + "1" * 200_000,
        "NVRM: The NVIDIA GPU " + "0" * 200_000,
        "nvidia: probe of " + "0:" * 100_000 + " failed",
        "NVRM: " + "0000:" * 40_000,
        "Tue 2024-11-26 10:01:02 " + "A" * 200_000,
    ],
    ids=lambda line: line[:24],
)
def test_new_line_forms_and_fault_patterns_are_linear_on_long_lines(line):
    started = time.monotonic()
    with contextlib.suppress(ParseError):
        parser.parse(f"[ 1.0] x\n{line}\n{line}\n")
    parser.detect(f"{line}\n")
    assert time.monotonic() - started < 2
