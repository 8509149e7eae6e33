"""The kernel-log family's facts: the NVIDIA events of the kernel log (`kernel_log`) and of
the fabric manager's log (`fabric_manager`). Node side: Python 3.6 and the standard library."""

from gpuhealth import schema as s

NEEDS = ("gpu",)  # an XID is judged per GPU, by the GPU family's bus ids
PROFILE_KEYS = ("xid_window_h", "kernel_log_timeout_s")

_TIME = s.TEXT  # ISO 8601; UTC with `Z`, naive where the log has no zone
LOG_GROUP = s.Record(
    "LogGroup",
    "events of one kind, device and code, counted",
    (
        s.Field(
            "kind",
            s.TEXT,
            "`xid`, `sxid`, `fault`, `peermem`, `fabric_manager` or `unreadable`",
            required=True,
            nullable=False,
        ),
        s.Field("bus_id", s.TEXT, "the device, NVML's spelling", required=True),
        s.Field("code", s.INT, "the Xid or SXid number", required=True),
        s.Field(
            "count",
            s.scalar("integer", ge=1),
            "how many events",
            required=True,
            nullable=False,
        ),
        s.Field("first", _TIME, "the first event's time", required=True),
        s.Field("first_uptime_s", s.NUMBER, "the first event's boot-clock time", required=True),
        s.Field("last", _TIME, "the last event's time", required=True),
        s.Field("last_uptime_s", s.NUMBER, "the last event's boot-clock time", required=True),
        s.Field("sample", s.TEXT, "the first event's text", required=True, nullable=False),
    ),
)
LOG_EVENT = s.Record(
    "LogEvent",
    "one kernel-log event",
    (
        s.Field("kind", s.TEXT, "as for its group", required=True, nullable=False),
        s.Field("time", _TIME, "when", required=True),
        s.Field("uptime_s", s.NUMBER, "when, on the boot clock", required=True),
        s.Field("bus_id", s.TEXT, "the device"),
        s.Field("code", s.INT, "the Xid or SXid number"),
        s.Field("text", s.TEXT, "the event's message", required=True, nullable=False),
    ),
)
KERNEL_LOG = s.Record(
    "KernelLog",
    "the NVIDIA events of a log within a window",
    s.section_fields(
        s.Field("source", s.TEXT, "the reader that worked (`journalctl -k -o short-iso`)"),
        s.Field("window_h", s.NUMBER, "the window looked at (0: since boot)"),
        s.Field("since", _TIME, "the window's start"),
        s.Field("until", _TIME, "the window's end"),
        s.Field("until_uptime_s", s.NUMBER, "the window's end on the boot clock"),
        s.Field("notes", s.list_of(s.TEXT), "why earlier readers were passed over"),
        s.Field("counts", s.list_of(LOG_GROUP), "one group per kind, device and code"),
        s.Field("events", s.list_of(LOG_EVENT), "each group's first and last 5 events"),
        s.Field("dropped", s.COUNT, "events left out of `events`"),
    ),
)
SECTIONS = (
    s.Section(s.Field("kernel_log", KERNEL_LOG, "NVIDIA events of the kernel log")),
    s.Section(s.Field("fabric_manager", KERNEL_LOG, "errors of the fabric manager's log")),
)
