"""The GPUd family's facts: GPUd's health states (`gpud`) and events (`gpud_events`).
Node side: Python 3.6 and the standard library."""

from gpuhealth import schema as s

NEEDS = ()
PROFILE_KEYS = ("gpud_installed", "gpud_address", "gpud_timeout_s", "gpud_events_window_h")

GPUD = s.Record(
    "Gpud",
    "what GPUd's API answered",
    s.section_fields(
        s.Field("address", s.TEXT, "GPUd's address (`https://127.0.0.1:15132`)"),
        s.Field("since", s.ANY, "the events' window start (`gpud_events`)"),
        s.Field("healthz", s.map_of(s.ANY), "GPUd's /healthz answer"),
        s.Field(
            "states",
            s.list_of(
                s.Record(
                    "GpudState",
                    "one health state of /v1/states",
                    (
                        s.Field(
                            "component", s.TEXT, "the component", required=True, nullable=False
                        ),
                        s.Field("name", s.TEXT, "the state's name"),
                        s.Field("health", s.TEXT, "Healthy, Unhealthy, Degraded, Initializing"),
                        s.Field("reason", s.TEXT, "GPUd's reason"),
                        s.Field("error", s.TEXT, "GPUd's error"),
                        s.Field("repair_actions", s.list_of(s.TEXT), "`REBOOT_SYSTEM`, ..."),
                    ),
                )
            ),
            "/v1/states flattened: one entry per state, with its component",
        ),
        s.Field(
            "events",
            s.list_of(
                s.Record(
                    "GpudEvent",
                    "one event of /v1/events",
                    (
                        s.Field(
                            "component", s.TEXT, "the component", required=True, nullable=False
                        ),
                        s.Field("time", s.TEXT, "when"),
                        s.Field("name", s.TEXT, "the event's name"),
                        s.Field("type", s.TEXT, "Info, Warning, Critical, Fatal"),
                        s.Field("message", s.TEXT, "GPUd's message"),
                        s.Field("unknown", s.FLAG, "GPUd answered null: its events unknown"),
                    ),
                )
            ),
            "the last `gpud_events_window_h` hours of events (`gpud_events`)",
        ),
    ),
)
SECTIONS = (
    s.Section(s.Field("gpud", GPUD, "GPUd's health states")),
    s.Section(s.Field("gpud_events", GPUD, "GPUd's recent events")),
)
