"""`ibstat` and `ibv_devinfo` output as the RDMA device records the sysfs reader builds.

People paste these into tickets instead of a copy of /sys/class/infiniband. `ibstat` prints
`CA 'mlx5_0'` blocks (`CA type: MT4129`, `Firmware version: 28.41.1000`, `Port 1:` with
`State: Active`, `Physical state: LinkUp`, `Rate: 400`, `Link layer: InfiniBand`);
`ibv_devinfo` prints `hca_id:` blocks (`fw_ver:`, `vendor_part_id:`, `board_id:`, `port: 1`
with `state: PORT_ACTIVE (4)`, `link_layer:`, and with -v `active_width: 4X (2)`,
`active_speed: 100.0 Gbps (64)`, `phys_state: LINK_UP (5)`), fields separated by tabs.

States are given the kernel's sysfs names and codes (ACTIVE 4, LinkUp 5), so the InfiniBand
checks judge a paste as they judge the node. What a paste does not hold (error counters, the
driver, the PCI position; with plain `ibv_devinfo` the physical state and rate) is null with
kind `absent`. A device block cut short, a port without its state, or `ibpanic` about a device
leaves that device's ports unreadable (null, kind `error`), never dropped.
"""

import re
from typing import Any, Dict, List, Optional, Tuple

from gpuhealth.facts import why
from gpuhealth.parsing import ParseError

# ib_port_state and ib_port_phys_state: the kernel's names (drivers/infiniband/core/sysfs.c).
STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYS_STATES = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}
# ibstat's words for the port state (infiniband-diags port_state_str).
_IBSTAT_STATES = {"down": 1, "initializing": 2, "init": 2, "armed": 3, "active": 4}
_PHYS_BY_NAME = {name.lower().replace(" ", ""): code for code, name in PHYS_STATES.items()}

_CA = re.compile(r"^CA '([^'\s]{1,64})'\s*$")
_HCA = re.compile(r"^hca_id:\s*(\S{1,64})\s*$")
_PANIC = re.compile(r"^ibpanic: .*?IB device '([^'\s]{1,64})'")
_PORT_IBSTAT = re.compile(r"^Port (\d{1,3}):$")
_FIELD = re.compile(r"^([^:\s][^:]{0,59}):[ \t]*(.*)$")
_ENUM = re.compile(r"^([A-Z_]{1,40}) \((\d{1,3})\)$")
_WIDTH = re.compile(r"^(\d{1,2})X \(\d{1,3}\)$")
_SPEED = re.compile(r"^(\d{1,4}(?:\.\d{1,4})?) Gbps \(\d{1,4}\)$")
_RATE = re.compile(r"^\d{1,4}(?:\.\d{1,4})?$")

_ABSENT_DEVICE = ("driver", "board_id", "hca_type", "fw_ver")
_ABSENT_PORT = ("state", "phys_state", "rate", "link_layer")


def looks_like_ibstat(text: str) -> bool:
    """`ibstat` output: a `CA '<name>'` line followed by its indented `CA type:`."""
    found = re.search(r"^CA '[^'\s]{1,64}'[ \t]*\r?\n[ \t]+CA type:", text[:65536], re.M)
    return found is not None


def looks_like_ibv_devinfo(text: str) -> bool:
    """`ibv_devinfo` output: an `hca_id:` line followed by its indented `transport:`."""
    found = re.search(r"^hca_id:[ \t]*\S+[ \t]*\r?\n[ \t]+transport:", text[:65536], re.M)
    return found is not None


def _device(name: str, source: str) -> Dict[str, Any]:
    absent = why("absent", f"not in {source} output")
    device: Dict[str, Any] = {"name": name, "driver": None, "ports": [], "unavailable": {}}
    for key in _ABSENT_DEVICE:
        device[key] = None
        device["unavailable"][key] = absent
    device["pci"] = {
        "function": None,
        "path": None,
        "numa_node": None,
        "unavailable": {"path": absent, "numa_node": absent},
    }
    return device


