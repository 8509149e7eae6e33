"""The storage family: the paths jobs depend on, and the network filesystems under them."""

from gpuhealth.registry import declare

FAMILY = declare(__package__, "Storage")
