"""Kernel-log family: XIDs per GPU, NVSwitch SXIDs, peermem errors, fabric manager log."""
