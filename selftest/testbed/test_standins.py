"""The bed's stand-in packages and tarballs, unpacked and run here (no root, no bed needed).

What the nodes install from the mirror is built, extracted with dpkg-deb / tar and used the way
a node (or a role) uses it: nccl-tests compiled against the libnccl-dev stand-in through
NCCL_HOME and run against libnccl2, dcgmi through its /usr/bin symlink, GPUd started with
`gpud up` and asked by the probe's own GPUd client. Each replays the real recording the
scenario names.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpuhealth.families.dcgm import parse_dcgm as dcgm
from gpuhealth.families.nccl import parse_nccl_tests as nccl_tests
from selftest.facts import judge, probe

from . import bedlib, fleet, mirror, standins

DATA = standins.SELFTEST / "data"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The debs and tarballs, each deb extracted into one root (as dpkg -i would lay it out)."""
    out = tmp_path_factory.mktemp("standins")
    debs = [standins.dcgm_deb(out), *standins.nccl_debs(out), standins.fabricmanager_deb(out)]
    root = out / "root"
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    gpud, nccl = standins.build_files(out)
    return {"root": root, "gpud": gpud, "nccl-tests": nccl, "out": out}


def scenario(path: Path, **keys: str) -> dict[str, str]:
    """os.environ with FAKE_NVML_SCENARIO naming a scenario file (written to path) of these
    tool keys, dcgm_diag_rc standing for dcgm.diag_rc."""
    path.write_text("".join(f"{key.replace('_', '.', 1)}={v}\n" for key, v in keys.items()))
    return {**os.environ, "FAKE_NVML_SCENARIO": str(path)}


# ---------------------------------------------------------------- libnccl2, libnccl-dev, nccl-tests


def test_nccl_header_is_the_package_version():
    header = (standins.PAYLOAD / "libnccl" / "nccl.h").read_text()
    parts = [re.search(rf"#define NCCL_{p} (\d+)", header)[1] for p in ("MAJOR", "MINOR", "PATCH")]
    assert ".".join(parts) == standins.NCCL_VERSION.split("-")[0]


