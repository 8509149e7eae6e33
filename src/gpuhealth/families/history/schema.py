"""The history family's facts: the `history` section the controller adds from the run store.
Node side: Python 3.6 and the standard library."""

from gpuhealth import schema as s

NEEDS = ("gpu",)  # follows GPUs by the GPU family's serials, the node by its driver
PROFILE_KEYS = ()  # no node side
# The section the controller adds from the run store, never the probe.
HISTORY_SECTION = "history"
SECTIONS = (
    s.Section(
        s.Field(
            HISTORY_SECTION,
            s.map_of(s.ANY),
            "the host's recent runs from the run store, as samples of each metric",
        ),
        writer="controller",
    ),
)
