"""What `nvidia-smi -q` and `nvidia-smi -q -x` have in common: values, names and the GPU builder.

The XML and the text output print the same NVML readings with the same value strings ("N/A",
"81559 MiB", "Active", "-2 C", ...); only the layout differs. Each parser therefore only finds
the raw strings (a `RawGpu`) and `build_gpu` turns them into a facts GPU object, so both parsers
judge "N/A", deprecated values, unit suffixes, T.Limit offsets and ECC sums the same way.

Stdlib only: shipped to GPU nodes inside the probe.
"""

import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Set, Tuple, Union

from gpuhealth.facts import mark_unavailable, why
from gpuhealth.families.gpu.schema import (
    CLOCK_REASON_BITS,
    RECOVERY_ACTIONS,
    new_driver,
    new_gpu,
)
from gpuhealth.parsing import ParseError

PROBE_XML = "nvidia-smi-xml"
PROBE_TEXT = "nvidia-smi-text"

DEPRECATED_TEXT = "Requested functionality has been deprecated"

# Strings nvidia-smi prints instead of a value when the GPU/driver does not offer it.
_NOT_SUPPORTED_TEXTS = {
    "n/a",
    "[n/a]",
    "not supported",
    "[not supported]",
    "not available",
    "not found",  # `CUDA Version : Not Found` on vGPU drivers
}
# Strings nvidia-smi prints when the query itself failed (NVML error text in brackets).
_ERROR_TEXTS = {"unknown error", "gpu is lost", "insufficient permissions", "gpu requires reset"}

# Major driver branch that introduced the GPU recovery action (NVML field 230).
RECOVERY_ACTION_MIN_DRIVER = 570


class Unavailable(NamedTuple):
    """Why a value is null: a facts `unavailable` entry before it is stored."""

    kind: str
    detail: str


# A section of the output: either its leaves as {"a/b": raw} or, when nvidia-smi printed one
# string for the whole section (`<remapped_rows>N/A</remapped_rows>`), that string.
Section = Union[Dict[str, str], str]


class RawGpu:
    """The raw strings of one GPU as found in the output; a missing key means "not printed".

    `fields` uses the canonical names of the parsers' field tables. The sections keep nvidia-smi's
    own leaf names ("volatile/sram_correctable", "Volatile/SRAM Correctable"), which
    `build_gpu` maps through `norm`, so XML and text share one name table.
    """

    def __init__(
        self,
        fields: Dict[str, str],
        ecc: Optional[Section] = None,
        retired_pages: Optional[Section] = None,
        remapped_rows: Optional[Section] = None,
        clock_reasons: Optional[Union[List[Tuple[str, str]], str]] = None,
        processes: Optional[Union[List[Dict[str, str]], str]] = None,
    ) -> None:
        self.fields = fields
        self.ecc = ecc
        self.retired_pages = retired_pages
        self.remapped_rows = remapped_rows
        self.clock_reasons = clock_reasons
        self.processes = processes


# What one GPU section of nvidia-smi ever holds: ~300 leaves, paths under 250 characters. A
# leaf path repeats its ancestors' labels, so an input far outside these sizes would cost
# memory out of all proportion to its bytes before any value is read.
MAX_LEAF_PATH = 512
MAX_LEAVES = 5000


def add_leaf(leaves: Dict[str, str], path: str, value: str) -> None:
    """leaves[path] = value unless a leaf of that path came first; ParseError outside what
    nvidia-smi prints (see MAX_LEAVES)."""
    if len(path) > MAX_LEAF_PATH:
        raise ParseError(f"a field path of {len(path)} characters: {path[:60]!r}...")
    if path not in leaves:
        if len(leaves) >= MAX_LEAVES:
            raise ParseError(f"more than {MAX_LEAVES} fields in one section")
        leaves[path] = value


def pick(leaves: Dict[str, str], table: Dict[str, Tuple[str, ...]]) -> Dict[str, str]:
    """The raw value of each canonical field: the first of its candidate paths present."""
    fields = {}
    for name, paths in table.items():
        found = next((leaves[path] for path in paths if path in leaves), None)
        if found is not None:
            fields[name] = found
    return fields


