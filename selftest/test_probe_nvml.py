"""The probe's NVML collector against the fake libnvidia-ml.so.1, through the real nvidia-ml-py.

pynvml loads the library once per process, so every scenario runs collect() in a fresh
interpreter. The script also records which NVML symbols pynvml looked up.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuhealth.families.gpu.schema import GPU_KEYS
from selftest.fakenvml import SCENARIOS, SOURCE, build_library, nvml_env, write_scenario

CALL_TIMEOUT_S = 2.0
# The probe's NVML pass: the GPU family's, with the NVLink fabric family's read of each GPU
# (families/nvfabric/probe.py: GPU_READS), as gpuhealth.probe.main hands it over.
COLLECT = """
def collect(timeout, errors, window=0.0):
    from gpuhealth.families.gpu import nvml
    from gpuhealth.families.nvfabric import probe as nvfabric
    reads = [("nvfabric", read) for read in nvfabric.GPU_READS]
    return nvml.collect(timeout, errors, window, reads)
"""
SCRIPT = (
    COLLECT
    + """
import json, pynvml, time
symbols, lookup = set(), pynvml._nvmlGetFunctionPointer
def recording(name):
    symbols.add(name)
    return lookup(name)
pynvml._nvmlGetFunctionPointer = recording
{prelude}
errors = []
started = time.monotonic()
facts = collect({timeout}, errors, {window})
took_s = time.monotonic() - started
print(json.dumps({{"r": facts, "errors": errors, "symbols": sorted(symbols), "took_s": took_s}}))
"""
)
REQUIRED_SCENARIOS = (
    "healthy-h100x8",
    "ecc-uncorrectable-gpu3",
    "recovery-reset-gpu5",
    "missing-gpu7",
    "driver-560",
    "hot-gpu2",
    "rowremap-pending-gpu1",
    "nvml-hang",
    "no-driver",
    "gpu-lost-gpu3",
    "gpu-lost-after-handle-gpu5",
    "gpu-unlisted-bus5d",
)
QUIRKS = {
    "extends": "healthy-h100x8",
    # A library too old for these: the collector falls back to the older calls.
    "fn": {"nvmlDeviceGetTemperatureV": "ERROR:13", "nvmlDeviceGetGpuFabricInfoV": "ERROR:13"},
    "gpu": {
        0: {"serial": "NOT_SUPPORTED", "nvlink": {5: 0}},
        1: {"handle": "ERROR:15"},  # GPU is lost
        2: {
            "ecc": {"mode": 0},
            "remapped_rows": {"correctable": "NOT_SUPPORTED"},
            "retired_pages": {"single_bit": 3, "double_bit": 1, "pending": 1},
        },
        3: {"nvlink": {"count": 0}},  # a PCIe-only board
        4: {"processes": ["1:1024", "999999999:2048"]},
        5: {"power": {"draw_w": "ERROR:999"}, "vbios_version": "ERROR:26"},
        6: {"recovery_action": "ERROR:15"},
        7: {
            "ecc": {
                "volatile": {"sram_corrected": "NOT_SUPPORTED", "sram_uncorrected": "NOT_SUPPORTED"}
            }
        },
    },
}


def run_probe(
    lib: Path, scenario_file: Path, prelude: str = "", window_s: float = 0.0
) -> dict[str, Any]:
    """collect() in a fresh interpreter (after `prelude`, NVLink counters `window_s` apart):
    the facts ("r"), errors, NVML symbols looked up, collect()'s time and the whole run's."""
    script = SCRIPT.format(timeout=CALL_TIMEOUT_S, prelude=prelude, window=window_s)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=nvml_env(lib.parent, scenario_file),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return {**json.loads(proc.stdout), "elapsed_s": time.monotonic() - started}


@pytest.fixture(scope="session")
def probe(fake_nvml_lib, tmp_path_factory):
    """Run a named scenario (or QUIRKS) once per session."""
    results: dict[str, dict] = {}

    def run(name: str) -> dict[str, Any]:
        if name not in results:
            scenario_file = tmp_path_factory.mktemp("scenario") / f"{name}.txt"
            write_scenario(QUIRKS if name == "quirks" else name, scenario_file)
            results[name] = run_probe(fake_nvml_lib, scenario_file)
        return results[name]

    return run


def unexplained_nulls(obj: Any, path: str = "") -> list[str]:
    """Nulls without an `unavailable` entry (a probe bug per the schema), and the reverse."""
    found = []
    if isinstance(obj, dict):
        why = obj.get("unavailable", {})
        found += [f"{path}{key} (explained, not null)" for key in why if obj.get(key) is not None]
        for key, value in obj.items():
            if value is None and key not in why:
                found.append(f"{path}{key}")
            if key != "unavailable":
                found += unexplained_nulls(value, f"{path}{key}.")
    elif isinstance(obj, list):
        for index, item in enumerate(obj):
            found += unexplained_nulls(item, f"{path}{index}.")
    return found


def kind(obj: dict, key: str) -> str:
    assert obj[key] is None, f"{key} = {obj[key]!r}"
    return obj["unavailable"][key]["kind"]


ZERO_COUNTS = dict.fromkeys(
    (
        "corrected",
        "uncorrected",
        "sram_corrected",
        "sram_uncorrected",
        "dram_corrected",
        "dram_uncorrected",
    ),
    0,
) | {"unavailable": {}}


@pytest.mark.parametrize("name", REQUIRED_SCENARIOS)
def test_scenario_files_exist_and_explain_every_null(probe, name):
    assert (SCENARIOS / f"{name}.yml").is_file()
    result = probe(name)
    assert unexplained_nulls(result["r"]) == []


def test_healthy_node(probe):
    result = probe("healthy-h100x8")
    facts = result["r"]
    assert result["errors"] == []
    assert facts["driver"] == {
        "loaded": True,
        "version": "570.86.15",
        "cuda_driver_version": "12.8",
        "nvml_version": "12.570.86.15",
        "unavailable": {},
    }
    assert facts["gpu_count"] == 8
    assert [gpu["index"] for gpu in facts["gpus"]] == list(range(8))
    bus_ids = {gpu["pci_bus_id"] for gpu in facts["gpus"]}
    assert len(bus_ids) == 8
    assert all(re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", bus) for bus in bus_ids)
    assert len({gpu["uuid"] for gpu in facts["gpus"]}) == 8
    for gpu in facts["gpus"]:
        assert set(GPU_KEYS) | {"unavailable"} == set(gpu)
        assert gpu["name"] == "NVIDIA H100 80GB HBM3"
        assert gpu["pci_device_id"] == "0x233010DE"
        assert gpu["architecture"] == "Hopper"
        assert gpu["persistence_mode"] is True
        assert (gpu["memory_total_mib"], gpu["memory_used_mib"]) == (81559, 0)
        assert (
            gpu["temperature_c"],
            gpu["temp_tlimit_margin_c"],
            gpu["temp_slowdown_c"],
            gpu["temp_shutdown_c"],
            gpu["temp_max_operating_c"],
        ) == (40, 45, 87, 92, 85)
        assert gpu["ecc_mode"] == "enabled"
        assert gpu["ecc"] == {"volatile": ZERO_COUNTS, "aggregate": ZERO_COUNTS}
        assert kind(gpu, "retired_pages") == "not_supported"  # Hopper remaps rows instead
        assert gpu["remapped_rows"] == {
            "correctable": 0,
            "uncorrectable": 0,
            "pending": False,
            "failure": False,
        }
        assert gpu["clock_event_reasons"] == {"active": ["gpu_idle"], "mask": 1, "unavailable": {}}
        assert (gpu["power_draw_w"], gpu["power_limit_w"]) == (120.0, 700.0)
        assert gpu["pcie"] == {
            "gen_current": 5,
            "gen_max": 5,
            "width_current": 16,
            "width_max": 16,
            "replay_count": 0,
        }
        assert gpu["nvlink"] == [{"link": link, "up": True} for link in range(18)]
        assert gpu["recovery_action"] == 0
        assert gpu["processes"] == []
        assert gpu["lost"] is False
        assert list(gpu["unavailable"]) == ["platform", "retired_pages"]
        at = f"gpu={gpu['index']}"
        assert gpu["unavailable"]["platform"] == {  # as on an HGX board
            "kind": "not_supported",
            "detail": f"nvmlDeviceGetPlatformInfo({at}, v2): Not Supported; "
            f"nvmlDeviceGetModuleId({at}): Not Supported",
        }
        errors = gpu["nvlink_errors"]  # read once: collect() was given no window
        assert [entry["link"] for entry in errors["links"]] == list(range(18))
        once = "nvlink_error_window_s is 0: the counters were read once"
        assert errors["unavailable"] == {"window_s": {"kind": "absent", "detail": once}}
        assert errors["links"][17]["recovery"] == {
            "first": 0,
            "second": None,
            "unavailable": {"second": {"kind": "absent", "detail": once}},
        }


def test_uncorrectable_ecc_on_gpu3_only(probe):
    facts = probe("ecc-uncorrectable-gpu3")["r"]
    for gpu in facts["gpus"]:
        expected = 2 if gpu["index"] == 3 else 0
        for counter in ("volatile", "aggregate"):
            counts = gpu["ecc"][counter]
            assert (counts["uncorrected"], counts["dram_uncorrected"]) == (expected, expected)
            assert (counts["corrected"], counts["sram_uncorrected"]) == (0, 0)


def test_recovery_action_reset_on_gpu5(probe):
    facts = probe("recovery-reset-gpu5")["r"]
    assert [gpu["recovery_action"] for gpu in facts["gpus"]] == [0, 0, 0, 0, 0, 1, 0, 0]


def test_missing_gpu(probe):
    facts = probe("missing-gpu7")["r"]
    assert facts["gpu_count"] == 7
    assert [gpu["index"] for gpu in facts["gpus"]] == list(range(7))


def test_driver_before_r570_has_no_recovery_action(probe):
    result = probe("driver-560")
    facts = result["r"]
    assert (facts["driver"]["version"], facts["driver"]["cuda_driver_version"]) == (
        "560.35.03",
        "12.6",
    )
    for gpu in facts["gpus"]:
        assert kind(gpu, "recovery_action") == "not_supported"  # never a healthy-looking 0
        assert "r570" in gpu["unavailable"]["recovery_action"]["detail"]
    assert result["errors"] == []  # not supported is not a failure of the probe


def test_hot_gpu2(probe):
    facts = probe("hot-gpu2")["r"]
    hot = facts["gpus"][2]
    assert (hot["temperature_c"], hot["temp_tlimit_margin_c"], hot["temp_slowdown_c"]) == (
        91,
        -6,
        87,
    )
    assert hot["clock_event_reasons"] == {
        "active": ["sw_thermal_slowdown", "hw_thermal_slowdown"],
        "mask": 0x60,
        "unavailable": {},
    }
    assert {gpu["temperature_c"] for gpu in facts["gpus"] if gpu["index"] != 2} == {40}


def test_row_remap_pending_on_gpu1(probe):
    facts = probe("rowremap-pending-gpu1")["r"]
    assert facts["gpus"][1]["remapped_rows"] == {
        "correctable": 0,
        "uncorrectable": 1,
        "pending": True,
        "failure": False,
    }
    assert not any(gpu["remapped_rows"]["pending"] for gpu in facts["gpus"] if gpu["index"] != 1)


def test_hung_call_costs_one_timeout(probe):
    result = probe("nvml-hang")
    assert result["elapsed_s"] < CALL_TIMEOUT_S + 5
    hung = "nvmlDeviceGetTemperatureV(gpu=4)"
    assert result["errors"] == [
        {"probe": "nvml", "call": hung, "error": f"timed out after {CALL_TIMEOUT_S:g} s"}
    ]
    gpus = result["r"]["gpus"]
    assert [gpu["temperature_c"] for gpu in gpus[:4]] == [40] * 4
    gpu4 = gpus[4]
    assert gpu4["name"] == "NVIDIA H100 80GB HBM3"  # read before the hang
    assert kind(gpu4, "temperature_c") == "timeout"
    assert gpu4["unavailable"]["temperature_c"]["detail"] == f"{hung}: timed out after 2 s"
    for gpu in gpus[4:]:
        later = [key for key in GPU_KEYS if key in gpu["unavailable"] and key != "temperature_c"]
        assert later, gpu["index"]
        for key in later:
            assert kind(gpu, key) == "timeout"
            assert hung in gpu["unavailable"][key]["detail"]
    assert [gpu["index"] for gpu in gpus] == list(range(8))
    assert all(kind(gpu, key) == "timeout" for gpu in gpus[5:] for key in GPU_KEYS[1:])
    assert [gpu["lost"] for gpu in gpus[:4]] == [False] * 4  # answered before the hang
    assert gpu4["unavailable"]["lost"] == {  # not every call answered: lost or not, unknown
        "kind": "timeout",
        "detail": f"NVML hung at {hung} (no answer within 2 s)",
    }


def test_a_lost_handle_names_the_gpu_lost(probe):
    result = probe("gpu-lost-gpu3")
    gpus = result["r"]["gpus"]
    assert result["r"]["gpu_count"] == 8
    assert gpus[3]["lost"] == {"call": "nvmlDeviceGetHandleByIndex(gpu=3)", "error": "GPU is lost"}
    assert "lost" not in gpus[3]["unavailable"]
    assert all(kind(gpus[3], key) == "error" for key in GPU_KEYS[1:] if key != "lost")
    assert [gpu["lost"] for gpu in gpus if gpu["index"] != 3] == [False] * 7


def test_a_gpu_lost_after_its_handle_is_named_by_its_first_lost_call(probe):
    result = probe("gpu-lost-after-handle-gpu5")
    gpus = result["r"]["gpus"]
    assert gpus[5]["lost"] == {"call": "nvmlDeviceGetName(gpu=5)", "error": "GPU is lost"}
    assert gpus[5]["unavailable"]["recovery_action"]["detail"].endswith("GPU is lost")
    assert result["errors"][0]["call"] == "nvmlDeviceGetName(gpu=5)"
    assert all("(gpu=5" in error["call"] for error in result["errors"])  # no other GPU's
    assert [gpu["lost"] for gpu in gpus if gpu["index"] != 5] == [False] * 7


def test_gpus_lost_between_the_nvlink_reads_are_named_lost(fake_nvml_lib, tmp_path):
    """Every GPU answered the first pass; during the NVLink window they fall off the bus, so
    the second read of their error counters answers GPU_IS_LOST."""
    prelude = """