def _port(number: int, source: str) -> Dict[str, Any]:
    absent = why("absent", f"not in {source} output")
    port: Dict[str, Any] = {"port": number, "unavailable": {}}
    for key in ("state", "state_code", "phys_state", "phys_state_code", "rate", "rate_gbps"):
        port[key] = None
        port["unavailable"][key] = absent
    port["link_layer"] = None
    port["unavailable"]["link_layer"] = absent
    for key in ("counters", "hw_counters"):
        port[key] = None
        port["unavailable"][key] = absent
    return port


def _known(record: Dict[str, Any], key: str, value: Any) -> None:
    record[key] = value
    record["unavailable"].pop(key, None)


def _set_state(port: Dict[str, Any], code: int, names: Dict[int, str], key: str) -> None:
    _known(port, key, names.get(code, f"code {code}"))
    _known(port, f"{key}_code", code)


def _unreadable(device: Dict[str, Any], detail: str) -> None:
    device["ports"] = None
    device["unavailable"]["ports"] = why("error", detail)


def _value(record: Dict[str, Any], key: str, number: int) -> None:
    if record.get(key) is not None:
        raise ParseError(f"line {number}: {key} given twice")


def _ibstat_field(
    device: Dict[str, Any], port: Optional[Dict[str, Any]], key: str, value: str, number: int
) -> None:
    if port is None:
        if key == "CA type":
            _value(device, "hca_type", number)
            _known(device, "hca_type", value or None)
        elif key == "Firmware version":
            _value(device, "fw_ver", number)
            _known(device, "fw_ver", value or None)
        return
    if key == "State":
        code = _IBSTAT_STATES.get(value.lower())
        if code is None:
            raise ParseError(f"line {number}: unknown port state {value[:40]!r}")
        _value(port, "state", number)
        _set_state(port, code, STATES, "state")
    elif key == "Physical state":
        code = _PHYS_BY_NAME.get(value.lower().replace(" ", ""))
        if code is None:
            raise ParseError(f"line {number}: unknown physical state {value[:40]!r}")
        _value(port, "phys_state", number)
        _set_state(port, code, PHYS_STATES, "phys_state")
    elif key == "Rate":
        if not _RATE.match(value):
            raise ParseError(f"line {number}: not a rate in Gb/s: {value[:40]!r}")
        _value(port, "rate", number)
        _known(port, "rate", f"{value} Gb/sec")
        _known(port, "rate_gbps", float(value))
    elif key == "Link layer":
        _value(port, "link_layer", number)
        _known(port, "link_layer", value or None)


def _devinfo_field(
    device: Dict[str, Any],
    port: Optional[Dict[str, Any]],
    key: str,
    value: str,
    number: int,
    width: Dict[int, int],
) -> None:
    if port is None:
        if key == "fw_ver":
            _value(device, "fw_ver", number)
            _known(device, "fw_ver", value or None)
        elif key == "board_id":
            _known(device, "board_id", value or None)
        elif key == "vendor_part_id":
            # Not the MT<n> name sysfs gives: the model is named as the tool names it.
            _known(device, "hca_type", f"vendor_part_id {value}")
        return
    if key in ("state", "phys_state"):
        match = _ENUM.match(value)
        if match is None:
            raise ParseError(f"line {number}: not a `NAME (code)` {key}: {value[:40]!r}")
        code = int(match.group(2))
        _value(port, key, number)
        _set_state(port, code, STATES if key == "state" else PHYS_STATES, key)
    elif key == "link_layer":
        _value(port, "link_layer", number)
        _known(port, "link_layer", value or None)
    elif key == "active_width":
        match = _WIDTH.match(value)
        if match is None:
            raise ParseError(f"line {number}: not a link width: {value[:40]!r}")
        width[port["port"]] = int(match.group(1))
    elif key == "active_speed":
        match = _SPEED.match(value)
        # Old releases print `invalid speed (0)` on a port without link: the rate is unknown.
        if match is not None and port["port"] in width:
            lanes = width[port["port"]]
            rate = lanes * float(match.group(1))
            _known(port, "rate", f"{rate:g} Gb/sec ({lanes}X {match.group(1)} Gbps)")
            _known(port, "rate_gbps", rate)


