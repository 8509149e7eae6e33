"""The fake libnvidia-ml.so.1: build it, and write the scenario it serves.

pynvml loads the library once per process, so each scenario runs in a fresh interpreter with
the environment from nvml_env(). Scenarios are YAML files in scenarios/: nested keys flatten
into the key=value lines fake_nvml.c reads (its header lists the keys and their defaults), and
`extends: <other scenario>` starts from another file. Lists are joined with commas; quote
"pid:mib" process entries, as YAML 1.1 reads an unquoted 1:20 as the number 80.

Without FAKE_NVML_SCENARIO the library reads /etc/fake-nvml/scenario.conf (DEFAULT_SCENARIO),
which is how the test bed's nodes get their scenario over SSH.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "fake_nvml.c"
SCENARIOS = HERE / "scenarios"
LIBRARY_NAME = "libnvidia-ml.so.1"  # the name pynvml passes to CDLL
DEFAULT_SCENARIO = "/etc/fake-nvml/scenario.conf"  # FAKE_NVML_DEFAULT_SCENARIO in fake_nvml.c


def build_library(
    cache_dir: Path, driver_version: str | None = None, cuda_version: int = 0
) -> Path:
    """Compile fake_nvml.c into cache_dir/lib/libnvidia-ml.so.1, again only when it changed.

    With `driver_version` (and `cuda_version`, e.g. 12060) the library is that driver release
    when the scenario does not say otherwise, as a driver package of that branch would be; it
    goes to cache_dir/lib-<driver_version>/.
    """
    flags = ["-shared", "-fPIC", "-O2", "-Wall", f"-Wl,-soname,{LIBRARY_NAME}"]
    lib_dir = Path(cache_dir) / "lib"
    if driver_version is not None:
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?", driver_version):
            raise ValueError(f"driver_version {driver_version!r} is not like 560.35.03")
        flags.append(f'-DFAKE_NVML_DRIVER_VERSION="{driver_version}"')
        lib_dir = lib_dir.with_name(f"lib-{driver_version}")
    if cuda_version:
        flags.append(f"-DFAKE_NVML_CUDA_VERSION={int(cuda_version)}")
    library, stamp = lib_dir / LIBRARY_NAME, lib_dir / f"{LIBRARY_NAME}.sha256"
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(flags).encode()).hexdigest()
    if library.exists() and stamp.exists() and stamp.read_text() == digest:
        return library
    lib_dir.mkdir(parents=True, exist_ok=True)
    partial = lib_dir / f".{LIBRARY_NAME}.{os.getpid()}"  # parallel builders must not collide
    gcc = subprocess.run(
        ["gcc", *flags, "-o", str(partial), str(SOURCE)],
        capture_output=True,
        text=True,
    )
    if gcc.returncode != 0:
        raise RuntimeError(f"building the fake NVML failed:\n{gcc.stderr}")
    partial.replace(library)
    stamp.write_text(digest)
    return library


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            value = _merge(merged[key], value)
        merged[key] = value
    return merged


def _string_keys(value: Any) -> Any:
    """YAML reads `gpu: {3: ...}` with int keys; scenarios compare and merge them as text."""
    if isinstance(value, dict):
        return {str(key): _string_keys(item) for key, item in value.items()}
    return value


def _resolve(scenario: dict) -> dict:
    scenario = _string_keys(scenario)
    parent = scenario.pop("extends", None)
    scenario.pop("description", None)
    return _merge(load_scenario(parent), scenario) if parent else scenario


def load_scenario(name: str) -> dict:
    """The named scenario as one nested dict, with its `extends` chain merged in."""
    with open(SCENARIOS / f"{name}.yml", encoding="utf-8") as file:
        return _resolve(yaml.safe_load(file) or {})


def _flatten(scenario: dict, prefix: str = "") -> list[str]:
    lines = []
    for key, value in scenario.items():
        if isinstance(value, dict):
            lines += _flatten(value, f"{prefix}{key}.")
        elif value is not None:
            if isinstance(value, bool):
                value = int(value)
            elif isinstance(value, list):
                value = ",".join(map(str, value))
            lines.append(f"{prefix}{key}={value}")
    return lines


def scenario_text(scenario: dict | str) -> str:
    """A scenario (a name or a dict, which may also `extend`) as the fake's key=value lines."""
    resolved = load_scenario(scenario) if isinstance(scenario, str) else _resolve(scenario)
    return "\n".join(_flatten(resolved)) + "\n"


def write_scenario(scenario: dict | str, path: Path) -> Path:
    """Write a scenario as the fake's key=value file."""
    Path(path).write_text(scenario_text(scenario), encoding="utf-8")
    return Path(path)


def nvml_env(lib_dir: Path, scenario_file: Path) -> dict[str, str]:
    """os.environ plus what makes pynvml load the fake and the fake serve scenario_file."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        part for part in (str(lib_dir), env.get("LD_LIBRARY_PATH")) if part
    )
    env["FAKE_NVML_SCENARIO"] = str(scenario_file)
    return env
