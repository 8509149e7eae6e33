"""The probe's two GPU paths compared: NVML (nvidia-ml-py) against `nvidia-smi -q -x`.

Both paths fill the same GPU records (families/gpu/schema.py) from the same driver, so on one
node at one moment they must agree; a value they disagree on is a defect in one of gpuhealth's
readers (a unit, an enum, a field read from the wrong element), not a fault of the node. A
`gpuhealth bundle` holds both documents, and triage compares them with `compare`.

GPUs are matched by PCI bus id, else by UUID, else (neither known on NVML's side) by index.
Values are compared leaf by leaf (`ecc.volatile.uncorrected`, `nvlink.3.up`); `unavailable`
maps are reasons in each path's own words and are not compared. A value unknown (null) on
either side is no disagreement. A field that no GPU has on both sides (NVML's NVLink error
counters, nvidia-smi's link speeds) is listed once as not compared.

Numbers that move between two reads:

| field | rule (why) |
|---|---|
| `temperature_c`, `temp_tlimit_margin_c` | within 5 C (the two reads are seconds apart) |
| `temp_slowdown_c`, `temp_shutdown_c`, `temp_max_operating_c` | within 2 C (v13 XML and r535+ |
|  | print offsets from T.Limit, rebuilt from a temperature and margin read at two instants) |
| `power_draw_w` | not compared (load; v13 XML gives a 1 s average, NVML the instant) |
| `utilization_gpu_pct`, `memory_used_mib`, `performance_state` | not compared (load) |
| `clock_event_reasons` | not compared (idle, power cap, slowdowns come and go with load) |
| `pcie.gen_current` | not compared (an idle link trains down to gen 1) |
| `processes` | not compared (jobs start and end) |
| anything else | exact, floats within 0.01 (identity, configuration, counters; nvidia-smi |
|  | prints two decimals) |

A counter (ECC, replays) that grew between the two reads shows as a disagreement too: the
message says so, and a second bundle tells the two apart.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# Rule path (a leaf path with link numbers as `*`) or its prefix -> tolerance; None: not compared.
MOVING: dict[str, float | None] = {
    "temperature_c": 5.0,
    "temp_tlimit_margin_c": 5.0,
    "temp_slowdown_c": 2.0,
    "temp_shutdown_c": 2.0,
    "temp_max_operating_c": 2.0,
    "power_draw_w": None,
    "utilization_gpu_pct": None,
    "memory_used_mib": None,
    "performance_state": None,
    "clock_event_reasons": None,
    "pcie.gen_current": None,
    "processes": None,
}
FLOAT_TOLERANCE = 0.01
_LINK = re.compile(r"\.\d+(?=\.|$)")


@dataclass(frozen=True)
class Disagreement:
    """One value the two paths read differently; `gpu` is NVML's index (None: the driver)."""

    gpu: int | None
    field: str
    nvml: Any
    smi: Any

    def text(self) -> str:
        """ "gpu3 ecc.volatile.uncorrected: NVML 2, nvidia-smi 0"."""
        where = "" if self.gpu is None else f"gpu{self.gpu} "
        return f"{where}{self.field}: NVML {_show(self.nvml)}, nvidia-smi {_show(self.smi)}"


@dataclass
class Comparison:
    """What the two documents say about the GPUs, side by side."""

    compared: int = 0  # values both paths knew and were compared
    gpus: int = 0  # GPUs matched
    disagreements: list[Disagreement] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)  # "nvlink_errors (NVML only)", ...


def _show(value: Any) -> str:
    return (
        "not listed" if value is _ABSENT else repr(value) if isinstance(value, str) else str(value)
    )


_ABSENT = object()  # a GPU one path does not list at all


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(dotted path, value) of every leaf; link lists become `nvlink.<link>.<key>`."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key != "unavailable":
                yield from _leaves(item, f"{path}.{key}" if path else key)
    elif (
        isinstance(value, list)
        and value
        and all(isinstance(item, dict) and "link" in item for item in value)
    ):
        for item in value:
            rest = {k: v for k, v in item.items() if k != "link"}
            yield from _leaves(rest, f"{path}.{item['link']}")
    else:
        yield path, value


def rule_of(path: str) -> tuple[bool, float | None]:
    """(moving, tolerance) of a leaf path; tolerance None with moving True: not compared."""
    general = _LINK.sub(".*", path)
    for key, tolerance in MOVING.items():
        if general == key or general.startswith(key + "."):
            return True, tolerance
    return False, None


