"""Profiles: the packaged per-SKU profiles (`gpuhealth/profiles/*.yml`) and a user's, each
resolved through its `extends` chain, and the one a host is identified as from its facts
(platform matching: the GPUs' product names, PCI device ids and architecture, the host CPU,
the GPU count).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
)

from gpuhealth.config.limits import PROFILE_ONLY, ConfigError, Profile, explain, validate

# nvidia-smi's product_architecture and the probe's names for NVML's architecture enum.
Architecture = Literal[
    "Kepler",
    "Maxwell",
    "Pascal",
    "Volta",
    "Turing",
    "Ampere",
    "Ada Lovelace",
    "Hopper",
    "Blackwell",
    "Rubin",
]
# Python's platform.machine() on the CPUs NVIDIA's data-center GPUs are hosted by.
CpuArch = Literal["x86_64", "aarch64", "ppc64le"]
NVIDIA_VENDOR_ID = 0x10DE


def _device_id(text: str) -> str:
    if not re.fullmatch(r"0x[0-9A-Fa-f]{4}", text):
        raise ValueError(f"a PCI device id is 0x and 4 hex digits, like 0x2941, got {text!r}")
    return text.lower()


class _Meta(BaseModel):
    """What a profile says of itself: its description and parent, and which hosts it fits.

    A host the inventory names no profile for gets the one it is identified as: by `match`
    (regular expressions searched in the GPUs' product name) or by `match_device_ids` (the
    GPUs' PCI device ids, NVIDIA's vendor id implied). Each constraint declared must then
    hold where the host's facts say: `match_architecture` (the GPUs' architecture),
    `match_cpu_arch` (the host CPU, as `uname -m`), `match_max_gpus` (no more GPUs than this:
    a maximum, so a node that lost a GPU keeps its profile and fails its GPU count). A fact
    the host's evidence lacks neither confirms nor refutes its constraint.
    """

    model_config = ConfigDict(strict=True, extra="ignore")
    description: StrictStr | None = None
    extends: StrictStr | None = None
    match: list[StrictStr] | None = None
    match_device_ids: (
        Annotated[list[Annotated[StrictStr, AfterValidator(_device_id)]], Field(min_length=1)]
        | None
    ) = None
    match_architecture: Annotated[list[Architecture], Field(min_length=1)] | None = None
    match_cpu_arch: Annotated[list[CpuArch], Field(min_length=1)] | None = None
    match_max_gpus: Annotated[StrictInt, Field(ge=1)] | None = None

    @property
    def identifies(self) -> bool:
        """Whether the profile can be matched at all (by name or device id)."""
        return bool(self.match or self.match_device_ids)


def _distinct(values: Iterable[Any]) -> tuple[str, ...]:
    """The non-empty strings of `values`, each once, in order."""
    found = (v.strip() for v in values if isinstance(v, str))
    return tuple(dict.fromkeys(v for v in found if v))


def _nvidia_device_id(value: Any) -> str | None:
    """ "0x294110DE" (the facts' PCI device id: device in the upper 16 bits, vendor in the
    lower) -> "0x2941"; None for anything else, a vendor other than NVIDIA's included."""
    if not isinstance(value, str) or not re.fullmatch(r"0x[0-9A-Fa-f]{8}", value):
        return None
    number = int(value, 16)
    if number & 0xFFFF != NVIDIA_VENDOR_ID:
        return None
    return f"0x{number >> 16:04x}"


@dataclass(frozen=True)
class Platform:
    """What a host is, as far as choosing its profile goes, read from its facts document.

    A field the facts do not give is empty (None): unknown, never a guess. `location` is the
    NVML platform-info block (GB200/GB300 trays: chassis serial and tray index) when every
    GPU that has one agrees; it is shown with the match, never evidence for one: NVIDIA does
    not document what HGX boards put there.
    """

    products: tuple[str, ...] = ()  # distinct GPU product names, in GPU order
    device_ids: tuple[str, ...] = ()  # distinct NVIDIA PCI device ids, "0x2941"
    architectures: tuple[str, ...] = ()  # distinct GPU architectures, "Blackwell"
    gpu_count: int | None = None  # the most GPUs any source of the facts saw
    cpu_arch: str | None = None  # the host's `uname -m`
    location: str | None = None  # "chassis 1821... tray 3"

    @classmethod
    def of(cls, facts: Mapping[str, Any]) -> Platform:
        """The platform a facts document (probe or evidence) describes."""
        gpus = [g for g in facts.get("gpus") or [] if isinstance(g, Mapping)]
        counts = [len(gpus)] if gpus else []
        reported = facts.get("gpu_count")
        if isinstance(reported, int) and not isinstance(reported, bool) and reported >= 0:
            counts.append(reported)
        on_bus = (facts.get("pci") or {}).get("nvidia_gpus")
        if isinstance(on_bus, list):
            counts.append(len(on_bus))
        host = facts.get("host") or {}
        arch = host.get("arch") if isinstance(host, Mapping) else None
        return cls(
            products=_distinct(g.get("name") for g in gpus),
            device_ids=_distinct(_nvidia_device_id(g.get("pci_device_id")) for g in gpus),
            # "Unknown(12)": an architecture the probe has no name for is not evidence.
            architectures=_distinct(
                a
                for a in (g.get("architecture") for g in gpus)
                if isinstance(a, str) and not a.startswith("Unknown")
            ),
            gpu_count=max(counts) if counts else None,
            cpu_arch=(arch.strip() or None) if isinstance(arch, str) else None,
            location=_location(gpus),
        )

    @property
    def mixed(self) -> bool:
        """GPUs of more than one product on the node: no one profile describes it."""
        return len(self.products) > 1 or len(self.device_ids) > 1

    def gpus(self) -> str:
        """The node's GPUs as a reason names them: "'NVIDIA GB200' (0x2941)"."""
        names = ", ".join(repr(p) for p in self.products) or "no product name"
        ids = ", ".join(self.device_ids) or "no device id"
        return f"{names} ({ids})"


