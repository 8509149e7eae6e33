"""The system family: the host around the GPUs."""

from gpuhealth.registry import declare

FAMILY = declare(__package__, "Host")
