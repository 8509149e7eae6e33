"""gpuhealth: commissioning and regression checks for GPU cluster nodes."""

__version__ = "0.2.0"
