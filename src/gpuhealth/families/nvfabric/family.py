"""The NVLink fabric family: judges the `fabric` record of every GPU (the GPU probe reads it)."""

from gpuhealth.registry import declare

FAMILY = declare(__package__, "NVLink fabric")
