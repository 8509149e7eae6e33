"""Stand-in .deb packages of a GPU node's software, under the names NVIDIA's repository uses.

The bed's mirror then looks like the part of NVIDIA's CUDA repository (Ubuntu flavour) that a
GPU node installs from, so roles and the install helper name the packages a real node gets:

- ``nvidia-driver-<branch>-open`` (driver metapackage) -> ``libnvidia-compute-<branch>`` (the
  fake libnvidia-ml.so.1, compiled as that driver release), ``nvidia-utils-<branch>``
  (``nvidia-smi``: selftest/fakenvml/nvidia_smi.py, an NVML client like the real one) and
  ``nvidia-dkms-<branch>-open`` (the kernel modules: its maintainer scripts add them to, and
  remove them from, the bed node's module list, bedlib.NODE_MODULES, as the reboot after a
  driver install would load them), for the required branch 570 and the too-old 560, laid out
  as Ubuntu's nvidia-graphics-drivers-<branch>;
- ``python3-nvidia-ml-py``: the real nvidia-ml-py wheel from PyPI (the version this venv runs),
  unpacked for the node's python3;
- ``nvidia-fabricmanager-570``, ``datacenter-gpu-manager-4-cuda12``, ``libnccl2``,
  ``libnccl-dev``: name and version only, with a README saying so, until their stand-ins are
  written. Nothing in them pretends to work.

Debian's real numactl comes from mirror.DEBIAN_PACKAGES.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from selftest.fakenvml import LIBRARY_NAME, build_library

from . import bedlib, mirror

NVIDIA_SMI = Path(__file__).resolve().parent.parent / "fakenvml" / "nvidia_smi.py"
README = "/usr/share/doc/{name}/README.testbed"
STANDIN_NOTE = (
    "gpuhealth test bed stand-in for {name} {version}.\n\n"
    "It carries the name and version a GPU node gets from NVIDIA's CUDA repository so that\n"
    "roles and checks can be tested against a local mirror. {what}\n"
)


@dataclass(frozen=True)
class Driver:
    """One driver release of a branch, as NVIDIA ships it."""

    branch: str
    version: str  # what NVML reports
    cuda: int  # nvmlSystemGetCudaDriverVersion

    @property
    def deb_version(self) -> str:
        return f"{self.version}-0ubuntu1"

    @property
    def metapackage(self) -> str:
        return f"nvidia-driver-{self.branch}-open"


DRIVERS = {
    "570": Driver("570", "570.86.15", 12080),
    "560": Driver("560", "560.35.03", 12060),
}
FABRICMANAGER = ("nvidia-fabricmanager-570", "570.86.15-1")
DCGM = ("datacenter-gpu-manager-4-cuda12", "1:4.2.3-1")
NCCL_VERSION = "2.25.1-1+cuda12.8"


# /proc/modules lines of a loaded open-kernel driver (sizes from an HGX H100 node).
DRIVER_MODULES = (
    "nvidia_uvm 4931584 0 - Live 0x0000000000000000 (OE)\n"
    "nvidia_modeset 1368064 0 - Live 0x0000000000000000 (OE)\n"
    "nvidia 56717312 2 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (OE)\n"
)
MODULE_PATTERN = "^nvidia(_uvm|_modeset)? "
LOAD_MODULES = f"""#!/bin/sh
set -e
# gpuhealth test bed: "load" the driver's modules into the node's module list.
list={bedlib.NODE_MODULES}
if [ "$1" = configure ] && [ -w "$list" ] && ! grep -Eq '{MODULE_PATTERN}' "$list"; then
    printf '%s' '{DRIVER_MODULES}' >> "$list"
fi
"""
UNLOAD_MODULES = f"""#!/bin/sh
set -e
# gpuhealth test bed: "unload" the driver's modules (rewritten in place: it is bind-mounted).
list={bedlib.NODE_MODULES}
if [ "$1" = remove ] && [ -w "$list" ]; then
    kept=$(grep -Ev '{MODULE_PATTERN}' "$list" || true)
    printf '%s\\n' "$kept" > "$list"
