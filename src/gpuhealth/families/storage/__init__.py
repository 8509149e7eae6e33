"""Storage family: the paths jobs read and write, network mounts, Lustre health."""
