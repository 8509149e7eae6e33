"""System family: NUMA layout, numactl, host resources, memlock, kernel modules, services."""
