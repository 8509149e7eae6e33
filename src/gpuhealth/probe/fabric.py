"""The `fabric` section: RDMA devices from /sys/class/infiniband, and `fi_info` on EFA hosts.

sysfs is read directly (no ibstat/ibv_devinfo, which may not be installed): every EFA and
InfiniBand device shows its ports, link state, rate and error counters there. `fi_info` is run
only where the host is expected to have EFA, because it is what NCCL's aws-ofi-nccl plugin
sees: a device in sysfs that libfabric cannot open is no use to a job.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from typing import Any

from gpuhealth.parsers import ParseError, fi_info, rdma_sysfs
from gpuhealth.probe import command

CLASS_DIR = "sys/class/infiniband"
FI_INFO_ARGS = ("-p", "efa", "-t", "FI_EP_RDM")
# The EFA installer puts libfabric's tools here, which a non-interactive SSH PATH lacks.
FI_INFO_DIRS = ("/opt/amazon/efa/bin",)
DEFAULT_FI_INFO_TIMEOUT_S = 30.0


def _read(path: str) -> tuple[str | None, dict[str, str] | None]:
    """(text, None), or (None, why) with the `unavailable` kind: missing file or read error."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(), None
    except FileNotFoundError:
        return None, {"kind": "not_supported", "detail": f"no {path}"}
    except OSError as exc:
        return None, {"kind": "error", "detail": f"{path}: {exc.strerror or exc}"}


