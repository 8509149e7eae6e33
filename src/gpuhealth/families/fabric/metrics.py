"""What the fabric family measures over time: every InfiniBand port's error counters; and the
HCAs' firmware, part of what identifies the node (a firmware update restarts its baselines)."""

from __future__ import annotations

import re
from typing import Any

from gpuhealth.metrics import COUNTER, Export, Measures, Metric, Values, number

_IB_CABLE = "reseat or replace the port's cable or transceiver and check its switch port"
_IB_RATE = "regression_ib_errors_per_day"
METRICS = (
    Metric(
        "ib.*.link_downed",
        "link_downed events",
        "growth",
        "regression_ib_link_downed_growth",
        resets=True,
        saturates=255,
        advice=_IB_CABLE,
        export=Export(
            "ib_link_downed",
            COUNTER,
            "InfiniBand port link_downed events (the HCA's counter: since its reset, sticks at "
            "255).",
        ),
    ),
    *(
        Metric(
            f"ib.*.{counter}",
            what,
            "rate",
            _IB_RATE,
            resets=True,
            saturates=top,
            advice=_IB_CABLE,
            export=Export(f"ib_{exported}", COUNTER, help),
        )
        for counter, what, top, exported, help in (
            (
                "symbol_error",
                "symbol errors",
                65535,
                "symbol_errors",
                "InfiniBand port symbol errors (the HCA's counter: since its reset, sticks at "
                "65535).",
            ),
            (
                "port_rcv_errors",
                "receive errors",
                65535,
                "port_rcv_errors",
                "InfiniBand port receive errors (the HCA's counter: since its reset, sticks at "
                "65535).",
            ),
            (
                "link_error_recovery",
                "link error recoveries",
                255,
                "link_error_recovery",
                "InfiniBand port link error recoveries (the HCA's counter: since its reset, "
                "sticks at 255).",
            ),
        )
    ),
)
IB_COUNTERS = tuple(m.name.rpartition(".")[2] for m in METRICS)


def _devices(facts: dict[str, Any]) -> list[Any]:
    fabric = facts.get("fabric")
    devices = fabric.get("devices") if isinstance(fabric, dict) else None
    return devices if isinstance(devices, list) else []


def node_values(facts: dict[str, Any]) -> Values:
    """Every InfiniBand port's error counters (`ib.<device>.<port>.<counter>`)."""
    found: Values = {}
    for device in _devices(facts):
        if not isinstance(device, dict) or not isinstance(device.get("name"), str):
            continue
        for port in device.get("ports") or []:
            counters = port.get("counters") if isinstance(port, dict) else None
            if not isinstance(counters, dict) or not isinstance(port.get("port"), int):
                continue
            name = re.sub(r"[^A-Za-z0-9_-]", "_", device["name"])
            for counter in IB_COUNTERS:
                value = number(counters.get(counter))
                if value is not None:
                    found[f"ib.{name}.{port['port']}.{counter}"] = value
    return found


def identity(facts: dict[str, Any]) -> dict[str, Any]:
    """Each HCA's firmware version, by device name."""
    firmware = {}
    for device in _devices(facts):
        if isinstance(device, dict) and device.get("name") and device.get("fw_ver"):
            firmware[str(device["name"])] = str(device["fw_ver"])
    return {"firmware": firmware}


MEASURES = Measures(METRICS, node=node_values, identity=identity)