def _location(gpus: list[Mapping[str, Any]]) -> str | None:
    """Chassis and tray from the GPUs' platform-info blocks, when those that have one agree."""
    places = set()
    for gpu in gpus:
        info = gpu.get("platform")
        if not isinstance(info, Mapping):
            continue
        serial, tray = info.get("chassis_serial"), info.get("tray_index")
        if isinstance(serial, str) and serial.strip() and isinstance(tray, int):
            places.add(f"chassis {serial.strip()} tray {tray}")
    return places.pop() if len(places) == 1 else None


@dataclass(frozen=True)
class _Candidate:
    """A profile a host was identified as: the evidence for it, or what refuted it."""

    name: str
    evidence: tuple[str, ...]
    refuted: str | None


def _weigh(name: str, meta: _Meta, platform: Platform) -> _Candidate | None:
    """A profile against a platform: None when nothing identifies the host as it."""
    evidence: list[str] = []
    ids = [i for i in platform.device_ids if i in (meta.match_device_ids or [])]
    evidence += [f"device id {i}" for i in ids]
    names = [p for p in platform.products if any(re.search(m, p) for m in meta.match or [])]
    evidence += [f"name {p!r}" for p in names]
    if not evidence:
        return None
    refuted = None
    archs = platform.architectures
    if meta.match_architecture and archs:
        wrong = [a for a in archs if a not in meta.match_architecture]
        if wrong:
            refuted = f"architecture {', '.join(wrong)}, not {', '.join(meta.match_architecture)}"
        else:
            evidence += archs
    if meta.match_cpu_arch and platform.cpu_arch and refuted is None:
        if platform.cpu_arch not in meta.match_cpu_arch:
            refuted = f"host CPU {platform.cpu_arch}, not {', '.join(meta.match_cpu_arch)}"
        else:
            evidence.append(platform.cpu_arch)
    count = platform.gpu_count
    if meta.match_max_gpus is not None and count is not None and refuted is None:
        if count > meta.match_max_gpus:
            refuted = f"{count} GPUs, more than its {meta.match_max_gpus}"
        else:
            evidence.append(f"{count} GPUs")
    return _Candidate(name, tuple(evidence), refuted)


