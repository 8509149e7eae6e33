"""`gpuhealth bundle` under the fake NVML with the fake nvidia-smi on PATH (both serve one
scenario, so the probe's two GPU paths must agree), `gpuhealth triage BUNDLE`, the two-path
comparison and the redaction of secrets."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from functools import partial
from http.server import HTTPServer, SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.bundle import FACTS, FACTS_SMI, MANIFEST, UNAME, VERDICT, opened
from gpuhealth.documents import validated
from gpuhealth.evidence import facts_from_file
from gpuhealth.families.fabric import sysfs
from gpuhealth.families.gpu.compare import compare
from gpuhealth.probe import node
from gpuhealth.redact import MASK, redact
from selftest.fakenvml import nvml_env, write_scenario

GPUHEALTH = str(Path(sys.executable).with_name("gpuhealth"))
HERE = Path(__file__).parent
DATA = HERE / "data"
SMI_DATA = DATA / "nvidia-smi"
STAND_IN = HERE / "fakenvml" / "nvidia_smi.py"
H100 = ("--profile", "h100-sxm", "--expected-gpus", "8")
# nvidia-smi's forms the stand-in does not print, from real samples.
SMI_SAMPLES = {
    "-q": SMI_DATA / "gpud_h100x8_535.161.08_query.txt",
    "": SMI_DATA / "table_h100x8_550.90.07_gpud.txt",
    "topo -m": DATA / "topology" / "sglang30401_h100x8_topo_m.txt",
    "nvlink -s": SMI_DATA / "nvlink-s_h100_elided_stas00-ml-engineering.txt",
    "nvlink -e": SMI_DATA / "nvlink-e_h100_elided_stas00-ml-engineering.txt",
}
LOADED = "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.86.15  Fri Jan 10 00:00:00 UTC 2025"
KERNEL_TOOLS = {
    "journalctl": f"echo '2025-01-20T10:00:00+0000 gpu-node-1 kernel: {LOADED}'\n",
    "dmesg": f"echo '2025-01-20T10:00:00,000000+00:00 {LOADED}'\n",
}


def tool(folder: Path, name: str, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("#!/bin/sh\n" + body)
    (folder / name).chmod(0o755)


def smi_tool(folder: Path) -> None:
    """nvidia-smi: the stand-in for the forms it serves (the fake NVML's scenario), samples
    for the rest."""
    cases = "".join(f'  "{args}") exec cat {path} ;;\n' for args, path in SMI_SAMPLES.items())
    tool(
        folder,
        "nvidia-smi",
        f'case "$*" in\n{cases}  *) exec {sys.executable} {STAND_IN} "$@" ;;\nesac\n',
    )


def bin_dir(tmp: Path, gpus: bool = True) -> Path:
    folder = tmp / "bin"
    for name, body in KERNEL_TOOLS.items():
        tool(folder, name, body)
    if gpus:
        smi_tool(folder)
    return folder


def env_for(tmp: Path, lib: Path | None, scenario: str | None, folder: Path) -> dict[str, str]:
    env = {"PATH": f"{folder}:/usr/bin:/bin", "HOME": str(tmp), "LANG": "C.UTF-8"}
    if lib is not None and scenario is not None:
        conf = write_scenario(scenario, tmp / f"{scenario}.conf")
        nvml = nvml_env(lib.parent, conf)
        env.update(LD_LIBRARY_PATH=nvml["LD_LIBRARY_PATH"], FAKE_NVML_SCENARIO=str(conf))
    return env


def gpuhealth(env: dict[str, str], *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [GPUHEALTH, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {i.name: tar.extractfile(i).read() for i in tar if i.isfile()}  # type: ignore[union-attr]


def triage_json(env: dict[str, str], path: Path, *args: str) -> dict[str, Any]:
    done = gpuhealth(env, "triage", str(path), "--json", *args)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("scenario", ["healthy-h100x8", "ecc-gpu3-recovery-gpu5"])
def test_a_bundle_holds_every_output_and_triage_gives_node_checks_verdict(
    fake_nvml_lib, tmp_path, scenario
):
    env = env_for(tmp_path, fake_nvml_lib, scenario, bin_dir(tmp_path))
    out = tmp_path / "node.tar.gz"
    done = gpuhealth(env, "bundle", "--host", "gpu-node-1", *H100, "-o", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    found = members(out)
    manifest = json.loads(found[MANIFEST])
    assert manifest["format"] == "gpuhealth-bundle" and manifest["host"] == "gpu-node-1"
    expected = {
        MANIFEST,
        FACTS,
        FACTS_SMI,
        VERDICT,
        UNAME,
        "etc/os-release",
        "commands/journalctl-k.txt",
        "commands/dmesg.txt",
        "commands/nvidia-smi-q-x.xml",
        "commands/nvidia-smi-q.txt",
        "commands/nvidia-smi.txt",
        "commands/nvidia-smi-topo-m.txt",
        "commands/nvidia-smi-nvlink-s.txt",
        "commands/nvidia-smi-nvlink-e.txt",
    }
    assert expected <= set(found)
    entries = {e["member"]: e for e in manifest["members"]}
    assert set(entries) == set(found) - {MANIFEST}
    assert entries["commands/nvidia-smi-q-x.xml"]["command"] == "nvidia-smi -q -x"
    assert all(e["exit_status"] == 0 for m, e in entries.items() if m.startswith("commands/"))
    assert not any(e["cut"] or e["timed_out"] for e in entries.values())
    assert {"ibstat", "fi_info -p efa", "dcgmi health -c -j"} <= {
        e["command"] for e in manifest["not_collected"]
    }
    facts, smi = json.loads(found[FACTS]), json.loads(found[FACTS_SMI])
    assert (facts["source"], smi["source"]) == ("nvml", "nvidia-smi")
    assert compare(facts, smi).disagreements == []

    node_check = gpuhealth(env, "node-check", "--host", "gpu-node-1", *H100, "--json")
    said = json.loads(node_check.stdout)
    assert json.loads(found[VERDICT])["verdict"] == said["verdict"] == manifest["verdict"]
    judged = triage_json(env, out, *H100)
    assert judged["verdict"] == said["verdict"]
    assert judged["nodes"]["gpu-node-1"]["verdict"] == said["verdict"]
    failed = {(f["check"], f["gpu"]) for f in judged["findings"] if f["status"] == "FAIL"}
    assert failed == {(f["check"], f["gpu"]) for f in said["failed_checks"]}
    paths = [f for f in judged["findings"] if f["check"] == "probe_paths"]
    assert [f["status"] for f in paths] == ["PASS"]
    assert "NVML and nvidia-smi agree on" in paths[0]["message"]


class _States(SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def gpud(tmp_path):
    """A GPUd stand-in on loopback answering /v1/states with a real sample."""
    served = tmp_path / "gpud" / "v1"
    served.mkdir(parents=True)
    shutil.copy(DATA / "gpud" / "gpud_docs_v1_states_plugin_only_healthy.json", served / "states")
    server = HTTPServer(("127.0.0.1", 0), partial(_States, directory=str(tmp_path / "gpud")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_every_member_is_read_by_a_parser(fake_nvml_lib, tmp_path, gpud):
    """With every tool there: each member of the archive is read by one of gpuhealth's readers
    (a bundle is what the project turns into fixtures)."""
    root = tmp_path / "root"
    shutil.copytree(DATA / "efa" / "h100-ib-root", root)
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "os-release").write_text('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\n')
    (root / "proc" / "driver" / "nvidia").mkdir(parents=True)
    (root / "proc" / "driver" / "nvidia" / "version").write_text(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Fri Jan 10 00:00:00 UTC 2025\n"
    )
    folder = bin_dir(tmp_path)
    tool(folder, "ibstat", f"cat {DATA / 'efa' / 'gpud_ibstat_47.0_h100_all_active.txt'}\n")
    tool(
        folder,
        "fi_info",
        f"cat {DATA / 'efa' / 'awesome-networking_p4de_fi_info_efa_rdm_4dev.txt'}\n",
    )
    imex = DATA / "imex" / "imex-ctl-N-p6e-gb200-18node-awsparallelcluster.txt"
    tool(folder, "nvidia-imex-ctl", f"cat {imex}\n")
    tool(folder, "dcgmi", f"cat {DATA / 'dcgm' / 'vc_dcgmi_health_check.json'}\n")
    inventory = tmp_path / "inventory.yml"
    host_vars = f"gpu_profile: h100-sxm\n      gpud_address: {gpud}\n"
    inventory.write_text(f"all:\n  hosts:\n    gpu-node-1:\n      {host_vars}")
    env = env_for(tmp_path, fake_nvml_lib, "healthy-h100x8", folder)
    out = tmp_path / "all.tar.gz"
    done = gpuhealth(
        env, "bundle", "--inventory", str(inventory), "--host", "gpu-node-1",
        "--root", str(root), "-o", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    unpacked = tmp_path / "unpacked"
    with tarfile.open(out, "r:gz") as tar:
        tar.extractall(unpacked, filter="data")
    names = set(members(out))
    read: set[str] = set()

    manifest = json.loads((unpacked / MANIFEST).read_text())
    assert {e["member"] for e in manifest["members"]} == names - {MANIFEST}
    read.add(MANIFEST)
    for name in (FACTS, FACTS_SMI):
        validated(json.loads((unpacked / name).read_text()), name)
        read.add(name)
    assert json.loads((unpacked / VERDICT).read_text())["verdict"] in ("PASS", "WARN", "FAIL")
    read.add(VERDICT)
    assert node.host_info(str(unpacked))["os"] == "Ubuntu 22.04.4 LTS"
    assert node.proc_driver_version(str(unpacked)) == "570.86.15"
    read |= {"etc/os-release", "proc/driver/nvidia/version"}
    devices, problems = sysfs.read_devices(str(unpacked / "sys" / "class" / "infiniband"))
    assert devices and not problems
    assert all(p["state"] == "ACTIVE" for d in devices for p in d["ports"])
    read |= {n for n in names if n.startswith("sys/class/infiniband/")}
    notes = opened([out], None).notes  # type: ignore[union-attr]
    assert "kernel " in notes[0] and "kernel unknown" not in notes[0]
    read.add(UNAME)
    kinds = {
        "commands/nvidia-smi-q-x.xml": "nvidia-smi -q -x",
        "commands/nvidia-smi-q.txt": "nvidia-smi -q",
        "commands/nvidia-smi.txt": "nvidia-smi",
        "commands/nvidia-smi-topo-m.txt": "nvidia-smi topo -m",
        "commands/nvidia-smi-nvlink-s.txt": "nvidia-smi nvlink -s / -e",
        "commands/nvidia-smi-nvlink-e.txt": "nvidia-smi nvlink -s / -e",
        "commands/journalctl-k.txt": "journalctl -k -o short-iso",
        "commands/dmesg.txt": "dmesg --time-format=iso",
        "commands/ibstat.txt": "ibstat",
        "commands/fi_info-p-efa.txt": "fi_info",
        "commands/nvidia-imex-ctl-N.txt": "nvidia-imex-ctl -N",
        "commands/dcgmi-health-c-j.json": "dcgmi health -c -j",
        "gpud/v1-states.json": "GPUd /v1/states",
    }
    for name, kind in kinds.items():
        assert facts_from_file(unpacked / name)[0].name == kind, name
        read.add(name)
    assert names - read == set()


def test_a_hung_tool_is_cut_at_its_deadline_and_secrets_never_enter_the_archive(tmp_path):
    """No GPU here (no fake NVML, no nvidia-smi): the bundle is still written, with a clear
    verdict; ibstat hangs after printing secrets, and is killed at --tool-timeout."""
    folder = bin_dir(tmp_path, gpus=False)
    tool(
        folder,
        "ibstat",
        "echo 'CA mlx5_0 launcher --token=sekrit password=sekrit'\n"
        "echo 'AWS_SECRET_ACCESS_KEY=sekrit Authorization: Bearer sekritsekrit'\n"
        "exec sleep 600\n",
    )
    env = env_for(tmp_path, None, None, folder)
    env["HF_TOKEN"] = "sekrit"  # the environment is never read
    out = tmp_path / "gpuless.tar.gz"
    done = gpuhealth(
        env, "bundle", "--expected-gpus", "8", "--tool-timeout", "2", "-o", str(out), timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    raw = out.read_bytes()
    assert b"sekrit" not in raw and b"sekrit" not in gzip.decompress(raw)
    found = members(out)
    manifest = json.loads(found[MANIFEST])
    entry = next(e for e in manifest["members"] if e["command"] == "ibstat")
    assert entry["timed_out"] and entry["exit_status"] is None
    assert "deadline" in entry["error"]
    assert entry["duration_s"] < 10
    assert found["commands/ibstat.txt"].startswith(b"CA mlx5_0 launcher --token=" + MASK.encode())
    assert sum(entry["redacted"].values()) == 4
    assert manifest["redacted"]["total"] >= 4
    assert "nvidia-smi -q -x" in {e["command"] for e in manifest["not_collected"]}
    facts = json.loads(found[FACTS])
    assert facts["source"] == "none"
    said = json.loads(found[VERDICT])
    assert said["verdict"] == "FAIL" and "gpu_count" in {c["check"] for c in said["failed_checks"]}
    judged = triage_json(env, out, "--expected-gpus", "8")
    assert judged["verdict"] == said["verdict"]
    paths = [f for f in judged["findings"] if f["check"] == "probe_paths"]
    assert [f["status"] for f in paths] == ["SKIP"]


def test_the_whole_bundle_stops_at_its_deadline(tmp_path):
    """A bundle deadline shorter than a hung tool: what is left is listed, not run."""
    folder = bin_dir(tmp_path, gpus=False)
    tool(folder, "ibstat", "exec sleep 600\n")
    out = tmp_path / "short.tar.gz"
    done = gpuhealth(
        env_for(tmp_path, None, None, folder), "bundle", "--timeout", "3", "-o", str(out)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = json.loads(members(out)[MANIFEST])
    assert manifest["deadline_reached"] and manifest["duration_s"] < 15
    assert any("deadline" in e["reason"] for e in manifest["not_collected"])


def test_triage_refuses_a_bundle_mixed_with_other_files(tmp_path):
    out = tmp_path / "b.tar.gz"
    folder = bin_dir(tmp_path, gpus=False)
    env = env_for(tmp_path, None, None, folder)
    assert gpuhealth(env, "bundle", "-o", str(out)).returncode == 0
    done = gpuhealth(env, "triage", "--node", "n1", str(out), str(SMI_SAMPLES["-q"]))
    assert done.returncode == 2 and "judged on its own" in done.stderr


# --------------------------------------------------------------------------- the comparison


def gpu(index: int, **values: Any) -> dict[str, Any]:
    record = {
        "index": index,
        "pci_bus_id": f"00000000:{0x19 + index:02X}:00.0",
        "uuid": f"GPU-{index}",
        "ecc": {"volatile": {"uncorrected": 0, "corrected": 0, "unavailable": {}}},
        "temperature_c": 40,
        "power_draw_w": 70.0,
        "power_limit_w": 700.0,
        "nvlink": [{"link": 0, "up": True}],
        "unavailable": {},
    }
    record.update(values)
    return record


def doc(source: str, gpus: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {
        "source": source,
        "driver": {"version": "570.86.15", "cuda_driver_version": "12.8"},
        "gpu_count": len(gpus),
        "gpus": gpus,
        **top,
    }


def test_compare_names_each_disagreement_as_nvml_against_nvidia_smi():
    nvml = doc("nvml", [gpu(0), gpu(3, ecc={"volatile": {"uncorrected": 2, "corrected": 0}})])
    smi = doc("nvidia-smi", [gpu(3), gpu(0, nvlink=[{"link": 0, "up": False}])])
    result = compare(nvml, smi)
    assert [d.text() for d in result.disagreements] == [
        "gpu0 nvlink.0.up: NVML True, nvidia-smi False",
        "gpu3 ecc.volatile.uncorrected: NVML 2, nvidia-smi 0",
    ]
    assert result.gpus == 2


def test_compare_unknown_on_either_side_is_no_disagreement_and_one_sided_fields_listed_once():
    nvml = doc(
        "nvml",
        [gpu(0, serial=None, lost=False, nvlink_errors={"links": [{"link": 0, "replay": 1}]})],
    )
    smi = doc(
        "nvidia-smi",
        [gpu(0, serial="1650", lost=None, nvlink=[{"link": 0, "up": True, "speed_gbps": 26.5}])],
    )
    smi["driver"]["version"] = None
    result = compare(nvml, smi)
    assert result.disagreements == []
    assert result.not_compared == [
        "driver.version (NVML only)",
        "lost (NVML only)",
        "nvlink_errors (NVML only)",
        "nvlink.*.speed_gbps (nvidia-smi only)",
        "serial (nvidia-smi only)",
    ]


def test_compare_moving_numbers_by_tolerance_or_not_at_all():
    nvml = doc("nvml", [gpu(0, temperature_c=40, power_draw_w=70.0, power_limit_w=700.0)])
    close = doc("nvidia-smi", [gpu(0, temperature_c=44, power_draw_w=350.0, power_limit_w=700.004)])
    assert compare(nvml, close).disagreements == []
    far = doc("nvidia-smi", [gpu(0, temperature_c=52, power_limit_w=650.0)])
    assert [d.field for d in compare(nvml, far).disagreements] == ["power_limit_w", "temperature_c"]


def test_compare_a_gpu_only_one_path_lists_is_a_disagreement():
    result = compare(doc("nvml", [gpu(0), gpu(1)]), doc("nvidia-smi", [gpu(0)]))
    assert [d.text() for d in result.disagreements] == [
        "gpu1 listed: NVML '00000000:1A:00.0', nvidia-smi not listed",
        "gpu_count: NVML 2, nvidia-smi 1",
    ]


# --------------------------------------------------------------------------- redaction


def test_redaction_masks_values_keeps_keys_and_documents_well_formed():
    text = json.dumps(
        {
            "name": "python train.py --token=sekrit --api-key sekrit",
            "password": 'se"krit',
            "tokens": 5,
        }
    )
    masked, counts = redact(text)
    assert "sekrit" not in masked and "krit" not in masked
    assert json.loads(masked)["tokens"] == 5 and "--token=[REDACTED]" in masked
    assert counts == {"secret option": 2, "secret json value": 1}
    xml, _ = redact("<process_name>run --password=hunter2</process_name>")
    assert xml == "<process_name>run --password=[REDACTED]</process_name>"
    for line in ("non-token words stay", "Basic Input/Output System", "Xid 79, pid=123"):
        assert redact(line) == (line, {})


@pytest.mark.parametrize(
    "line",
    [
        "token" * 40_000,
        "-" + "token" * 40_000,
        '"' + "token" * 40_000,
        "a." * 100_000,
        "eyJ-" * 50_000,
        "-----BEGIN PRIVATE KEY-----" * 7_407,
    ],
    ids=["assignment", "option", "json", "url", "jwt", "private-key"],
)
def test_redaction_is_linear_in_the_line_s_length(line):
    """Found by review: unbounded runs around a secret word, a scheme or a JWT's first part
    rescanned the rest of the line from every start (24-122 s on these 200,000 characters)."""
    started = time.monotonic()
    assert redact(line)[0] == line  # nothing there is a secret
    assert time.monotonic() - started < 1.0
