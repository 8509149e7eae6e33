"""The storage family for real: temporary files, directories, FIFOs and mount tables.

Nothing here can hang a test run: a FIFO opened for reading with no writer blocks in the kernel
the way a path on a dead NFS server does, and the probe must give up on it after its timeout.

Root ignores permission bits (CAP_DAC_OVERRIDE), so `chmod 000` cannot make a path unreadable
here. The failing paths below fail for every user: a path under a regular file (ENOTDIR), a
dangling symlink (ENOENT), and creating a file in /sys, which sysfs refuses even to root
(EACCES).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.config import ConfigError, expectations_from_vars
from gpuhealth.families.storage import parse_mounts as mounts
from gpuhealth.families.storage import probe as storage
from gpuhealth.parsing import ParseError
from gpuhealth.probe import command
from selftest.facts import PROFILES, healthy_h100
from selftest.facts import judge as judge_facts
from selftest.facts import probe as run_probe
from selftest.suite import run_suite

# A GPU node's /proc/mounts as the kernel prints it: NFSv4 home, FSx for Lustre, an NFSv3
# share whose mount point has a space (kernel-escaped as \040), WEKA and a FUSE filesystem.
PROC_MOUNTS = r"""sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
/dev/nvme0n1p1 / ext4 rw,relatime,discard,errors=remount-ro 0 0
tmpfs /run tmpfs rw,nosuid,nodev,noexec,relatime,size=203062124k,mode=755 0 0
/dev/md0 /raid xfs rw,noatime,attr2,inode64,logbufs=8,logbsize=32k,sunit=1024,swidth=8192 0 0
10.20.0.5:/export/home /home nfs4 rw,relatime,vers=4.1,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.20.1.17,local_lock=none,addr=10.20.0.5 0 0
fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh /fsx lustre rw,relatime,flock,lazystatfs,encrypt 0 0
10.20.0.6:/datasets /mnt/team\040datasets nfs rw,relatime,vers=3,rsize=1048576,wsize=1048576,namlen=255,hard,nolock,proto=tcp,timeo=600,retrans=2,sec=sys,mountaddr=10.20.0.6,mountvers=3,mountport=20048,mountproto=tcp,local_lock=all,addr=10.20.0.6 0 0
default /mnt/weka wekafs rw,relatime,writecache,inode_bits=auto,readahead_kb=32768,container_name=client 0 0
s3fs /mnt/s3 fuse.s3fs rw,nosuid,nodev,relatime,user_id=0,group_id=0,allow_other 0 0
"""  # noqa: E501 (kernel lines are as long as they are)


def probe(paths: list[Any], root: str = "/", **expect: Any) -> dict[str, Any]:
    expect = {"storage_paths": paths, "storage_timeout_s": 1, **expect}
    sections, errors = run_probe("storage", root, **expect)
    return {**sections["storage"], "errors": errors}


def by_path(section: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["path"]: r for r in section["paths"]}


def judge(name: str, section: dict[str, Any], **overrides: Any) -> Any:
    return judge_facts(name, {"storage": section}, profile=None, host="n1", **overrides)


def zombie_children() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) == os.getpid():
                found.append(int(entry.name))
    return found


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A readable file, a directory with two entries, a FIFO and two paths that cannot exist."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a").write_text("a")
    (tmp_path / "data" / "b").write_text("b")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "weights.bin").write_bytes(b"x" * 10000)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    return tmp_path


# ---------------------------------------------------------------- command.run after a timeout


def _pids_of(argv: list[str]) -> list[int]:
    wanted = ("\0".join(argv) + "\0").encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == wanted:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def test_command_timeout_returns_although_a_grandchild_holds_the_pipes():
    # The setsid'd sleep is in another session, so killing the command's process group spares
    # it, and it keeps the inherited stdout open: an unbounded wait would last 600 s.
    stray = ["sleep", "601.5"]
    started = time.monotonic()
    try:
        result = command.run(["sh", "-c", "setsid sleep 601.5 & sleep 600"], 1)
        elapsed = time.monotonic() - started
        assert _pids_of(stray), "the grandchild should still be alive: the test proves nothing"
    finally:
        for pid in _pids_of(stray):
            os.kill(pid, signal.SIGKILL)
    assert (
        result.timed_out
        and result.error == "sh -c setsid sleep 601.5 & sleep 600 timed out after 1 s"
    )
    assert elapsed < 1 + command.KILL_GRACE_S + 1


def test_command_output_is_kept_when_the_pipes_close_after_the_kill():
    result = command.run(["sh", "-c", "echo before; sleep 600"], 1)
    assert result.timed_out and result.stdout == "before\n"


# ---------------------------------------------------------------- the mount table parser


def test_mount_table_parser_on_a_gpu_node():
    table = mounts.parse(PROC_MOUNTS)
    assert len(table) == 10
    home = table[5]
    assert home["device"] == "10.20.0.5:/export/home"
    assert (home["mountpoint"], home["fstype"]) == ("/home", "nfs4")
    assert "vers=4.1" in home["options"]
    assert table[6]["fstype"] == "lustre" and table[6]["mountpoint"] == "/fsx"
    assert table[7]["mountpoint"] == "/mnt/team datasets"
    assert [m["fstype"] for m in table[8:]] == ["wekafs", "fuse.s3fs"]


def test_mount_table_escapes_and_garbage():
    assert mounts.unescape(r"/mnt/a\011b\134c\012") == "/mnt/a\tb\\c\n"
    with pytest.raises(ParseError, match="line 2"):
        mounts.parse("proc /proc proc rw 0 0\n<html>oops</html>\n")


# ---------------------------------------------------------------- the probe on real paths


def test_file_readable_and_directory_listable(tree):
    found = by_path(probe([str(tree / "weights.bin"), str(tree / "data")]))
    weights, data = found[str(tree / "weights.bin")], found[str(tree / "data")]
    assert weights["ok"] and weights["kind"] == "file" and weights["bytes_read"] == 4096
    assert data["ok"] and data["kind"] == "dir" and data["entries"] == 2
    assert data["free_gb"] > 0 and data["error"] is None and data["wrote"] is None


def test_paths_that_fail_even_for_root(tree):
    under_file = str(tree / "weights.bin" / "shard0")
    found = by_path(probe([under_file, str(tree / "dangling"), str(tree / "absent")]))
    assert found[under_file]["error"] == (
        "does not exist: a parent component is a file, not a directory"
    )
    assert found[str(tree / "dangling")]["error"] == f"dangling symlink to {tree / 'gone'}"
    assert found[str(tree / "absent")]["error"] == "does not exist"
    assert not any(r["ok"] for r in found.values())


def test_hung_fifo_times_out_while_the_other_paths_finish(tree):
    started = time.monotonic()
    section = probe([str(tree / "fifo"), str(tree / "data"), str(tree / "weights.bin")])
    elapsed = time.monotonic() - started
    fifo, data, weights = section["paths"]
    assert not fifo["ok"] and fifo["error"] == "timed out after 1 s"
    assert 1 <= fifo["elapsed_s"] < 1.5
    assert data["ok"] and weights["ok"] and data["elapsed_s"] < 0.5
    assert elapsed < 2.5
    assert zombie_children() == []


def test_hung_items_cost_one_timeout_per_round_of_parallel_children():
    hang = partial(time.sleep, 600)
    started = time.monotonic()
    results = storage.run_bounded([hang, hang, hang], 0.5, parallel=2)
    elapsed = time.monotonic() - started
    assert [r["error"] for r in results] == ["timed out after 0.5 s"] * 3
    assert 1.0 <= elapsed < 2.0  # two rounds: two hung together, then the third


def test_a_crashing_check_answers_instead_of_hanging():
    def boom() -> dict[str, Any]:
        raise RuntimeError("bug")

    def die() -> dict[str, Any]:
        os._exit(3)

    results = storage.run_bounded([boom, die], 5)
    assert results[0]["error"] == "probe error: RuntimeError: bug"
    assert results[1]["error"] == "check process died without an answer"
    assert max(r["elapsed_s"] for r in results) < 1


def test_writable_path_gets_a_file_written_read_back_and_removed(tree, monkeypatch):
    ckpt = tree / "ckpt"
    (record,) = probe([{"path": str(ckpt), "writable": True}])["paths"]
    assert record["ok"] and record["wrote"] is True
    assert list(ckpt.iterdir()) == []
    # The children are forks: without unlink, the file they wrote stays for inspection.
    monkeypatch.setattr(storage.os, "unlink", lambda path: None)
    (record,) = probe([{"path": str(ckpt), "writable": True}])["paths"]
    (left,) = ckpt.iterdir()
    assert left.name.startswith(f".gpuhealth-write-test-{socket.gethostname()}-")
    assert left.stat().st_size == 64


def test_write_refused_is_a_failure(tree):
    section = probe([{"path": "/sys", "writable": True}, {"path": str(tree), "writable": False}])
    sys_record = section["paths"][0]
    assert not sys_record["ok"] and sys_record["error"] == "write: permission denied"
    assert sys_record["kind"] == "dir" and sys_record["entries"] > 0
    result = judge("storage_paths", section, storage_paths=[{"path": "/sys", "writable": True}])
    assert result.status == "FAIL"
    assert "/sys: write: permission denied" in result.text
    assert "read-write (`mount | grep /sys`" in result.text


def test_absurd_free_space_limit_fails(tree):
    paths = [str(tree / "data"), {"path": str(tree / "ckpt"), "min_free_gb": 10**9}]
    section = probe(paths)
    free = by_path(section)[str(tree / "ckpt")]["free_gb"]
    result = judge("storage_paths", section, storage_paths=paths)
    assert result.status == "FAIL"
    assert f"1 of 2 storage paths failing: {tree / 'ckpt'}: only {free:.1f} GB free" in (
        result.text
    )
    assert "expected >= 1000000000 GB" in result.text and "grow the filesystem" in result.text
    everywhere = judge("storage_paths", section, storage_paths=paths[:1], storage_min_free_gb=1e9)
    assert everywhere.status == "FAIL"
    assert judge("storage_paths", section, storage_paths=paths[:1]).status == "PASS"


# ---------------------------------------------------------------- mounts and Lustre, root prefix


def node_root(tmp_path: Path, health: str | None) -> Path:
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "mounts").write_text(PROC_MOUNTS)
    for mountpoint in ("home", "mnt/team datasets", "mnt/weka", "mnt/s3"):
        (root / mountpoint).mkdir(parents=True)
    if health is not None:
        (root / "sys/fs/lustre").mkdir(parents=True)
        (root / "sys/fs/lustre/health_check").write_text(health)
    return root


def test_network_mounts_and_lustre_health_under_a_root_prefix(tmp_path):
    root = node_root(tmp_path, "healthy\n")
    (root / "fsx").mkdir()
    section = probe([], root=str(root), storage_mount_types=["wekafs", "fuse.*"])
    assert [(m["fstype"], m["mountpoint"], m["ok"]) for m in section["mounts"]] == [
        ("nfs4", "/home", True),
        ("lustre", "/fsx", True),
        ("nfs", "/mnt/team datasets", True),
        ("wekafs", "/mnt/weka", True),
        ("fuse.s3fs", "/mnt/s3", True),
    ]
    assert section["lustre_health_check"] == "healthy"
    result = judge("distributed_mounts", section)
    assert result.status == "PASS"
    assert "5 network mounts answer (nfs4 /home, lustre /fsx" in result.text
    assert "Lustre health_check healthy" in result.text


def test_unhealthy_lustre_and_unreachable_mount_fail(tmp_path):
    root = node_root(tmp_path, "device fsx-OST0003-osc-ffff9a2c reported unhealthy\nNOT HEALTHY\n")
    section = probe([], root=str(root))
    assert section["lustre_health_check"].endswith("NOT HEALTHY")
    fsx = next(m for m in section["mounts"] if m["mountpoint"] == "/fsx")
    assert fsx["error"] == "stat: no such file or directory"
    result = judge("distributed_mounts", section)
    assert result.status == "FAIL"
    assert "/fsx (lustre from fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh)" in (
        result.text
    )
    assert "Lustre health_check reads 'device fsx-OST0003-osc-ffff9a2c reported unhealthy / " in (
        result.text
    )
    assert "umount -l /fsx && mount /fsx" in result.text and "LBUG" in result.text


def test_no_network_filesystem_skips(tmp_path):
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "mounts").write_text(PROC_MOUNTS.split("10.20.0.5")[0])
    section = probe([], root=str(root))
    assert section["mounts"] == []
    assert section["unavailable"]["lustre_health_check"]["kind"] == "absent"
    result = judge("distributed_mounts", section)
    assert result.status == "SKIP"
    assert "no network filesystem mounted on n1 (types: lustre, nfs, nfs4)" in result.text


def test_unreadable_mount_table_fails_and_is_recorded(tmp_path):
    section = probe([], root=str(tmp_path))
    assert section["mounts"] is None
    assert section["errors"] == [{"probe": "storage", "error": "cannot read /proc/mounts"}]
    result = judge("distributed_mounts", section)
    assert result.status == "FAIL" and "could not read the mount table" in result.text


def test_lustre_mounted_without_health_check_fails(tmp_path):
    root = node_root(tmp_path, None)
    (root / "fsx").mkdir()
    result = judge("distributed_mounts", probe([], root=str(root)))
    assert result.status == "FAIL"
    assert "Lustre health_check unreadable: no /sys/fs/lustre/health_check" in result.text


# ---------------------------------------------------------------- checks on recorded facts


def test_storage_paths_message_names_each_path_with_what_was_measured():
    section = {
        "paths": [
            {
                "path": "/mnt/nfs/ckpt",
                "ok": False,
                "error": "timed out after 5 s",
                "timed_out": True,
                "wrote": None,
            },
            {"path": "/data", "ok": False, "error": "list: permission denied", "wrote": None},
            {"path": "/scratch", "ok": True, "error": None, "free_gb": 12.04, "wrote": True},
        ]
    }
    configured = ["/mnt/nfs/ckpt", "/data", {"path": "/scratch", "writable": True}, "/models"]
    result = judge("storage_paths", section, storage_paths=configured, storage_min_free_gb=100)
    assert result.status == "FAIL"
    assert result.text.startswith(
        "n1: 4 of 4 storage paths failing: /mnt/nfs/ckpt: timed out after 5 s; "
        "/data: list: permission denied; /scratch: only 12.0 GB free, expected >= 100 GB; "
        "/models: not measured by the probe. Action DRAIN: a hung mount under /mnt/nfs/ckpt: "
    )
    assert "`mount | grep /data`" in result.text
    assert "check the NFS/Lustre server" in result.advice


def test_storage_paths_pass_and_skip():
    section = {"paths": [{"path": "/data", "ok": True, "free_gb": 500.0, "wrote": True}]}
    configured = [{"path": "/data", "writable": True, "min_free_gb": 100}]
    result = judge("storage_paths", section, storage_paths=configured)
    assert (result.status, result.text) == (
        "PASS",
        "n1: 1 storage paths readable, 1 writable, free space within limits on 1",
    )
    skipped = judge("storage_paths", section)
    assert skipped.status == "SKIP" and "no storage_paths configured for n1" in skipped.text


def test_writable_path_probed_read_only_is_not_a_pass():
    section = {"paths": [{"path": "/data", "ok": True, "free_gb": 500.0, "wrote": None}]}
    result = judge("storage_paths", section, storage_paths=[{"path": "/data", "writable": True}])
    assert result.status == "FAIL" and "/data: write test not run by the probe" in result.text


def test_hung_mount_message():
    section = {
        "mounts": [
            {
                "device": "10.20.0.5:/export/home",
                "mountpoint": "/home",
                "fstype": "nfs4",
                "ok": False,
                "error": "timed out after 5 s",
            }
        ],
        "lustre_health_check": None,
        "unavailable": {"lustre_health_check": {"kind": "absent", "detail": "no Lustre"}},
    }
    result = judge("distributed_mounts", section)
    assert result.status == "FAIL"
    assert result.text.startswith(
        "n1: /home (nfs4 from 10.20.0.5:/export/home): timed out after 5 s. Action DRAIN: "
    )


def test_evidence_without_storage_is_not_evaluated():
    facts = {"source": "evidence-file", "storage": None}
    result = judge_facts("storage_paths", facts, profile=None, host="n1", storage_paths=["/data"])
    assert result.status == "SKIP" and "not evaluated" in result.text


# ---------------------------------------------------------------- inventory validation


@pytest.mark.parametrize(
    ("paths", "message"),
    [
        (["/data", "data/x"], "storage_paths[1].path': not an absolute path (got 'data/x')"),
        ([{"path": "ckpt"}], "storage_paths[0].path': not an absolute path (got 'ckpt')"),
        ([{"path": "/a", "writeable": True}], "storage_paths[0]: unknown key 'writeable'"),
        ([{"path": "/a", "writable": "yes"}], "storage_paths[0].writable' must be bool, got 'yes'"),
        ([{"path": "/a", "min_free_gb": -1}], "min_free_gb' must be >= 0, got -1"),
        ([{"path": "/a", "min_free_gb": "lots"}], "min_free_gb' must be int or float, got 'lots'"),
        ([42], "storage_paths[0]' must be an absolute path or a mapping with a 'path', got 42"),
        ("/data", "key 'storage_paths' must be a list, got '/data'"),
    ],
)
def test_bad_storage_paths_name_host_and_entry(paths, message):
    with pytest.raises(ConfigError, match="^inventory host n2: ") as info:
        expectations_from_vars("n2", {"storage_paths": paths}, PROFILES)
    assert message in str(info.value)


def test_other_storage_keys_are_validated():
    with pytest.raises(ConfigError, match="'storage_timeout_s' must be > 0"):
        expectations_from_vars("n2", {"storage_timeout_s": 0}, PROFILES)
    with pytest.raises(ConfigError, match=r"storage_mount_types\[0\]': not a filesystem type"):
        expectations_from_vars("n2", {"storage_mount_types": [""]}, PROFILES)
    ok = expectations_from_vars("n2", {"storage_mount_types": ["wekafs", "fuse.*"]}, PROFILES)
    assert ok.overrides["storage_mount_types"] == ["wekafs", "fuse.*"]


# ---------------------------------------------------------------- the health suite


@pytest.mark.suite
def test_relative_storage_path_is_one_usage_error(tmp_path):
    facts = tmp_path / "facts"
    facts.mkdir()
    (facts / "n2.json").write_text(json.dumps(healthy_h100()))
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    n2:\n      storage_paths: [/data, data/x]\n")
    run = run_suite(tmp_path / "r", "--facts", str(facts), "--inventory", str(inventory))
    assert run.rc == 4, run.output
    assert (
        "inventory host n2: key 'storage_paths[1].path': not an absolute path (got 'data/x')"
        in run.output
    )
    assert "Traceback" not in run.output


@pytest.mark.suite
def test_suite_fails_exactly_the_hung_path_and_completes(tree, tmp_path):
    me = socket.gethostname()
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        f"all:\n  hosts:\n    {me}:\n"
        "      storage_timeout_s: 1\n"
        "      storage_paths:\n"
        f"        - {tree / 'data'}\n"
        f"        - {tree / 'weights.bin'}\n"
        f"        - {{path: {tree / 'ckpt'}, writable: true}}\n"
        f"        - {tree / 'fifo'}\n"
    )
    started = time.monotonic()
    run = run_suite(tmp_path / "r", "--hosts", "local://", "--inventory", str(inventory))
    elapsed = time.monotonic() - started
    failed = {name for name, status in run.outcomes().items() if status == "failed"}
    assert failed == {f"test_storage_paths[{me}]"}, run.output
    message = run.messages()[f"test_storage_paths[{me}]"]
    assert f"1 of 4 storage paths failing: {tree / 'fifo'}: timed out after 1 s" in message
    facts = json.loads((tmp_path / "r" / "facts" / f"{me}.json").read_text())
    fifo = facts["storage"]["paths"][3]
    assert fifo["error"] == "timed out after 1 s" and fifo["elapsed_s"] < 1.5
    assert list((tree / "ckpt").iterdir()) == []
    assert elapsed < 60
