"""The DCGM family: the diagnostic (a load test) and the health watches (from the probe)."""

from gpuhealth.registry import declare

FAMILY = declare(__package__, "DCGM", {"dcgm": "DCGM diagnostic and health checks"})