class ProfileSet:
    """All profiles known to a run: the packaged ones plus an optional user directory."""

    def __init__(self, extra_dir: Path | None = None) -> None:
        self._raw: dict[str, tuple[str, _Meta, dict[str, Any]]] = {
            "default": (
                "gpuhealth (family defaults)",
                _Meta(description="Any NVIDIA GPU (when no profile is named and none matches)"),
                {},
            )
        }
        packaged = resources.files("gpuhealth") / "profiles"
        for entry in sorted(packaged.iterdir(), key=lambda e: e.name):
            if entry.name.endswith(".yml"):
                self._add(f"gpuhealth/profiles/{entry.name}", entry.read_text())
        if extra_dir is not None:
            if not extra_dir.is_dir():
                raise ConfigError(f"{extra_dir}: profile directory does not exist")
            for path in sorted(extra_dir.glob("*.yml")):
                self._add(str(path), path.read_text())
        self._resolved: dict[str, Profile] = {}
        for name in self._raw:
            self.get(name)

    def _add(self, where: str, text: str) -> None:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: a profile must be a mapping of keys to limits")
        data = {str(k): v for k, v in data.items()}
        try:
            meta = _Meta.model_validate({k: data[k] for k in PROFILE_ONLY if k in data})
        except ValidationError as exc:
            raise explain(where, exc) from None
        for pattern in meta.match or []:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"{where}: key 'match': bad pattern {pattern!r}: {exc}") from exc
        constraints = ("match_architecture", "match_cpu_arch", "match_max_gpus")
        declared = [k for k in constraints if getattr(meta, k) is not None]
        if declared and not meta.identifies:
            raise ConfigError(
                f"{where}: key {declared[0]!r} constrains a match, but the profile declares "
                "none: add 'match' (product name patterns) or 'match_device_ids'"
            )
        limits = {k: v for k, v in data.items() if k not in PROFILE_ONLY}
        validate(where, limits)
        self._raw[Path(where).stem] = (where, meta, limits)

    @property
    def names(self) -> list[str]:
        """Known profile names, sorted."""
        return sorted(self._raw)

    def description(self, name: str) -> str:
        """A profile's description."""
        return self._raw[name][1].description or ""

    def identified_by(self, name: str) -> str:
        """What identifies a host as this profile: name patterns and device ids ("" for none),
        its constraints after a colon."""
        meta = self._raw[name][1]
        found = [f"/{p}/" for p in meta.match or []] + list(meta.match_device_ids or [])
        held: list[str] = [*(meta.match_architecture or []), *(meta.match_cpu_arch or [])]
        if meta.match_max_gpus is not None:
            held.append(f"<= {meta.match_max_gpus} GPUs")
        return ", ".join(found) + (f": {', '.join(held)}" if held and found else "")

    def _chain(self, name: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
        if name not in self._raw:
            raise ConfigError(f"unknown profile {name!r}; known profiles: {', '.join(self.names)}")
        if name in seen:
            raise ConfigError(f"profile {name!r}: 'extends' loops through {' -> '.join(seen)}")
        where, meta, limits = self._raw[name]
        parent = (
            meta.extends if meta.extends is not None else (None if name == "default" else "default")
        )
        merged: dict[str, Any] = {}
        if parent is not None:
            if parent not in self._raw:
                raise ConfigError(f"{where}: extends unknown profile {parent!r}")
            merged.update(self._chain(parent, (*seen, name)))
        merged.update(limits)
        return merged

    def get(self, name: str) -> Profile:
        """Resolve a profile through its `extends` chain; unknown names are a ConfigError."""
        if name not in self._resolved:
            values = self._chain(name)
            self._resolved[name] = Profile(name, validate(self._raw[name][0], values))
        return self._resolved[name]

    def contradiction(self, name: str, platform: Platform | None) -> str:
        """A note when the inventory names a profile whose own name patterns and device ids
        fit none of the node's GPUs (a gb200 inventory on an H100 node judges it by another
        GPU's limits); "" when they fit, when the profile declares none, or when the node's
        GPUs are unknown."""
        meta = self._raw[name][1]
        if platform is None or not meta.identifies:
            return ""
        if not platform.products and not platform.device_ids:
            return ""
        if _weigh(name, meta, platform) is not None:
            return ""
        return (
            f"the inventory names gpu_profile {name} ({self.identified_by(name)}), but the "
            f"node's GPUs are {platform.gpus()}: its limits are another GPU's; check gpu_profile"
        )

    def match(self, platform: Platform | None) -> Profile:
        """The profile a host is identified as (None: not probed yet), with the reason;
        `default`, saying why, when none is, or when the GPUs are of more than one product, or
        when two profiles fit equally well (each piece of evidence counts one). The choice is
        never the first GPU's or the first profile's by accident."""
        if platform is None:
            platform = Platform()
        default = self.get("default")
        if platform.mixed:
            why = f"mixed GPUs: {platform.gpus()}"
            return replace(default, reason=why, note=f"judged by profile default: {why}")
        found = [
            c
            for name in self.names
            if (c := _weigh(name, self._raw[name][1], platform)) is not None
        ]
        fits = [c for c in found if c.refuted is None]
        refused = "; ".join(
            f"{c.name} (by {', '.join(c.evidence)}) refused: {c.refuted}"
            for c in found
            if c.refuted is not None
        )
        if not fits:
            if not platform.products and not platform.device_ids:
                return replace(default, reason="no GPU product name or device id known")
            if refused:
                return replace(
                    default, reason=refused, note=f"judged by profile default: {refused}"
                )
            return replace(default, reason=f"no profile matches {platform.gpus()}")
        best = max(len(c.evidence) for c in fits)
        top = [c for c in fits if len(c.evidence) == best]
        if len(top) > 1:
            tie = " and ".join(f"{c.name} (by {', '.join(c.evidence)})" for c in top)
            why = f"{tie} match equally"
            note = f"judged by profile default: {why}; name one with gpu_profile"
            return replace(default, reason=why, note=note)
        (chosen,) = top
        reason = ", ".join([*chosen.evidence, *([platform.location] if platform.location else [])])
        # Evidence for a profile that other facts refute: the chosen one stands, said so.
        note = f"judged by profile {chosen.name}: {refused}" if refused else ""
        return replace(self.get(chosen.name), reason=reason, note=note)