def _natural(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _value(record: dict[str, Any], key: str, path: str, parse: Callable[[str], Any]) -> Any:
    """parse(text of path), or None with the reason in record["unavailable"][key]."""
    text, why = _read(path)
    if text is not None:
        try:
            return parse(text)
        except ParseError as exc:
            why = {"kind": "error", "detail": f"{path}: {exc}"}
    record["unavailable"][key] = why
    return None


def _counters(folder: str, label: str, port: dict[str, Any]) -> dict[str, int] | None:
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        port["unavailable"][label] = {"kind": "not_supported", "detail": f"no {folder}"}
        return None
    except OSError as exc:
        port["unavailable"][label] = {"kind": "error", "detail": f"{folder}: {exc}"}
        return None
    values = {}
    for name in names:
        value = _value(
            port, f"{label}/{name}", os.path.join(folder, name), rdma_sysfs.parse_counter
        )
        if value is not None:
            values[name] = value
    return values


def _port(folder: str, number: int) -> dict[str, Any]:
    port: dict[str, Any] = {"port": number, "unavailable": {}}
    for key in ("state", "phys_state"):
        state = _value(port, key, os.path.join(folder, key), rdma_sysfs.parse_enum)
        port[f"{key}_code"], port[key] = state or (None, None)
        if state is None:
            port["unavailable"][f"{key}_code"] = port["unavailable"][key]
    rate = os.path.join(folder, "rate")
    port["rate"] = _value(port, "rate", rate, str.strip)
    port["rate_gbps"] = _value(port, "rate_gbps", rate, rdma_sysfs.parse_rate)
    port["link_layer"] = _value(port, "link_layer", os.path.join(folder, "link_layer"), str.strip)
    for label in ("counters", "hw_counters"):
        port[label] = _counters(os.path.join(folder, label), label, port)
    return port


def _driver(device_dir: str) -> str | None:
    """The kernel driver bound to the device (`efa`, `mlx5_core`), from device/driver."""
    try:
        return os.path.basename(os.readlink(os.path.join(device_dir, "device", "driver")))
    except OSError:
        return None


def read_devices(class_dir: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Every RDMA device of a /sys/class/infiniband directory (or a copy), and read problems.

    A missing directory means no RDMA device: that is a fact for the checks, not an error.
    """
    try:
        names = sorted(os.listdir(class_dir), key=_natural)
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{class_dir}: {exc.strerror or exc}"]
    devices = []
    for name in names:
        folder = os.path.join(class_dir, name)
        device: dict[str, Any] = {"name": name, "driver": _driver(folder), "unavailable": {}}
        if device["driver"] is None:
            device["unavailable"]["driver"] = {
                "kind": "absent",
                "detail": f"no {folder}/device/driver link",
            }
        for key in ("fw_ver", "board_id", "hca_type"):
            device[key] = _value(device, key, os.path.join(folder, key), str.strip)
        ports_dir = os.path.join(folder, "ports")
        try:
            numbers = sorted(int(p) for p in os.listdir(ports_dir) if p.isdigit())
            device["ports"] = [_port(os.path.join(ports_dir, str(n)), n) for n in numbers]
        except OSError as exc:
            device["ports"] = None
            device["unavailable"]["ports"] = {"kind": "error", "detail": f"{ports_dir}: {exc}"}
        devices.append(device)
    return devices, []


def find_fi_info() -> str | None:
    """fi_info on PATH, else where the EFA installer puts it."""
    found = shutil.which("fi_info")
    if found:
        return found
    for folder in FI_INFO_DIRS:
        path = os.path.join(folder, "fi_info")
        if os.access(path, os.X_OK):
            return path
    return None


def _fi_info_failed(status: str, error: str, rc: int | None = None) -> dict[str, Any]:
    return {
        "status": status,
        "rc": rc,
        "error": error,
        "getinfo_error": None,
        "domains": [],
        "provider_version": None,
        "libfabric_version": None,
        "entries": [],
    }


def run_fi_info(timeout_s: float) -> dict[str, Any]:
    """`fi_info -p efa -t FI_EP_RDM`: the EFA RDM domains libfabric can open, and its version."""
    binary = find_fi_info()
    if binary is None:
        return _fi_info_failed(
            "not_installed", f"fi_info not found on PATH or in {', '.join(FI_INFO_DIRS)}"
        )
    result = command.run([binary, *FI_INFO_ARGS], timeout_s)
    if result.timed_out:
        return _fi_info_failed("timeout", result.error or "timed out")
    if result.error:
        return _fi_info_failed("error", result.error)
    # stderr first: libfabric warnings land before the blocks, where the parser skips text.
    try:
        parsed = fi_info.parse(result.stderr + "\n" + result.stdout)
    except ParseError as exc:
        return _fi_info_failed("error", f"unparsable fi_info output: {exc}", result.rc)
    record = {"rc": result.rc, **fi_info.summary(parsed)}
    if result.rc != 0 and record["status"] == "ok":
        detail = result.stderr.strip()[:300] or "no message"
        record.update(status="error", error=f"fi_info exited {result.rc}: {detail}")
    return record


def collect(config: dict[str, Any], errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The facts document's `fabric` section."""
    devices, problems = read_devices(os.path.join(config["root"], CLASS_DIR))
    errors.extend({"probe": "fabric", "error": problem} for problem in problems)
    section: dict[str, Any] = {"devices": devices, "fi_info": None, "unavailable": {}}
    expect = config.get("expect") or {}
    fabric = expect.get("fabric") or "none"
    if fabric != "efa":
        section["unavailable"]["fi_info"] = {
            "kind": "absent",
            "detail": f"fi_info runs only where the fabric is efa (here {fabric!r})",
        }
        return section
    timeout_s = float(expect.get("fi_info_timeout_s") or DEFAULT_FI_INFO_TIMEOUT_S)
    section["fi_info"] = run_fi_info(timeout_s)
    if section["fi_info"]["status"] in ("timeout", "error"):
        errors.append({"probe": "fabric", "call": "fi_info", "error": section["fi_info"]["error"]})
    return section


# ---------------------------------------------------------------- saved evidence (triage)

_FI_INFO_HEAD = re.compile(r"^(provider: \S+\n[ \t]+fabric: |fi_getinfo: -\d+)", re.M)


def looks_like_fi_info(text: str) -> bool:
    """Saved `fi_info` output: a provider block, or the fi_getinfo error it prints instead."""
    return _FI_INFO_HEAD.search(text[:65536]) is not None


def from_fi_info_text(text: str) -> dict[str, Any]:
    """The `fabric` section a saved `fi_info` output gives: fi_info only, no sysfs devices."""
    record = {"rc": None, **fi_info.summary(fi_info.parse(text))}
    absent = {"kind": "absent", "detail": "fi_info output holds no sysfs device data"}
    return {"fabric": {"devices": None, "fi_info": record, "unavailable": {"devices": absent}}}


def looks_like_class_dir(path: Any) -> bool:
    """A copy of /sys/class/infiniband: device folders that hold a `ports` folder."""
    try:
        return any(os.path.isdir(os.path.join(path, name, "ports")) for name in os.listdir(path))
    except OSError:
        return False


def from_class_dir(path: Any) -> dict[str, Any]:
    """The `fabric` section a copied /sys/class/infiniband gives: devices, no fi_info."""
    devices, problems = read_devices(str(path))
    absent = {"kind": "absent", "detail": "a sysfs copy holds no fi_info output"}
    return {
        "fabric": {"devices": devices, "fi_info": None, "unavailable": {"fi_info": absent}},
        "errors": [{"probe": "fabric", "error": problem} for problem in problems],
    }
