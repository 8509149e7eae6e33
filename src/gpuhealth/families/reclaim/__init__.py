"""Memory-reclaim family: GPU memory a finished job left behind is freed within a wait."""
