"""The IMEX family's facts: the `imex` section (the nvidia-imex service and its domain).
Node side: Python 3.6 and the standard library."""

from gpuhealth import schema as s

NEEDS = ("system",)  # asks systemd the way the system family does
PROFILE_KEYS = ("imex_required", "system_command_timeout_s", "imex_ctl_timeout_s")

IMEX = s.Record(
    "Imex",
    "the nvidia-imex service and the state of its domain",
    s.section_fields(
        s.Field("service", s.TEXT, "systemctl is-active nvidia-imex"),
        s.Field("addresses", s.list_of(s.TEXT), "the node's own IP addresses, sorted"),
        s.Field(
            "domain",
            s.map_of(s.ANY),
            "`nvidia-imex-ctl -N`: `domain_state`, `nodes` [{index, address, state, version}], "
            "`connections` (codes, rows and columns following `nodes`), `timestamp`",
        ),
    ),
)
SECTIONS = (s.Section(s.Field("imex", IMEX, "the IMEX domain")),)
