"""GPU family: driver, GPU count and uniformity, the health of every GPU (NVML, nvidia-smi)."""