fi
"""


def _host(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def driver_debs(out_dir: Path, cache_dir: Path, driver: Driver) -> list[Path]:
    """The four packages of one driver release; installing the metapackage pulls the rest."""
    arch, multiarch = _host("dpkg", "--print-architecture"), _host("gcc", "-print-multiarch")
    lib = build_library(cache_dir / "fakenvml", driver.version, driver.cuda)
    version, branch = driver.deb_version, driver.branch
    compute, utils = f"libnvidia-compute-{branch}", f"nvidia-utils-{branch}"
    dkms = f"nvidia-dkms-{branch}-open"
    others = [b for b in DRIVERS if b != branch]
    real_name = f"/usr/lib/{multiarch}/libnvidia-ml.so.{driver.version}"

    def note(name: str, what: str) -> dict[str, bytes]:
        text = STANDIN_NOTE.format(name=name, version=version, what=what)
        return {README.format(name=name): text.encode()}

    def switch(pattern: str) -> dict[str, str]:
        """One branch at a time, as Ubuntu's packages of different branches conflict."""
        names = ", ".join(pattern.format(b) for b in others)
        return {"Conflicts": names, "Replaces": names}

    return [
        mirror.build_deb(
            out_dir,
            compute,
            version,
            {
                real_name: lib,
                **note(compute, f"{LIBRARY_NAME} is the fake NVML (selftest/fakenvml)."),
            },
            arch=arch,
            symlinks={f"/usr/lib/{multiarch}/{LIBRARY_NAME}": Path(real_name).name},
            description="NVIDIA libcompute package (gpuhealth test bed stand-in: fake NVML)",
            control=switch("libnvidia-compute-{}"),
        ),
        mirror.build_deb(
            out_dir,
            utils,
            version,
            {
                "/usr/bin/nvidia-smi": NVIDIA_SMI,
                **note(utils, "nvidia-smi implements -q -x and -L, read from NVML."),
            },
            depends=[f"{compute} (>= {driver.version})", "python3"],
            arch=arch,
            description="NVIDIA driver support binaries (gpuhealth test bed stand-in)",
            control=switch("nvidia-utils-{}"),
        ),
        mirror.build_deb(
            out_dir,
            dkms,
            version,
            note(dkms, "Its maintainer scripts list the modules on a test bed node."),
            arch=arch,
            scripts={"postinst": LOAD_MODULES, "postrm": UNLOAD_MODULES},
            description="NVIDIA DKMS package (open kernel module; gpuhealth test bed stand-in)",
            control=switch("nvidia-dkms-{}-open"),
        ),
        mirror.build_deb(
            out_dir,
            driver.metapackage,
            version,
            note(driver.metapackage, "It only depends on the packages above."),
            depends=[f"{compute} (= {version})", f"{utils} (= {version})", f"{dkms} (= {version})"],
            arch=arch,
            description="NVIDIA driver (open kernel) metapackage (gpuhealth test bed stand-in)",
        ),
    ]


def nvidia_ml_py_deb(out_dir: Path, cache_dir: Path) -> Path:
    """python3-nvidia-ml-py from the PyPI wheel of the version this venv uses (cached)."""
    version = importlib.metadata.version("nvidia-ml-py")
    wheels = cache_dir / "wheels"
    found = sorted(wheels.glob(f"nvidia_ml_py-{version}-*.whl"))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
            + ["--only-binary=:all:", "--dest", str(wheels), f"nvidia-ml-py=={version}"],
            check=True,
            capture_output=True,
        )
        found = sorted(wheels.glob(f"nvidia_ml_py-{version}-*.whl"))
    files: dict[str, bytes] = {}
    with zipfile.ZipFile(found[0]) as wheel:
        for member in wheel.namelist():
            data = wheel.read(member)
            if member == "example.py":  # not a module to put on sys.path
                files["/usr/share/doc/python3-nvidia-ml-py/examples/example.py"] = data
            else:
                files[f"/usr/lib/python3/dist-packages/{member}"] = data
    return mirror.build_deb(
        out_dir,
        "python3-nvidia-ml-py",
        f"{version}-1",
        files,
        depends=["python3"],
        description="Python bindings to NVML (nvidia-ml-py wheel from PyPI)",
    )


def placeholder_debs(out_dir: Path) -> list[Path]:
    """Packages whose stand-ins come later: name, version, dependencies and a README only."""
    later = "No program or library is in it yet; its stand-in comes with the tests that use it."
    packages = [
        (*FABRICMANAGER, [], "NVIDIA fabric manager (name only)"),
        (*DCGM, [], "NVIDIA Datacenter GPU Manager 4 for CUDA 12 (name only)"),
        ("libnccl2", NCCL_VERSION, [], "NVIDIA NCCL runtime (name only)"),
        ("libnccl-dev", NCCL_VERSION, [f"libnccl2 (= {NCCL_VERSION})"], "NCCL headers (name only)"),
    ]
    debs = []
    for name, version, depends, description in packages:
        text = STANDIN_NOTE.format(name=name, version=version, what=later)
        debs.append(
            mirror.build_deb(
                out_dir,
                name,
                version,
                {README.format(name=name): text.encode()},
                depends=depends,
                description=f"{description}: gpuhealth test bed stand-in",
            )
        )
    return debs


def build_all(out_dir: Path, cache_dir: Path) -> list[Path]:
    """Every stand-in package, freshly built into out_dir (the wheel and libraries cached)."""
    debs = [deb for driver in DRIVERS.values() for deb in driver_debs(out_dir, cache_dir, driver)]
    return [*debs, nvidia_ml_py_deb(out_dir, cache_dir), *placeholder_debs(out_dir)]
