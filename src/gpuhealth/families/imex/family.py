"""The IMEX family: the nvidia-imex service and the state of its domain (`nvidia-imex-ctl -N`)."""

from gpuhealth.registry import declare

FAMILY = declare(__package__, "IMEX", {"imex": "IMEX (multi-node NVLink memory domain) checks"})
