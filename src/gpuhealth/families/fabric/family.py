"""The fabric family: EFA on AWS, InfiniBand elsewhere, as the host's `fabric` says."""

from gpuhealth.registry import declare

FAMILY = declare(__package__, "Fabric")
