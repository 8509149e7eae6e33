"""The check families, one folder each (see gpuhealth.registry for what a folder declares).

Shipped to the nodes with the probe, which runs the families' `probe.py` in this order.
"""

# One line per family, in report order: adding a family is adding its folder and its name here.
NAMES = (
    "gpu",
    "nvfabric",
    "system",
    "storage",
    "fabric",
    "imex",
    "kernel",
    "reclaim",
    "nccl",
    "dcgm",
    "gpud",
    "history",
)
