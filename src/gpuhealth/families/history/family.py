"""The history family: regressions against each node's and GPU's own baseline.

Its `history` section is neither probed nor a load test: the controller adds it to each host's
facts from the run store (gpuhealth.history), the host's recent runs as samples.
"""

from gpuhealth.registry import declare

FAMILY = declare(
    __package__,
    "History",
    {"history": "regression checks against the run history (--history)"},
)