def norm(name: str) -> str:
    """Compare names across XML tags and text labels: "SRAM Uncorrectable SEC-DED" and
    "sram_uncorrectable_secded" both become "sramuncorrectablesecded"."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


# --------------------------------------------------------------------------- values


def special(raw: str) -> Optional[Unavailable]:
    """Classify the non-values nvidia-smi prints ("N/A", deprecated, "[Unknown Error]")."""
    text = raw.strip()
    low = text.lower()
    if low in _NOT_SUPPORTED_TEXTS:
        return Unavailable("not_supported", f"nvidia-smi: {text}")
    if low == DEPRECATED_TEXT.lower():
        return Unavailable("not_supported", f"nvidia-smi: {DEPRECATED_TEXT}")
    if low.strip("[]") in _ERROR_TEXTS or (text.startswith("[") and text.endswith("]")):
        return Unavailable("error", f"nvidia-smi: {text}")
    if not text:
        return Unavailable("error", "nvidia-smi printed an empty value")
    return None


def convert(raw: str, conv: Callable[[str], Any]) -> Tuple[Any, Optional[Unavailable]]:
    """Run `conv` on a raw string; "N/A" and friends, or a failed conversion, give a reason."""
    reason = special(raw)
    if reason is not None:
        return None, reason
    try:
        return conv(raw.strip()), None
    except ValueError:
        return None, Unavailable("error", f"cannot read {raw.strip()!r}")


# A number and its unit as nvidia-smi prints it; bounded, so absurd input is refused, not parsed.
_NUMBER = re.compile(r"^(-?\d{1,15}(?:\.\d{1,15})?)\s*([A-Za-z%/()]{0,8})$")


def _unit(cast: Callable[[str], Any], unit: str = "", signed: bool = False) -> Callable[[str], Any]:
    """A converter of "<number> <unit>" strings; negative values only where `signed`."""

    def convert(text: str) -> Any:
        match = _NUMBER.match(text)
        if match is None or match.group(2).lower() != unit.lower():
            raise ValueError(text)
        value = cast(match.group(1))
        if value < 0 and not signed:
            raise ValueError(text)
        return value

    return convert


to_count = _unit(int)  # "67" (a counter is never negative)
to_mib = _unit(int, "MiB")  # "81559 MiB"
to_celsius = _unit(int, "C", signed=True)  # "29 C"; T.Limit offsets are negative past the limit
to_watts = _unit(float, "W")  # "67.74 W"
to_link_width = _unit(int, "x")  # "16x"
to_link_gen = _unit(int)  # "5"
_percent = _unit(int, "%")


def to_percent(text: str) -> int:
    """ "37 %" -> 37; beyond 100 is not a utilisation."""
    value = _percent(text)
    if value > 100:
        raise ValueError(text)
    return int(value)


def to_pstate(text: str) -> str:
    """ "P0" .. "P15" as printed (P0 is full performance, P8 and up idle)."""
    match = re.fullmatch(r"P(\d{1,2})", text)
    if match is None or int(match.group(1)) > 15:
        raise ValueError(text)
    return f"P{int(match.group(1))}"


_TRUE = {"enabled", "active", "yes", "true", "on"}
_FALSE = {"disabled", "notactive", "no", "false", "off"}


def to_bool(text: str) -> bool:
    """ "Enabled"/"Active"/"Yes" -> True; "Disabled"/"Not Active"/"No" -> False."""
    key = norm(text)
    if key in _TRUE:
        return True
    if key in _FALSE:
        return False
    raise ValueError(text)


def to_ecc_mode(text: str) -> str:
    """ "Enabled" -> "enabled" (the facts spelling)."""
    return "enabled" if to_bool(text) else "disabled"


def to_version(text: str) -> str:
    """A driver or CUDA version as printed ("570.124.06", "12.8"); anything else is garbled."""
    if not re.fullmatch(r"\d{1,5}(?:\.\d{1,5}){0,3}", text):
        raise ValueError(text)
    return text


def to_text(text: str) -> str:
    """A string value kept as printed."""
    if not text:
        raise ValueError(text)
    return text


_BUS_ID = re.compile(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-9A-Fa-f])$")


def to_pci_bus_id(text: str) -> str:
    """Bus id in NVML's spelling, "00000000:19:00.0" (8-digit domain, upper-case hex)."""
    match = _BUS_ID.match(text)
    if match is None:
        raise ValueError(text)
    domain, bus, dev, fn = match.groups()
    return f"{domain.zfill(8)}:{bus}:{dev}.{fn}".upper()


