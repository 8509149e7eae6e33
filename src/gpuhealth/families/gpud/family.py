"""The GPUd family: the health GPUd reports for every component it watches, and its events."""

from gpuhealth.registry import declare

FAMILY = declare(__package__, "GPUd", {"gpud": "GPUd health checks"})
