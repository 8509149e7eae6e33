"""History family: each node and GPU compared with its own past runs (controller side)."""