import time
window = {"over": False}
sleep, counter = time.sleep, pynvml.nvmlDeviceGetNvLinkErrorCounter
def waited(seconds):
    sleep(seconds)
    window["over"] = True
def lost_after_the_window(*args):
    if window["over"]:
        raise pynvml.NVMLError(15)
    return counter(*args)
time.sleep, pynvml.nvmlDeviceGetNvLinkErrorCounter = waited, lost_after_the_window
"""
    scenario = write_scenario("healthy-h100x8", tmp_path / "healthy.txt")
    gpus = run_probe(fake_nvml_lib, scenario, prelude, window_s=0.1)["r"]["gpus"]
    for gpu in gpus:
        call = f"nvmlDeviceGetNvLinkErrorCounter(gpu={gpu['index']}, link=0, DL_REPLAY)"
        assert gpu["lost"] == {"call": call, "error": "GPU is lost"}


def test_driver_not_loaded(probe):
    result = probe("no-driver")
    assert result["r"] is None
    assert result["errors"] == [{"probe": "nvml", "call": "nvmlInit", "error": "Driver Not Loaded"}]


def test_no_scenario_file_means_driver_not_loaded(fake_nvml_lib, tmp_path):
    result = run_probe(fake_nvml_lib, tmp_path / "absent.txt")
    assert result["r"] is None
    assert "driver not loaded" in result["errors"][0]["error"].lower()


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None,
    reason="a real libnvidia-ml is installed here",
)
def test_no_library(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(timeout=CALL_TIMEOUT_S, prelude="", window=0.0)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    result = json.loads(proc.stdout)
    assert result["r"] is None
    assert result["errors"] == [
        {"probe": "nvml", "call": "nvmlInit", "error": "NVML Shared Library Not Found"}
    ]


def test_a_failing_read_of_another_family_is_its_own_error(fake_nvml_lib, tmp_path):
    """A family's read of each GPU in the GPU family's pass (GPU_READS) that raises is that
    family's error: the GPU records are read whole all the same."""
    script = (
        "import json\n"
        "from gpuhealth.families.gpu import nvml\n"
        "def broken(session, gpu, handle):\n"
        "    raise RuntimeError('a bug')\n"
        "e = []\n"
        "facts = nvml.collect(2.0, e, 0.0, [('broken', broken)])\n"
        "print(json.dumps({'r': facts, 'errors': e}))\n"
    )
    scenario = write_scenario("healthy-h100x8", tmp_path / "healthy.txt")
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=nvml_env(fake_nvml_lib.parent, scenario),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["errors"] == [{"probe": "broken", "error": "RuntimeError: a bug"}] * 8
    gpus = result["r"]["gpus"]
    assert [(g["lost"], g["recovery_action"]) for g in gpus] == [(False, 0)] * 8
    assert all(g["serial"] and g["temperature_c"] is not None for g in gpus)