def _differ(nvml: Any, smi: Any, tolerance: float | None) -> bool:
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (nvml, smi))
    if numbers:
        allowed = tolerance if tolerance is not None else FLOAT_TOLERANCE
        if tolerance is None and isinstance(nvml, int) and isinstance(smi, int):
            allowed = 0
        return bool(abs(nvml - smi) > allowed)
    if isinstance(nvml, list) and isinstance(smi, list):
        return sorted(map(repr, nvml)) != sorted(map(repr, smi))
    return bool(nvml != smi)


def _name(gpu: dict[str, Any]) -> str:
    """How a GPU one path lists is named: its bus id, else its UUID, else its index."""
    return str(gpu.get("pci_bus_id") or gpu.get("uuid") or f"index {gpu.get('index')}")


def _key(gpu: dict[str, Any]) -> str | None:
    bus = gpu.get("pci_bus_id")
    return str(bus).upper() if bus else None


def _pairs(
    nvml: list[dict[str, Any]], smi: list[dict[str, Any]]
) -> tuple[list[tuple[dict[str, Any], dict[str, Any]]], list[Disagreement]]:
    """Matched GPU records, and a disagreement for each GPU only one path lists."""
    by_bus = {_key(g): g for g in smi if _key(g)}
    by_uuid = {g["uuid"]: g for g in smi if g.get("uuid")}
    by_index = {g.get("index"): g for g in smi}
    pairs, used = [], set()
    missing = []
    for gpu in nvml:
        if _key(gpu):
            other = by_bus.get(_key(gpu)) or by_uuid.get(gpu.get("uuid"))
        elif gpu.get("uuid"):
            other = by_uuid.get(gpu.get("uuid"))
        else:
            other = by_index.get(gpu.get("index"))
        if other is None or id(other) in used:
            missing.append(Disagreement(gpu.get("index"), "listed", _name(gpu), _ABSENT))
            continue
        used.add(id(other))
        pairs.append((gpu, other))
    extra = [
        Disagreement(g.get("index"), "listed", _ABSENT, _name(g)) for g in smi if id(g) not in used
    ]
    return pairs, missing + extra


def compare(nvml_facts: dict[str, Any], smi_facts: dict[str, Any]) -> Comparison:
    """Every GPU value of an NVML-path facts document against a nvidia-smi-path one."""
    result = Comparison()
    sides: dict[str, set[str]] = {"nvml": set(), "smi": set(), "both": set()}
    pairs, result.disagreements = _pairs(nvml_facts.get("gpus") or [], smi_facts.get("gpus") or [])
    result.gpus = len(pairs)
    records: list[tuple[int | None, str, dict[str, Any], dict[str, Any]]] = [
        (None, "driver", nvml_facts.get("driver") or {}, smi_facts.get("driver") or {}),
        (
            None,
            "",
            {"gpu_count": nvml_facts.get("gpu_count")},
            {"gpu_count": smi_facts.get("gpu_count")},
        ),
    ]
    for mine, theirs in pairs:
        if mine.get("lost"):  # NVML lost it mid-read: what it has is partial by nature
            result.not_compared.append(f"gpu{mine.get('index')} (NVML: GPU is lost)")
            continue
        records.append((mine.get("index"), "", mine, theirs))
    for gpu, prefix, mine, theirs in records:
        left, right = dict(_leaves(mine, prefix)), dict(_leaves(theirs, prefix))
        for path in sorted(set(left) | set(right)):
            a, b = left.get(path), right.get(path)
            general = _LINK.sub(".*", path)
            moving, tolerance = rule_of(path)
            if moving and tolerance is None:
                continue
            if a is None or b is None:
                if a is not None or b is not None:
                    sides["nvml" if a is not None else "smi"].add(general)
                continue
            sides["both"].add(general)
            result.compared += 1
            if _differ(a, b, tolerance):
                result.disagreements.append(Disagreement(gpu, path, a, b))
    for side, label in (("nvml", "NVML only"), ("smi", "nvidia-smi only")):
        result.not_compared += [
            f"{path} ({label})" for path in _collapsed(sides[side] - sides["both"], sides["both"])
        ]
    return result


def _collapsed(paths: set[str], both: set[str]) -> list[str]:
    """One-sided paths, those under a top-level key no GPU has on both sides named once by
    that key (`nvlink_errors`, not each of its counters)."""
    shared = {p.split(".")[0] for p in both}
    return sorted({p if p.split(".")[0] in shared else p.split(".")[0] for p in paths})