def _finish(device: Dict[str, Any], declared: Optional[int], required: Tuple[str, ...]) -> None:
    """A device whose ports are fewer than it declared, or lack a required field, was cut."""
    ports = device.get("ports")
    if ports is None:
        return
    if not ports:
        _unreadable(device, "the output lists no port of this device (cut short?)")
        return
    if declared is not None and len(ports) < declared:
        _unreadable(device, f"{len(ports)} of its {declared} ports in the output (cut short?)")
        return
    for port in ports:
        missing = [key for key in required if port.get(key) is None]
        if missing:
            _unreadable(device, f"port {port['port']} lacks {', '.join(missing)} (cut short?)")
            return


def parse(text: str) -> List[Dict[str, Any]]:
    """Every device of an `ibstat` or `ibv_devinfo` output, in the order printed.

    Text before the first device (a shell prompt) is skipped, as are `ibwarn:` lines; an
    indented line of a device that is not `key: value` is a ParseError naming the line.
    """
    devinfo = looks_like_ibv_devinfo(text) and not looks_like_ibstat(text)
    source = "ibv_devinfo" if devinfo else "ibstat"
    required = ("state", "link_layer") if devinfo else ("state", "phys_state", "link_layer")
    devices: List[Dict[str, Any]] = []
    declared: Optional[int] = None
    device: Optional[Dict[str, Any]] = None
    port: Optional[Dict[str, Any]] = None
    width: Dict[int, int] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        start = (_HCA if devinfo else _CA).match(line) if raw[:1] not in " \t" else None
        panic = _PANIC.match(line)
        if start or panic:
            if device is not None:
                _finish(device, declared, required)
            name = (start or panic).group(1)  # type: ignore[union-attr]
            if any(d["name"] == name for d in devices):
                raise ParseError(f"line {number}: device {name!r} listed twice")
            device, port, declared, width = _device(name, source), None, None, {}
            devices.append(device)
            if panic:
                _unreadable(device, f"{source} could not read it: {line[:200]}")
                device = None
            continue
        if device is None or raw[:1] not in " \t":
            continue  # a prompt, ibwarn:, or text after the output
        if not devinfo and _PORT_IBSTAT.match(line):
            port = _port(int(line[5:-1]), source)
            device["ports"].append(port)
            continue
        field = _FIELD.match(line)
        if field is None:
            if devinfo:
                continue  # -v: capability flag lists, `name = value` lines
            raise ParseError(f"line {number}: not a `key: value` line of {source}: {line[:80]!r}")
        key, value = field.group(1).strip(), field.group(2).strip()
        if devinfo and key == "port":
            if not re.fullmatch(r"\d{1,3}", value):
                raise ParseError(f"line {number}: not a port number: {value[:40]!r}")
            port = _port(int(value), source)
            device["ports"].append(port)
        elif devinfo:
            _devinfo_field(device, port, key, value, number, width)
        elif key == "Number of ports":
            if not re.fullmatch(r"\d{1,3}", value):
                raise ParseError(f"line {number}: not a port count: {value[:40]!r}")
            declared = int(value)
        else:
            _ibstat_field(device, port, key, value, number)
    if device is not None:
        _finish(device, declared if not devinfo else None, required)
    if not devices:
        raise ParseError(f"line 1: no device in the {source} output")
    if devinfo:
        _absent_phys(devices)
    return devices


def _absent_phys(devices: List[Dict[str, Any]]) -> None:
    """Plain `ibv_devinfo` (without -v) has no physical state, width or speed: say so."""
    for device in devices:
        for port in device.get("ports") or []:
            for key in ("phys_state", "rate"):
                if port.get(key) is None:
                    detail = "plain ibv_devinfo does not print it (ibv_devinfo -v does)"
                    port["unavailable"][key] = why("absent", detail)
                    port["unavailable"][f"{key}_code" if key == "phys_state" else "rate_gbps"] = (
                        why("absent", detail)
                    )