def test_without_pynvml_collect_returns_none(fake_nvml_lib, tmp_path):
    (tmp_path / "pynvml.py").write_text("raise ImportError('No module named pynvml (test)')\n")
    script = COLLECT + "import json; e = []; print(json.dumps({'r': collect(2.0, e), 'errors': e}))"
    scenario = write_scenario("healthy-h100x8", tmp_path / "healthy.txt")
    proc = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**nvml_env(fake_nvml_lib.parent, scenario), "PYTHONPATH": str(tmp_path)},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {
        "r": None,
        "errors": [
            {
                "probe": "nvml",
                "call": "import pynvml",
                "error": "ImportError: No module named pynvml (test)",
            }
        ],
    }


def test_older_nvidia_ml_py(fake_nvml_lib, tmp_path):
    """A pynvml without the field 230 name and without nvmlDeviceGetTemperatureV still works."""
    scenario = write_scenario("recovery-reset-gpu5", tmp_path / "reset.txt")
    result = run_probe(
        fake_nvml_lib,
        scenario,
        prelude=(
            "del pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, pynvml.nvmlDeviceGetTemperatureV"
        ),
    )
    gpus = result["r"]["gpus"]
    assert [gpu["recovery_action"] for gpu in gpus] == [0, 0, 0, 0, 0, 1, 0, 0]
    assert {gpu["temperature_c"] for gpu in gpus} == {40}
    assert "nvmlDeviceGetTemperatureV" not in result["symbols"]
    assert result["errors"] == []


