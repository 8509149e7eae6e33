"""The GPU family: the driver gate and the health of every GPU, first of the families."""

from gpuhealth.registry import declare

FAMILY = declare(__package__, "GPUs")
