"""System checks per node: NUMA layout, numactl, host resources, memlock, modules, services.

GPU-node requirements skip on a host with nothing NVIDIA that expects no GPU; the resource
thresholds (CPUs, memory, disk space) apply to every host.
"""

from gpuhealth.plugin import judge


def test_numa_topology(node):
    """NUMA node count as expected; each GPU's NUMA node known and GPUs spread as expected."""
    judge("numa_topology", node)


def test_numactl(node):
    """numactl installed and `numactl --hardware` parses."""
    judge("numactl", node)


def test_host_resources(node):
    """CPUs, memory total/available, free space on / and scratch paths above the limits."""
    judge("host_resources", node)


def test_memlock_limit(node):
    """Memlock limit unlimited (or >= min_memlock_kb) for RDMA over efa/infiniband."""
    judge("memlock_limit", node)


def test_kernel_modules(node):
    """nvidia, nvidia_uvm loaded; nvidia_peermem for GPUDirect RDMA; efa on EFA hosts."""
    judge("kernel_modules", node)


def test_gpu_services(node):
    """nvidia-persistenced, nvidia-fabricmanager, nvidia-dcgm, gpud active where expected."""
    judge("gpu_services", node)
