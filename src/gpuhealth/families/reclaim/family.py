"""The memory-reclaim family: GPU memory left by the last job is freed within the wait."""

from gpuhealth.registry import declare

FAMILY = declare(__package__, "Memory reclaim")