def to_pci_device_id(text: str) -> str:
    """ "1EB810DE" (XML) and "0x1EB810DE" (text) -> "0x1EB810DE"."""
    digits = text[2:] if text.lower().startswith("0x") else text
    if not re.fullmatch(r"[0-9A-Fa-f]{8}", digits):
        raise ValueError(text)
    return "0x" + digits.upper()


def tlimit_offset_to_absolute(temperature_c: int, margin_c: int, offset_c: int) -> int:
    """Absolute threshold from a T.Limit offset (v13 XML, H100 text on 535+).

    "GPU T.Limit Temp" is the headroom now; the thresholds are printed relative to T.Limit.
    """
    return temperature_c + margin_c - offset_c


# --------------------------------------------------------------------------- name tables

# Clock event reason labels / tags (prefix removed, normalised) -> facts names.
CLOCK_REASON_NAMES: Dict[str, str] = {
    "idle": "gpu_idle",
    "gpuidle": "gpu_idle",
    "applicationsclockssetting": "applications_clocks_setting",
    "applicationclockssetting": "applications_clocks_setting",
    "applicationsclocksetting": "applications_clocks_setting",
    "swpowercap": "sw_power_cap",
    "hwslowdown": "hw_slowdown",
    "syncboost": "sync_boost",
    "swthermalslowdown": "sw_thermal_slowdown",
    "hwthermalslowdown": "hw_thermal_slowdown",
    "hwpowerbrakeslowdown": "hw_power_brake_slowdown",
    "displayclocksetting": "display_clock_setting",
    "displayclockssetting": "display_clock_setting",
}
_CLOCK_REASON_PREFIXES = ("clockseventreason", "clocksthrottlereason")

# Recovery action strings (normalised) -> NVML_GPU_RECOVERY_ACTION_* value. nvidia-smi prints
# the short labels of NVIDIA's "Error Recovery and Response Flags" page (None, Reset, Reboot,
# Drain P2P, Drain and Reset); the enum spellings are accepted too.
RECOVERY_ACTION_NAMES: Dict[str, int] = {
    "none": 0,
    "reset": 1,
    "gpureset": 1,
    "reboot": 2,
    "nodereboot": 2,
    "noderebootrequired": 2,
    "drainp2p": 3,
    "drainandreset": 4,
    "drainp2pandreset": 4,
    "gpuresetrequired": 1,  # XID 154's words for 0x1
}
for _value, _name in RECOVERY_ACTIONS.items():
    RECOVERY_ACTION_NAMES.setdefault(norm(_name), _value)

_ECC_PARTS = {
    "sramcorrectable": "sram_correctable",
    "sramuncorrectable": "sram_uncorrectable",
    "sramuncorrectableparity": "sram_uncorrectable_parity",
    "sramuncorrectablesecded": "sram_uncorrectable_secded",
    "dramcorrectable": "dram_correctable",
    "dramuncorrectable": "dram_uncorrectable",
    # pre-v11 layout: single_bit/double_bit with per-location counters and a total
    "singlebittotal": "single_bit_total",
    "doublebittotal": "double_bit_total",
    "singlebitdevicememory": "single_bit_device_memory",
    "doublebitdevicememory": "double_bit_device_memory",
}

_RETIRED_PARTS = {
    "multiplesinglebitretirementretiredcount": "single_bit",
    "doublebitretirementretiredcount": "double_bit",
    "singlebitecc": "single_bit",
    "doublebitecc": "double_bit",
    "pendingblacklist": "pending",
    "pendingretirement": "pending",
    "pendingpageblacklist": "pending",
    "pendingpageretirement": "pending",
}

_REMAP_PARTS = {
    "remappedrowcorr": "correctable",
    "remappedrowunc": "uncorrectable",
    "remappedrowpending": "pending",
    "remappedrowfailure": "failure",
    "correctableerror": "correctable",
    "uncorrectableerror": "uncorrectable",
    "pending": "pending",
    "remappingfailureoccurred": "failure",
}