def test_not_supported_is_null_never_zero(probe):
    result = probe("quirks")
    gpus = result["r"]["gpus"]
    assert kind(gpus[0], "serial") == "not_supported"
    assert gpus[0]["unavailable"]["serial"]["detail"] == "nvmlDeviceGetSerial(gpu=0): Not Supported"
    assert gpus[3]["nvlink"] is None and kind(gpus[3], "nvlink") == "not_supported"
    assert kind(gpus[2], "remapped_rows") == "not_supported"
    volatile = gpus[7]["ecc"]["volatile"]
    assert (volatile["sram_corrected"], volatile["corrected"]) == (None, 0)
    assert volatile["unavailable"]["sram_uncorrected"]["kind"] == "not_supported"
    assert not any(error["call"].startswith("nvmlDeviceGetSerial") for error in result["errors"])
    assert unexplained_nulls(result["r"]) == []


def test_quirks(probe):
    result = probe("quirks")
    gpus = result["r"]["gpus"]
    assert [gpu["temperature_c"] for gpu in gpus if gpu["index"] != 1] == [40] * 7  # fallback
    assert gpus[0]["nvlink"][5] == {"link": 5, "up": False}
    lost = gpus[1]
    assert all(kind(lost, key) == "error" for key in GPU_KEYS[1:] if key != "lost")
    assert "GPU is lost" in lost["unavailable"]["uuid"]["detail"]
    assert lost["lost"] == {"call": "nvmlDeviceGetHandleByIndex(gpu=1)", "error": "GPU is lost"}
    assert gpus[6]["lost"] == {  # a field value's own nvmlReturn says so too
        "call": "nvmlDeviceGetFieldValues(gpu=6, field=230)",
        "error": "nvmlReturn=15 (NVMLError_GpuIsLost), valueType=1",
    }
    assert (gpus[2]["ecc_mode"], kind(gpus[2], "ecc")) == ("disabled", "not_supported")
    assert gpus[2]["retired_pages"] == {"single_bit": 3, "double_bit": 1, "pending": True}
    assert gpus[4]["processes"][0]["pid"] == 1
    assert gpus[4]["processes"][0]["used_memory_mib"] == 1024
    assert gpus[4]["processes"][0]["name"] == Path("/proc/1/comm").read_text().strip()
    gone = gpus[4]["processes"][1]
    assert (gone["pid"], gone["name"], gone["used_memory_mib"]) == (999999999, None, 2048)
    assert kind(gpus[5], "power_draw_w") == "error"
    assert kind(gpus[5], "vbios_version") == "error"
    assert kind(gpus[6], "recovery_action") == "error"
    assert "nvmlReturn=15" in gpus[6]["unavailable"]["recovery_action"]["detail"]
    assert result["errors"] == [
        {"probe": "nvml", "call": "nvmlDeviceGetHandleByIndex(gpu=1)", "error": "GPU is lost"},
        {"probe": "nvml", "call": "nvmlDeviceGetVbiosVersion(gpu=5)", "error": "Deprecated"},
        {"probe": "nvml", "call": "nvmlDeviceGetPowerUsage(gpu=5)", "error": "Unknown Error"},
        {
            "probe": "nvml",
            "call": "nvmlDeviceGetFieldValues(gpu=6, field=230)",
            "error": "nvmlReturn=15 (NVMLError_GpuIsLost), valueType=1",
        },
    ]


