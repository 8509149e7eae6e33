"""The NCCL family: nccl-tests bandwidth and data integrity, per node and across nodes."""

from gpuhealth.registry import declare

FAMILY = declare(__package__, "NCCL", {"nccl": "NCCL bandwidth checks (nccl-tests)"})