def clock_reason_name(label: str) -> Optional[str]:
    """Facts name of a clock event reason label or XML tag; None if unknown."""
    key = norm(label)
    for prefix in _CLOCK_REASON_PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix) :]
            break
    return CLOCK_REASON_NAMES.get(key)


def clock_reasons(active: List[str]) -> Dict[str, Any]:
    """`{"active": [...], "mask": None, "unavailable": {}}`: nvidia-smi gives names only, never
    the bitmask; a reason it gave no reading for goes under `unavailable`."""
    ordered = sorted(set(active), key=lambda name: CLOCK_REASON_BITS[name])
    return {"active": ordered, "mask": None, "unavailable": {}}


def recovery_action_value(text: str) -> int:
    """nvidia-smi's recovery action string -> NVML integer; ValueError if unknown."""
    stripped = text.strip()
    if re.fullmatch(r"\d+", stripped):
        return int(stripped)
    key = norm(stripped)
    if key not in RECOVERY_ACTION_NAMES:
        raise ValueError(text)
    return RECOVERY_ACTION_NAMES[key]


def driver_major(version: Optional[str]) -> Optional[int]:
    """535 from "535.161.08"; None when unknown."""
    if not version:
        return None
    match = re.match(r"^(\d{1,18})", version)
    return int(match.group(1)) if match else None


def parts_of(group: Dict[str, Any]) -> List[Optional[int]]:
    """The counts of an ECC group (its totals and parts), without its `unavailable` map."""
    return [value for key, value in group.items() if key != "unavailable"]


# --------------------------------------------------------------------------- builder


