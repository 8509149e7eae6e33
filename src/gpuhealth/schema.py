"""The language the families describe their facts sections in (docs/facts-schema.md).

Each family's `schema.py` declares, with these types, the sections it writes (every field's
type, unit and meaning), the families it builds on (`NEEDS`) and the profile keys its node side
reads (`PROFILE_KEYS`); optionally `READS`, sections of later families its checks consult
when present without building on them. The rest is derived: the registry's section names, the
validation of saved facts (gpuhealth.documents), the probe's order (gpuhealth.probe.main) and
the schema document (gpuhealth.schema_doc). Node side: Python 3.6 and the standard library.
"""

import json
from typing import Any, List, Mapping, Optional, Sequence, Tuple

# Who writes a section: the family's node-side probe, its load test run from the controller,
# the controller itself (history, from the run store), or only `gpuhealth triage`.
WRITERS = ("probe", "load test", "controller", "triage")

# Units by the ending of a key's name (units are in key names); a Field may say otherwise.
UNIT_ENDINGS = (
    ("_mib", "MiB"),
    ("_kb", "KiB"),
    ("_bytes", "bytes"),
    ("_gb", "GiB"),
    ("_gbps", "Gbit/s"),
    ("_pct", "%"),
    ("_us", "µs"),
    ("_c", "°C"),
    ("_w", "W"),
    ("_h", "hours"),
    ("_s", "seconds"),
)


class Type:
    """A value's type: a scalar `kind` (text, int, number, flag, false, literal, any) with its
    bounds, or a container (list, map, oneof) of other types, or a Record."""

    def __init__(
        self,
        kind: str,
        of: Sequence["Type"] = (),
        ge: Optional[int] = None,
        le: Optional[int] = None,
        max_length: Optional[int] = None,
        pattern: Optional[str] = None,
        value: Any = None,
    ) -> None:
        self.kind = kind
        self.of = tuple(of)
        self.ge = ge
        self.le = le
        self.max_length = max_length
        self.pattern = pattern
        self.value = value

    def describe(self) -> str:
        """The type in words, as the schema document writes it."""
        if self.kind in ("list", "map"):
            words = self.of[0].describe()
            if self.of[0].kind == "oneof":
                words = f"({words})"
            return f"{'list' if self.kind == 'list' else 'map'} of {words}"
        if self.kind == "oneof":
            return " or ".join(t.describe() for t in self.of)
        if self.kind == "literal":
            return json.dumps(self.value)
        words = self.kind
        bounds = []
        if self.ge is not None and self.le is not None:
            bounds.append(f"{self.ge}..{self.le}")
        elif self.ge is not None:
            bounds.append(f">= {self.ge}")
        elif self.le is not None:
            bounds.append(f"<= {self.le}")
        if self.max_length is not None:
            bounds.append(f"<= {self.max_length} chars")
        if self.pattern is not None:
            bounds.append(f"`{self.pattern}`")
        return f"{words} ({', '.join(bounds)})" if bounds else words


class Field:
    """One key of a record: its type, what it means, its unit (from the key's ending unless
    given; "" for none), whether it must be present and whether it may be null."""

    def __init__(
        self,
        name: str,
        type: Type,
        meaning: str,
        unit: Optional[str] = None,
        required: bool = False,
        nullable: bool = True,
    ) -> None:
        self.name = name
        self.type = type
        self.meaning = meaning
        self.unit = unit_of(name) if unit is None else unit
        self.required = required
        self.nullable = nullable


class Record(Type):
    """A JSON object of known fields; keys not declared are kept as they are (of `extra`'s
    type where one is given)."""

    def __init__(
        self,
        name: str,
        meaning: str,
        fields: Sequence[Field],
        extra: Optional[Type] = None,
    ) -> None:
        super().__init__("record")
        self.name = name
        self.meaning = meaning
        self.fields = tuple(fields)
        self.extra = extra
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"record {name} declares a field twice")

    def describe(self) -> str:
        return "object"


class Section:
    """A top-level key of the facts document, who writes it (one of WRITERS) and what the
    schema document says about it beyond its fields (`notes`, Markdown)."""

    def __init__(
        self,
        field: Field,
        writer: str = "probe",
        notes: str = "",
    ) -> None:
        if writer not in WRITERS:
            raise ValueError(f"section {field.name}: unknown writer {writer!r}")
        self.field = field
        self.name = field.name
        self.writer = writer
        self.notes = notes


def unit_of(name: str) -> str:
    """The unit a key's name gives, "" for none."""
    for ending, unit in UNIT_ENDINGS:
        if name.endswith(ending):
            return unit
    return ""


def scalar(kind: str, **bounds: Any) -> Type:
    """A scalar type with bounds (ge, le, max_length, pattern)."""
    return Type(kind, **bounds)


def list_of(of: Type) -> Type:
    """A JSON array of one type."""
    return Type("list", (of,))


def map_of(of: Type) -> Type:
    """A JSON object of any keys with values of one type."""
    return Type("map", (of,))