def test_fake_exports_exactly_the_symbols_the_collector_uses(probe, fake_nvml_lib):
    exported = subprocess.run(
        ["nm", "-D", "--defined-only", str(fake_nvml_lib)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    exported_names = {line.split()[-1] for line in exported.splitlines() if " T " in line}
    used = set(probe("healthy-h100x8")["symbols"]) | set(probe("quirks")["symbols"])
    assert exported_names == used


def test_fake_compiles_without_warnings(tmp_path):
    proc = subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-o",
            str(tmp_path / "lib.so"),
            str(SOURCE),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_build_library_rebuilds_only_when_the_source_changes(tmp_path):
    library = build_library(tmp_path)
    assert library == tmp_path / "lib" / "libnvidia-ml.so.1"
    built = library.stat().st_mtime_ns
    assert build_library(tmp_path).stat().st_mtime_ns == built
    (library.parent / "libnvidia-ml.so.1.sha256").write_text("stale")
    assert build_library(tmp_path).stat().st_mtime_ns != built


def test_scenarios_flatten_with_extends(tmp_path):
    text = write_scenario("driver-560", tmp_path / "s.txt").read_text().splitlines()
    assert "driver_version=560.35.03" in text
    assert "gpu.all.recovery_action=NOT_SUPPORTED" in text
    assert "gpu.count=8" in text  # from healthy-h100x8
    lines = (
        write_scenario(
            {"extends": "missing-gpu7", "gpu": {3: {"nvlink": {"count": 0}}}}, tmp_path / "d.txt"
        )
        .read_text()
        .splitlines()
    )
    assert "gpu.count=7" in lines and "gpu.3.nvlink.count=0" in lines