class _Builder:
    """Fills one facts GPU object from a RawGpu; collects notes for the document's errors."""

    def __init__(
        self, index: int, raw: RawGpu, driver_version: Optional[str], missing: Unavailable
    ) -> None:
        self.raw = raw
        self.driver_version = driver_version
        self.missing = missing
        self.gpu = new_gpu(index)
        self.notes: List[str] = []

    def unavailable(self, key: str, reason: Unavailable) -> None:
        mark_unavailable(self.gpu, key, reason.kind, reason.detail)

    def read(self, name: str, conv: Callable[[str], Any]) -> Tuple[Any, Optional[Unavailable]]:
        raw = self.raw.fields.get(name)
        if raw is None:
            return None, self.missing
        return convert(raw, conv)

    def scalar(self, key: str, name: str, conv: Callable[[str], Any]) -> Any:
        value, reason = self.read(name, conv)
        if reason is not None:
            self.unavailable(key, reason)
        else:
            self.gpu[key] = value
        return value

    def first_of(self, key: str, names: Tuple[str, ...], conv: Callable[[str], Any]) -> None:
        """First candidate that has a value (power draw: plain, average, instant)."""
        first_reason: Optional[Unavailable] = None
        for name in names:
            if name not in self.raw.fields:
                continue
            value, reason = self.read(name, conv)
            if reason is None:
                self.gpu[key] = value
                return
            first_reason = first_reason or reason
        self.unavailable(key, first_reason or self.missing)

    def thresholds(self, temperature: Optional[int], margin: Optional[int]) -> None:
        margin_reason = None if margin is not None else self.read("tlimit_margin", to_celsius)[1]
        temp_reason = None if temperature is not None else self.read("temperature", to_celsius)[1]
        for key, stem in (
            ("temp_slowdown_c", "slowdown"),
            ("temp_shutdown_c", "shutdown"),
            ("temp_max_operating_c", "max_operating"),
        ):
            absolute, abs_reason = self.read(f"{stem}_abs", to_celsius)
            if absolute is not None:
                self.gpu[key] = absolute
                continue
            if f"{stem}_offset" not in self.raw.fields:
                self.unavailable(key, abs_reason or self.missing)
                continue
            offset, off_reason = self.read(f"{stem}_offset", to_celsius)
            if off_reason is not None:
                self.unavailable(key, off_reason)
            elif temperature is not None and margin is not None:
                self.gpu[key] = tlimit_offset_to_absolute(temperature, margin, offset)
            else:
                lacking = margin_reason or temp_reason or self.missing
                what = "T.Limit margin" if margin is None else "current temperature"
                # The GPU has the threshold (it printed the offset): not "not supported", just
                # not computable from this output; only evidence that lacks a line is absent.
                kind = "absent" if lacking.kind == "absent" else "error"
                self.unavailable(
                    key,
                    Unavailable(
                        kind,
                        f"threshold given as T.Limit offset {offset} C, but the "
                        f"{what} is unavailable ({lacking.detail})",
                    ),
                )

    def section_values(
        self, key: str, table: Dict[str, str], what: str, convs: Dict[str, Callable[[str], Any]]
    ) -> Optional[Dict[str, List[Any]]]:
        """The known leaves of section `key`, converted; None once `key` is marked unavailable
        (see leaves), the first unreadable leaf making it an error."""
        section = self.leaves(key, getattr(self.raw, key), what)
        if section is None:
            return None
        values: Dict[str, List[Any]] = {}
        for path, raw in section.items():
            part = table.get(norm(path))
            if part is None:
                continue
            value, reason = convert(raw, convs[part])
            if reason is not None and reason.kind == "error":
                self.unavailable(key, Unavailable("error", f"{what} {path}: {reason.detail}"))
                return None
            values.setdefault(part, []).append(value)
        return values

    def leaves(self, key: str, section: Any, what: str) -> Any:
        """A section's leaves, or None once `key` is marked unavailable: the section is missing,
        or nvidia-smi printed one word (N/A, [Not Supported]) or garbage in its place."""
        if section is None:
            self.unavailable(key, self.missing)
            return None
        if isinstance(section, str):
            self.unavailable(
                key,
                special(section)
                or Unavailable("error", f"unexpected {what} text {section.strip()!r}"),
            )
            return None
        return section

    # ---- compound keys

    def ecc(self) -> None:
        mode_raw = self.raw.fields.get("ecc_mode")
        if mode_raw is not None:
            mode, reason = convert(mode_raw, to_ecc_mode)
            if mode == "disabled":
                self.unavailable("ecc", Unavailable("not_supported", "ECC mode is disabled"))
                return
            if reason is not None and reason.kind == "not_supported":
                self.unavailable("ecc", Unavailable("not_supported", f"ECC mode: {reason.detail}"))
                return
        section = self.leaves("ecc", self.raw.ecc, "ECC errors")
        if section is None:
            return
        groups: Dict[str, Dict[str, Optional[int]]] = {"volatile": {}, "aggregate": {}}
        why_not: Dict[str, Dict[str, Unavailable]] = {"volatile": {}, "aggregate": {}}
        for path, raw in section.items():
            head, _, rest = path.partition("/")
            group = groups.get(norm(head))
            part = _ECC_PARTS.get(norm(rest))
            if group is None or part is None:
                continue
            value, reason = convert(raw, to_count)
            if reason is not None and reason.kind == "error":
                self.unavailable("ecc", Unavailable("error", f"ECC {path}: {reason.detail}"))
                return
            if part not in group:
                group[part] = value
                if reason is not None:
                    why_not[norm(head)][part] = Unavailable(reason.kind, f"{path}: {reason.detail}")
        result: Dict[str, Any] = {}
        for name, parts in groups.items():
            result[name] = _ecc_totals(parts, why_not[name]) if parts else None
        counts = [v for group in result.values() if group for v in parts_of(group)]
        if all(v is None for v in counts):
            self.unavailable(
                "ecc", Unavailable("not_supported", "nvidia-smi: all ECC counters N/A")
            )
            return
        self.gpu["ecc"] = result

    def retired_pages(self) -> None:
        values = self.section_values(
            "retired_pages",
            _RETIRED_PARTS,
            "retired pages",
            {"single_bit": to_count, "double_bit": to_count, "pending": to_bool},
        )
        if values is None:
            return
        single, double = _first(values, "single_bit"), _first(values, "double_bit")
        pending_flags = [v for v in values.get("pending", []) if v is not None]
        pending = any(pending_flags) if pending_flags else None
        if single is None and double is None and pending is None:
            self.unavailable("retired_pages", Unavailable("not_supported", "nvidia-smi: N/A"))
            return
        self.gpu["retired_pages"] = {"single_bit": single, "double_bit": double, "pending": pending}

    def remapped_rows(self) -> None:
        values = self.section_values(
            "remapped_rows",
            _REMAP_PARTS,
            "remapped rows",
            {
                "correctable": to_count,
                "uncorrectable": to_count,
                "pending": to_bool,
                "failure": to_bool,
            },
        )
        if values is None:
            return
        rows = {
            k: _first(values, k) for k in ("correctable", "uncorrectable", "pending", "failure")
        }
        if all(v is None for v in rows.values()):
            self.unavailable("remapped_rows", Unavailable("not_supported", "nvidia-smi: N/A"))
            return
        self.gpu["remapped_rows"] = rows

    def clock_event_reasons(self) -> None:
        items = self.leaves("clock_event_reasons", self.raw.clock_reasons, "clock event reasons")
        if items is None:
            return
        active: List[str] = []
        read: Set[str] = set()
        not_supported: Set[str] = set()
        unknown: List[str] = []
        for label, raw in items:
            name = clock_reason_name(label)
            value, reason = convert(raw, to_bool)
            if name is None:
                unknown.append(label)
                if value:
                    self.notes.append(f"unrecognised clock event reason {label!r} is Active")
                continue
            if reason is not None and reason.kind == "error":
                self.unavailable(
                    "clock_event_reasons", Unavailable("error", f"{label}: {reason.detail}")
                )
                return
            if reason is not None:
                not_supported.add(name)
                continue
            read.add(name)
            if value:
                active.append(name)
        unread = [n for n in CLOCK_REASON_BITS if n not in read and n not in not_supported]
        if unknown and unread:
            # Garbled output: a reason may hide behind an unrecognised label, so an empty
            # "active" list would claim "no HW slowdown" without evidence.
            self.unavailable(
                "clock_event_reasons",
                Unavailable(
                    "error", f"unrecognised reason lines {unknown} and no reading for {unread}"
                ),
            )
            return
        if not read:
            self.unavailable(
                "clock_event_reasons",
                Unavailable("not_supported", "nvidia-smi: all reasons N/A")
                if not_supported
                else self.missing,
            )
            return
        reasons = clock_reasons(active)
        # A reason nvidia-smi did not print, or printed as N/A, is unknown, not "Not Active".
        # Boards without a reason print N/A for it (Sync Boost, ...), but every GPU has the
        # HW Slowdown reason: N/A for it among readings is garbled output.
        for name in CLOCK_REASON_BITS:
            if name not in read:
                na = name in not_supported and name != "hw_slowdown"
                kind = "not_supported" if na else "error"
                printed = "N/A" if name in not_supported else "no line"
                reasons["unavailable"][name] = why(kind, f"nvidia-smi: {printed} for {name}")
        self.gpu["clock_event_reasons"] = reasons

    def pcie(self) -> None:
        names = {
            "gen_current": ("pcie_gen_current", to_link_gen),
            "gen_max": ("pcie_gen_max", to_link_gen),
            "width_current": ("pcie_width_current", to_link_width),
            "width_max": ("pcie_width_max", to_link_width),
            "replay_count": ("replay_count", to_count),
        }
        pcie: Dict[str, Any] = {}
        reasons: List[Unavailable] = []
        for key, (name, conv) in names.items():
            value, reason = self.read(name, conv)
            if reason is not None and reason.kind == "error" and name in self.raw.fields:
                self.unavailable("pcie", Unavailable("error", f"PCIe {key}: {reason.detail}"))
                return
            pcie[key] = value
            if reason is not None:
                reasons.append(reason)
        if all(v is None for v in pcie.values()):
            self.unavailable("pcie", reasons[0])
            return
        self.gpu["pcie"] = pcie

    def recovery_action(self) -> None:
        if "recovery_action" in self.raw.fields:
            self.scalar("recovery_action", "recovery_action", recovery_action_value)
            return
        major = driver_major(self.driver_version)
        if major is not None and major < RECOVERY_ACTION_MIN_DRIVER:
            self.unavailable(
                "recovery_action",
                Unavailable(
                    "not_supported",
                    f"driver {self.driver_version} predates the GPU recovery action (r570)",
                ),
            )
        else:
            self.unavailable("recovery_action", self.missing)

    def processes(self) -> None:
        procs = self.raw.processes
        if isinstance(procs, str) and procs.strip() in ("", "None"):
            self.gpu["processes"] = []
            return
        procs = self.leaves("processes", procs, "processes")
        if procs is None:
            return
        result = []
        for proc in procs:
            ptype = proc.get("type", "")
            if ptype and special(ptype) is None and "C" not in ptype.upper():
                continue  # graphics-only (Xorg, compositors): the facts list compute processes
            pid, reason = convert(proc.get("pid", ""), to_count)
            if reason is not None:
                self.unavailable("processes", Unavailable("error", f"process pid: {reason.detail}"))
                return
            name, _ = convert(proc.get("name", "N/A"), to_text)
            used, _ = convert(proc.get("used_memory", "N/A"), to_mib)
            result.append({"pid": pid, "name": name, "used_memory_mib": used})
        self.gpu["processes"] = result

    def build(self) -> Dict[str, Any]:
        self.scalar("name", "name", to_text)
        self.scalar("uuid", "uuid", to_text)
        self.scalar("serial", "serial", to_text)
        self.scalar("pci_bus_id", "pci_bus_id", to_pci_bus_id)
        self.scalar("pci_device_id", "pci_device_id", to_pci_device_id)
        self.scalar("architecture", "architecture", to_text)
        self.scalar("vbios_version", "vbios_version", to_text)
        self.scalar("persistence_mode", "persistence_mode", to_bool)
        self.scalar("memory_total_mib", "memory_total", to_mib)
        self.scalar("memory_used_mib", "memory_used", to_mib)
        temperature = self.scalar("temperature_c", "temperature", to_celsius)
        margin = self.scalar("temp_tlimit_margin_c", "tlimit_margin", to_celsius)
        self.thresholds(temperature, margin)
        self.scalar("ecc_mode", "ecc_mode", to_ecc_mode)
        self.ecc()
        self.retired_pages()
        self.remapped_rows()
        self.clock_event_reasons()
        self.first_of(
            "power_draw_w", ("power_draw", "power_draw_average", "power_draw_instant"), to_watts
        )
        self.scalar("power_limit_w", "power_limit", to_watts)
        self.scalar("performance_state", "performance_state", to_pstate)
        self.scalar("utilization_gpu_pct", "utilization_gpu", to_percent)
        self.pcie()
        self.unavailable(
            "nvlink",
            Unavailable(
                "absent", "nvidia-smi -q does not report NVLink (see nvidia-smi nvlink --status)"
            ),
        )
        self.recovery_action()
        self.processes()
        return self.gpu


