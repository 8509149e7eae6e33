"""The system family's facts: the `system` section (the host around the GPUs).
Node side: Python 3.6 and the standard library."""

from gpuhealth import schema as s

NEEDS = ("gpu",)  # the GPUs' NUMA nodes are those of the GPU family's bus ids
PROFILE_KEYS = ("system_command_timeout_s", "scratch_paths")

NUMA_NODE = s.Record(
    "NumaNode",
    "a NUMA node as the kernel or numactl lists it",
    (
        s.Field("node", s.INT, "the node's number", required=True, nullable=False),
        s.Field("cpus", s.TEXT, "its CPUs in the kernel's range form, `0-55,112-167`"),
        s.Field("cpu_count", s.COUNT, "how many CPUs (0: a memory-only node)"),
    ),
)
DISK = s.Record(
    "Disk",
    "a path's filesystem space (statvfs)",
    (
        s.Field("path", s.TEXT, "the path measured", required=True, nullable=False),
        s.Field("total_bytes", s.COUNT, "the filesystem's size"),
        s.Field("free_bytes", s.COUNT, "what non-root users can write (df's Avail)"),
        s.unavailable(),
    ),
)
NUMACTL = s.Record(
    "Numactl",
    "`numactl --hardware`: whether it ran and what it printed",
    (
        s.Field("available", s.FLAG, "numactl is on the PATH"),
        s.Field("rc", s.INT, "its exit code (null: did not run, timed out)"),
        s.Field("error", s.TEXT, "why `hardware` is null"),
        s.Field(
            "hardware",
            s.Record(
                "NumactlHardware",
                "the nodes numactl lists",
                (
                    s.Field(
                        "available_nodes",
                        s.COUNT,
                        "`available: N nodes`",
                        required=True,
                        nullable=False,
                    ),
                    s.Field(
                        "nodes", s.list_of(NUMA_NODE), "the nodes", required=True, nullable=False
                    ),
                    s.Field(
                        "distances",
                        s.list_of(s.list_of(s.COUNT)),
                        "the SLIT distances, rows and columns following `nodes`",
                    ),
                ),
            ),
            "what numactl printed, parsed",
        ),
    ),
)
MACHINE = s.Record(
    "Machine",
    "the machine's identities: what the run store follows a node by",
    (
        s.Field("product_serial", s.ID64, "the DMI system serial"),
        s.Field("product_uuid", s.ID64, "the DMI system UUID"),
        s.Field("board_serial", s.ID64, "the DMI board serial"),
        s.Field("machine_id", s.ID64, "the OS's machine id (re-imaging changes it)"),
        s.unavailable(),
    ),
)
SYSTEM = s.Record(
    "System",
    "the host around the GPUs",
    s.section_fields(
        s.Field("numa_nodes", s.list_of(NUMA_NODE), "the kernel's NUMA nodes"),
        s.Field(
            "gpu_numa_nodes",
            s.map_of(s.one_of(s.INT, s.NULL)),
            "bus id -> numa_node of every NVIDIA GPU on the bus (-1: the firmware gives none)",
        ),
        s.Field("numactl", NUMACTL, "numactl --hardware"),
        s.Field("cpus_online", s.COUNT, "CPUs online (/sys/devices/system/cpu/online)"),
        s.Field("cpus_present", s.COUNT, "CPUs present"),
        s.Field("cpus_usable", s.COUNT, "CPUs in the probe's affinity mask (cgroup, Slurm)"),
        s.Field("memory_total_kb", s.COUNT, "MemTotal of /proc/meminfo"),
        s.Field("memory_available_kb", s.COUNT, "MemAvailable of /proc/meminfo"),
        s.Field("disks", s.list_of(DISK), "`/` and every `scratch_paths` entry"),
        s.Field(
            "memlock_kb",
            s.map_of(s.one_of(s.COUNT, s.TEXT, s.NULL)),
            "RLIMIT_MEMLOCK of the probe process: `soft`, `hard` (KiB or `unlimited`)",
        ),
        s.Field("kernel_modules", s.list_of(s.TEXT), "modules in state Live in /proc/modules"),
        s.Field(
            "services",
            s.map_of(s.one_of(s.TEXT, s.NULL)),
            "systemctl is-active of nvidia-persistenced, nvidia-fabricmanager, nvidia-dcgm, gpud",
        ),
        s.Field("machine", MACHINE, "the machine's identities, whatever its host name"),
    ),
)
SECTIONS = (s.Section(s.Field("system", SYSTEM, "the host around the GPUs")),)
