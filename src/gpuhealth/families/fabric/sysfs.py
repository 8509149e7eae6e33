"""RDMA devices from a /sys/class/infiniband tree: the node's own, or a copy in a ticket.

The kernel shows every EFA and InfiniBand device there with its ports, link state, rate and
error counters, so no ibstat/ibv_devinfo is needed. Both the probe and triage read trees with
this module. Node side: Python 3.6 and the standard library.
"""

import os
import re
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpuhealth.families.fabric import parse_rdma
from gpuhealth.parsing import ParseError


def _read(path: str) -> Tuple[Optional[str], Optional[Dict[str, str]]]:
    """(text, None), or (None, why) with the `unavailable` kind: missing file or read error."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(), None
    except FileNotFoundError:
        return None, {"kind": "not_supported", "detail": f"no {path}"}
    except OSError as exc:
        return None, {"kind": "error", "detail": f"{path}: {exc.strerror or exc}"}


def _natural(name: str) -> List[Any]:
    return [int(part) if part.isdecimal() else part for part in re.split(r"(\d{1,18})", name)]


def _value(record: Dict[str, Any], key: str, path: str, parse: Callable[[str], Any]) -> Any:
    """parse(text of path), or None with the reason in record["unavailable"][key]."""
    text, why = _read(path)
    if text is not None:
        try:
            return parse(text)
        except ParseError as exc:
            why = {"kind": "error", "detail": f"{path}: {exc}"}
    record["unavailable"][key] = why
    return None


def _counters(folder: str, label: str, port: Dict[str, Any]) -> Optional[Dict[str, int]]:
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
            port, f"{label}/{name}", os.path.join(folder, name), parse_rdma.parse_counter
        )
        if value is not None:
            values[name] = value
    return values


def _port(folder: str, number: int) -> Dict[str, Any]:
    port: Dict[str, Any] = {"port": number, "unavailable": {}}
    for key in ("state", "phys_state"):
        state = _value(port, key, os.path.join(folder, key), parse_rdma.parse_enum)
        port[f"{key}_code"], port[key] = state or (None, None)
        if state is None:
            port["unavailable"][f"{key}_code"] = port["unavailable"][key]
    rate = os.path.join(folder, "rate")
    port["rate"] = _value(port, "rate", rate, str.strip)
    port["rate_gbps"] = _value(port, "rate_gbps", rate, parse_rdma.parse_rate)
    port["link_layer"] = _value(port, "link_layer", os.path.join(folder, "link_layer"), str.strip)
    for label in ("counters", "hw_counters"):
        port[label] = _counters(os.path.join(folder, label), label, port)
    return port


def _driver(device_dir: str) -> Optional[str]:
    """The kernel driver bound to the device (`efa`, `mlx5_core`), from device/driver."""
    try:
        return os.path.basename(os.readlink(os.path.join(device_dir, "device", "driver")))
    except OSError:
        return None


def read_devices(class_dir: str) -> Tuple[List[Dict[str, Any]], List[str]]:
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
        device: Dict[str, Any] = {"name": name, "driver": _driver(folder), "unavailable": {}}
        if device["driver"] is None:
            device["unavailable"]["driver"] = {
                "kind": "absent",
                "detail": f"no {folder}/device/driver link",
            }
        for key in ("fw_ver", "board_id", "hca_type"):
            device[key] = _value(device, key, os.path.join(folder, key), str.strip)
        ports_dir = os.path.join(folder, "ports")
        try:
            # The folder's own name ("1"), read as a number only to order and report it.
            names = [p for p in os.listdir(ports_dir) if re.fullmatch(r"[0-9]{1,9}", p)]
            numbered = sorted((int(p), p) for p in names)
            device["ports"] = [_port(os.path.join(ports_dir, p), n) for n, p in numbered]
        except OSError as exc:
            device["ports"] = None
            device["unavailable"]["ports"] = {"kind": "error", "detail": f"{ports_dir}: {exc}"}
        devices.append(device)
    return devices, []