def _first(values: Dict[str, List[Any]], key: str) -> Any:
    found = [v for v in values.get(key, []) if v is not None]
    return found[0] if found else None


def _ecc_totals(parts: Dict[str, Optional[int]], reasons: Dict[str, Unavailable]) -> Dict[str, Any]:
    """Facts ECC group from the parts nvidia-smi printed (v11-v13 SRAM/DRAM, or older
    single/double bit with a total). A total is the sum of its parts only when every part has
    a value: a part printed N/A, unreadable or not printed at all leaves the total unknown,
    with the reason under `unavailable` (never a sum of what remains)."""
    old_layout = "single_bit_total" in parts or "double_bit_total" in parts

    def part(*names: str) -> Tuple[Optional[int], Optional[Unavailable]]:
        """The first of `names` printed with a value; else why there is none."""
        for name in names:
            if parts.get(name) is not None:
                return parts[name], None
        for name in names:
            if name in reasons:
                return None, reasons[name]
        if old_layout:
            return None, Unavailable("not_supported", "this nvidia-smi has no SRAM/DRAM split")
        return None, Unavailable("error", f"nvidia-smi printed no {names[0]} line")

    def total(whole: str, *pieces: Tuple[Optional[int], Optional[Unavailable]]) -> Any:
        if parts.get(whole) is not None:
            return parts[whole], None
        unknown = [reason for _, reason in pieces if reason is not None]
        return (None, unknown[0]) if unknown else (sum(value or 0 for value, _ in pieces), None)

    sram_c = part("sram_correctable")
    sram_u = part("sram_uncorrectable")
    if sram_u[0] is None and "sram_uncorrectable" not in reasons:
        # v13 prints it as parity and SEC-DED errors: both count.
        sram_u = total("", part("sram_uncorrectable_parity"), part("sram_uncorrectable_secded"))
    dram_c = part("dram_correctable", "single_bit_device_memory")
    dram_u = part("dram_uncorrectable", "double_bit_device_memory")
    values = {
        "corrected": total("single_bit_total", sram_c, dram_c),
        "uncorrected": total("double_bit_total", sram_u, dram_u),
        "sram_corrected": sram_c,
        "sram_uncorrected": sram_u,
        "dram_corrected": dram_c,
        "dram_uncorrected": dram_u,
    }
    group: Dict[str, Any] = {key: value for key, (value, _) in values.items()}
    group["unavailable"] = {
        key: why(reason.kind, reason.detail) for key, (_, reason) in values.items() if reason
    }
    return group


