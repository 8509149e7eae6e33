"""The NVLink fabric family: the `fabric` record of every GPU, which its probe reads over the
GPU family's NVML session (nvidia-smi's Fabric block comes with the GPU family's records)."""

from gpuhealth.registry import declare

FAMILY = declare(__package__, "NVLink fabric")