def _multiarch() -> str:
    return subprocess.run(
        ["gcc", "-print-multiarch"], capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture(scope="module")
def nccl_build(built, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The tarball unpacked and built with NCCL_HOME at the extracted libnccl-dev (an
    include/ + lib/ layout, as NVIDIA's NCCL tarballs have); the build dir and its run env."""
    work = tmp_path_factory.mktemp("nccl-tests")
    home = work / "nccl"
    home.mkdir()
    (home / "include").symlink_to(built["root"] / "usr" / "include")
    (home / "lib").symlink_to(built["root"] / "usr" / "lib" / _multiarch())
    with tarfile.open(built["nccl-tests"]) as tar:
        tar.extractall(work, filter="data")
    top = work / f"nccl-tests-{standins.NCCL_TESTS_VERSION}"
    make = subprocess.run(
        ["make", "-C", str(top), f"NCCL_HOME={home}"], capture_output=True, text=True
    )
    assert make.returncode == 0, make.stdout + make.stderr
    return top / "build", {**os.environ, "LD_LIBRARY_PATH": str(home / "lib")}


def test_nccl_tests_build_links_libnccl_and_replays_the_healthy_run(nccl_build):
    build, env = nccl_build
    argv = [str(build / "all_reduce_perf"), "-b", "8", "-e", "16G", "-f", "2", "-g", "8"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (DATA / "nccl-tests" / standins.NCCL_HEALTHY).read_text()
    assert "NCCL 2.25.1 (libnccl.so.2); replaying" in proc.stderr
    assert nccl_tests.parse(proc.stdout)["avg_busbw_gbps"] == 439.369


def test_the_scenario_picks_the_recording(nccl_build, tmp_path):
    build, env = nccl_build
    env = {**env, **scenario(tmp_path / "slow.conf", nccl_all_reduce_perf=standins.NCCL_SLOW)}
    proc = subprocess.run([str(build / "all_reduce_perf")], capture_output=True, text=True, env=env)
    assert proc.stdout == (DATA / "nccl-tests" / standins.NCCL_SLOW).read_text()


def test_nccl_tests_needs_nccl_to_build_and_to_run(nccl_build, built, tmp_path):
    build, _ = nccl_build
    plain = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    run = subprocess.run(
        [str(build / "all_reduce_perf")], capture_output=True, text=True, env=plain
    )
    assert run.returncode == 127 and "libnccl.so.2" in run.stderr  # libnccl2 not installed
    with tarfile.open(built["nccl-tests"]) as tar:
        tar.extractall(tmp_path, filter="data")
    top = tmp_path / f"nccl-tests-{standins.NCCL_TESTS_VERSION}"
    no_dev = subprocess.run(["make", "-C", str(top)], capture_output=True, text=True)
    assert no_dev.returncode != 0 and "nccl.h: No such file" in no_dev.stderr
    mpi = ["make", "-C", str(top), f"NCCL_HOME={build.parent.parent / 'nccl'}", "MPI=1"]
    no_mpi = subprocess.run([*mpi, "MPI_HOME=/nonexistent"], capture_output=True, text=True)
    assert no_mpi.returncode != 0 and "mpi.h: No such file" in no_mpi.stderr


# ---------------------------------------------------------------- datacenter-gpu-manager-4-cuda12


def dcgmi(built: dict[str, Path], env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(built["root"] / "usr/bin/dcgmi"), *args], capture_output=True, text=True, env=env
    )


def test_dcgmi_replays_the_real_samples_by_default(built, tmp_path):
    env = scenario(tmp_path / "plain.conf")  # a scenario without dcgm keys
    diag = dcgmi(built, env, "diag", "-r", "2", "-j")
    assert diag.returncode == 0
    assert diag.stdout == (DATA / "dcgm" / "vc_dcgmi_diag_r2.json").read_text()
    health = dcgmi(built, env, "health", "-c", "-j")
    assert dcgm.parse_health(health.stdout)["overall"] == "Healthy"


def test_dcgmi_fails_gpu3_where_the_scenario_says(built, tmp_path):
    env = scenario(
        tmp_path / "fail.conf", dcgm_diag=standins.DCGM_H100X8_FAIL_GPU3, dcgm_diag_rc="226"
    )
    diag = dcgmi(built, env, "diag", "-r", "2", "-j")
    assert diag.returncode == 226
    results = [r for t in dcgm.parse_diag(diag.stdout)["tests"] for r in t["results"]]
    assert {r["gpus"][0]: r["status"] for r in results} == {
        i: "Fail" if i == 3 else "Pass" for i in range(8)
    }
    assert dcgmi(built, env, "health", "-c", "-j").returncode == 0  # diag_rc is diag's only
    healthy = scenario(tmp_path / "healthy.conf", dcgm_diag=standins.DCGM_H100X8)
    doc = dcgm.parse_diag(dcgmi(built, healthy, "diag").stdout)
    assert [r["status"] for t in doc["tests"] for r in t["results"]] == ["Pass"] * 8
    overridden = {**env, "STANDIN_DCGM_DIAG": "garbage", "STANDIN_DCGM_RC": "0"}
    assert dcgmi(built, overridden, "diag").stdout.startswith("Usage: dcgmi")  # selftests win


def test_fabric_manager_is_a_readme_only(built):
    files = [p for p in built["root"].rglob("*") if "fabricmanager" in str(p) and p.is_file()]
    assert [p.name for p in files] == ["README.testbed"]
    assert "no NVSwitch" in files[0].read_text()


# ---------------------------------------------------------------- GPUd release tarball


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_gpud_tarball_serves_the_scenario_over_https(built, tmp_path):
    stem = f"gpud_{standins.GPUD_VERSION}_linux_{standins.host_arch()}"
    assert built["gpud"].name == f"{stem}.tgz"
    with tarfile.open(built["gpud"]) as tar:
        assert tar.getnames() == [stem, f"{stem}/gpud"]
        tar.extractall(tmp_path, filter="data")
    gpud = str(tmp_path / stem / "gpud")
    address = f"127.0.0.1:{_free_port()}"
    env = scenario(tmp_path / "gpud.conf")
    state = ["--data-dir", str(tmp_path / "state")]
    up = [gpud, "up", "--listen-address", address, *state]
    bedlib.become_subreaper()  # adopt the daemon `gpud up` leaves, to reap it after `down`
    started = subprocess.run(up, capture_output=True, text=True, env=env, timeout=30)
    daemon = int((tmp_path / "state" / "gpud.pid").read_text())
    try:
        assert started.returncode == 0, started.stderr
        again = subprocess.run(up, capture_output=True, text=True, env=env, timeout=30)
        assert again.stdout.startswith("gpud already running")

        def gpud_sections() -> dict:
            return probe("gpud", gpud_installed=True, gpud_address=address)[0]

        healthy = gpud_sections()["gpud"]
        assert healthy["address"] == f"https://{address}"  # GPUd's default: self-signed TLS
        assert healthy["healthz"] == {"status": "ok", "version": "v1"}
        assert [s["health"] for s in healthy["states"]] == ["Healthy"]
        assert gpud_sections()["gpud_events"]["events"] == []
        # The scenario is read at every request, as GPUd reports what it sees now.
        Path(env["FAKE_NVML_SCENARIO"]).write_text(f"gpud.states={standins.GPUD_XID74}\n")
        result = judge("gpud_health", {"gpud": gpud_sections()["gpud"]}, host="n1")
        assert result.status == "FAIL"
        assert "XID 74 (NVLINK Error) detected on PCI:0000:04:00" in result.text
        assert "GPUd suggests REBOOT_SYSTEM" in result.text
    finally:
        down = subprocess.run([gpud, "down", *state], capture_output=True, text=True, timeout=30)
        os.waitpid(daemon, 0)
    assert down.stdout == "gpud stopped\n"
    assert not gpud_sections()["gpud"]["healthz"]


# ---------------------------------------------------------------- the mirror's files/


def test_tarballs_are_reproducible_and_published_with_checksums(built, tmp_path):
    again = standins.build_files(tmp_path)
    assert [p.read_bytes() for p in again] == [
        built["gpud"].read_bytes(),
        built["nccl-tests"].read_bytes(),
    ]
    repo = tmp_path / "mirror"
    names = mirror.add_files(repo, again)
    assert names == [p.name for p in again]
    check = subprocess.run(
        ["sha256sum", "-c", *(f"{n}.sha256" for n in names)],
        cwd=repo / mirror.FILES_DIR,
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_install_playbook_names_what_the_mirror_serves(built):
    """fleet's install step fetches the tarballs by the names build_files gives them."""
    text = json.dumps(fleet.playbook())
    for tarball in (built["gpud"], built["nccl-tests"]):
        assert f"files/{tarball.name}" in text
    assert f"/tmp/{fleet.GPUD_STEM}/gpud" in text
