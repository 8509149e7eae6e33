"""The kernel-log family: XIDs, NVSwitch SXIDs, peermem errors and the fabric manager log."""

from gpuhealth.registry import declare

FAMILY = declare(__package__, "Kernel log")