def build_gpu(
    index: int, raw: RawGpu, *, driver_version: Optional[str], missing: Unavailable
) -> Tuple[Dict[str, Any], List[str]]:
    """Facts GPU object from raw strings, plus notes for the document's `errors`.

    `missing` is the reason for anything the output did not print: `absent` normally,
    `error` for a GPU whose output was cut off.
    """
    builder = _Builder(index, raw, driver_version, missing)
    gpu = builder.build()
    return gpu, builder.notes


def build_driver(version: Optional[str], cuda: Optional[str]) -> Dict[str, Any]:
    """Driver block: nvidia-smi answered, so the driver was loaded; it never prints NVML's
    own version."""
    driver = new_driver(True)
    for key, raw in (("version", version), ("cuda_driver_version", cuda)):
        if raw is None:
            mark_unavailable(driver, key, "absent", "not in nvidia-smi output")
            continue
        value, reason = convert(raw, to_version)
        if reason is not None:
            mark_unavailable(driver, key, reason.kind, reason.detail)
        else:
            driver[key] = value
    mark_unavailable(driver, "nvml_version", "absent", "nvidia-smi does not print it")
    return driver


MAX_ATTACHED = 256  # GPUs one node can hold; a larger count is garbled evidence


def attached_count(raw: Optional[str]) -> Optional[int]:
    """`attached_gpus` / "Attached GPUs" as an int, None if missing; a count no node has is
    a ParseError (every GPU check would be judged for each of its slots)."""
    if raw is None:
        return None
    value, _ = convert(raw, to_count)
    if value is not None and value > MAX_ATTACHED:
        raise ParseError(f"Attached GPUs {value} is more than a node holds ({MAX_ATTACHED})")
    return value