def one_of(*types: Type) -> Type:
    """Any of these types, tried in order."""
    return Type("oneof", types)


def literal(value: Any) -> Type:
    """Exactly this value."""
    return Type("literal", value=value)


NULL = literal(None)
TEXT = scalar("text")
INT = scalar("integer")
COUNT = scalar("integer", ge=0)
NUMBER = scalar("number")
FLAG = scalar("boolean")
ANY = scalar("any")
ID64 = scalar("text", max_length=64)  # the run store's bounded identity columns

REASON = Record(
    "Reason",
    "why a value is null",
    (
        Field("kind", TEXT, "not_supported, error, timeout or absent", required=True),
        Field("detail", TEXT, "the source's words", required=True),
    ),
)
# A record's `unavailable`: field -> why it is null. Kept loose (a map of any objects): the
# checks read it with .get() and old documents spell it in more ways than the probe does now.
REASONS = map_of(map_of(ANY))


def unavailable() -> Field:
    """The `unavailable` field every record with nullable values carries."""
    return Field(
        "unavailable",
        REASONS,
        "why a null value is null: its key -> {kind, detail} (kind: not_supported, error, "
        "timeout or absent)",
        nullable=False,
    )


def section_fields(*fields: Field) -> Tuple[Field, ...]:
    """A section's own fields plus `skipped` (the section does not apply to the host, and why)
    and `unavailable`."""
    return (
        *fields,
        Field("skipped", TEXT, "why the section does not apply to this host (then alone)"),
        unavailable(),
    )


def load_test_fields(*fields: Field) -> Tuple[Field, ...]:
    """A load test's section: its own fields plus what every load test says of its run."""
    return section_fields(
        Field("command", TEXT, "the command line run"),
        Field("rc", INT, "its exit code"),
        Field("duration_s", NUMBER, "how long it ran"),
        Field("nodes", INT, "nodes the run spanned"),
        Field("error", TEXT, "why the run produced no result"),
        Field("action", TEXT, "the action code when there is no result"),
        Field("advice", TEXT, "what to do about it"),
        *fields,
    )


def written(sections: Sequence[Section]) -> Tuple[str, ...]:
    """The names of the sections a family's probe writes (a probe's SECTIONS: set to null
    when the probe fails, so a check can tell a failed probe from an older one)."""
    return tuple(section.name for section in sections if section.writer == "probe")


def needs_order(needs: Mapping[str, Sequence[str]], order: Sequence[str]) -> List[str]:
    """The names of `order` so that every family comes after those it needs (otherwise in
    `order`'s order). A need that is not a family, or a cycle, is a ValueError."""
    placed: List[str] = []
    visiting: List[str] = []

    def place(name: str) -> None:
        if name in placed:
            return
        if name in visiting:
            cycle = visiting[visiting.index(name) :] + [name]
            raise ValueError("families need each other in a circle: " + " -> ".join(cycle))
        if name not in needs:
            raise ValueError(f"{visiting[-1]} needs {name!r}, which is not a family")
        visiting.append(name)
        for other in needs[name]:
            place(other)
        visiting.pop()
        placed.append(name)

    for name in order:
        place(name)
    return placed


# ---------------------------------------------------------- the document's own keys

# The profile keys the probe core reads (gpuhealth.probe.main, gpuhealth.probe.state).
CORE_PROFILE_KEYS = ("node_state",)

CORE_SECTIONS = (
    Section(
        Field(
            "schema_version",
            literal(3),
            "the document's layout (2 is read too, and upgraded)",
            required=True,
            nullable=False,
        )
    ),
    Section(Field("probe_version", ANY, "the probe that wrote the document")),
    Section(Field("collected_at", ANY, "when, UTC (`2026-11-22T02:40:00Z`)")),
    Section(Field("duration_s", ANY, "how long the probe ran", unit="seconds")),
    Section(
        Field(
            "host",
            map_of(ANY),
            "`hostname`, `kernel`, `arch`, `os` and `python` (the Python that ran the probe)",
        )
    ),
    Section(
        Field(
            "errors",
            list_of(map_of(ANY)),
            "every failure of a family's probe, in order: `{probe, error, call}`",
            nullable=False,
        )
    ),
    Section(
        Field(
            "pci",
            Record(
                "Pci",
                "the NVIDIA GPUs on the PCI bus, driver or not",
                (
                    Field(
                        "nvidia_gpus",
                        list_of(TEXT),
                        "bus ids of NVIDIA display/3D controllers in /sys/bus/pci/devices",
                    ),
                    Field("device_nodes", COUNT, "/dev/nvidiaN nodes this process sees"),
                    unavailable(),
                ),
            ),
            "the GPUs on the PCI bus, independent of the driver",
        )
    ),
    Section(
        Field(
            "node_state",
            map_of(ANY),
            "the state the node is judged in: `state` (idle, in-use), `requested`, `source`",
        )
    ),
    Section(
        Field("evidence", ANY, "the saved files a triage document was built from"),
        writer="triage",
    ),
)