def count_errors(probe: str, attached: Optional[int], parsed: int) -> List[Dict[str, str]]:
    """An `errors` entry when the document has fewer (or more) GPUs than it says are attached."""
    if attached is None or attached == parsed:
        return []
    if parsed < attached:
        what = "output truncated or incomplete"
    else:
        what = "more GPU sections than attached GPUs"
    return [{"probe": probe, "error": f"{what}: attached {attached}, parsed {parsed}"}]


def missing_reason(
    index: int, parsed: int, attached: Optional[int], missing: Unavailable
) -> Unavailable:
    """Why a field GPU section `index` (of `parsed`) lacks is null: `missing` (not printed), but
    an error in the last section of output cut short (fewer sections than `attached`)."""
    if attached is not None and parsed < attached and index == parsed - 1:
        return Unavailable(
            "error", f"output truncated (attached {attached}, parsed {parsed}) before this field"
        )
    return missing


def assemble(
    probe: str,
    raws: List[RawGpu],
    versions: Tuple[Optional[str], Optional[str], Optional[str]],
    missing: Unavailable,
) -> Dict[str, Any]:
    """The facts fragment (driver, gpu_count, gpus, errors) from the GPUs both parsers found.

    `versions` are the raw driver version, CUDA version and attached-GPU count. Output with
    fewer GPU sections than it says are attached is reported in `errors`, and what its last
    GPU section lacks is kind `error` (cut off), not `missing` (not printed).
    """
    driver_version, cuda, attached = versions
    gpu_count = attached_count(attached)
    errors = count_errors(probe, gpu_count, len(raws))
    gpus = []
    for index, raw in enumerate(raws):
        gone = missing_reason(index, len(raws), gpu_count, missing)
        gpu, notes = build_gpu(index, raw, driver_version=driver_version, missing=gone)
        gpus.append(gpu)
        errors.extend({"probe": probe, "error": f"GPU {index}: {note}"} for note in notes)
    return {
        "driver": build_driver(driver_version, cuda),
        "gpu_count": gpu_count,
        "gpus": gpus,
        "errors": errors,
    }
