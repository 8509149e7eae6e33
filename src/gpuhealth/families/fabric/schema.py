"""The fabric family's facts: the `fabric` section (RDMA devices, their ports, fi_info).
Node side: Python 3.6 and the standard library."""

from gpuhealth import schema as s

NEEDS = ("gpu",)  # places the GPU family's GPUs next to the NICs
PROFILE_KEYS = ("fabric", "fi_info_timeout_s")

_COUNTERS = s.map_of(s.one_of(s.COUNT, s.NULL))
PORT = s.Record(
    "Port",
    "an RDMA device's port",
    (
        s.Field("port", s.INT, "the port's number", required=True, nullable=False),
        s.Field("state", s.TEXT, "the kernel's name (`ACTIVE`)"),
        s.Field("phys_state", s.TEXT, "the kernel's name (`LinkUp`)"),
        s.Field("rate_gbps", s.NUMBER, "the link rate"),
        s.Field("counters", _COUNTERS, "IB PortCounters: file name -> count"),
        s.Field("hw_counters", _COUNTERS, "driver counters: file name -> count"),
        s.unavailable(),
    ),
)
DEVICE = s.Record(
    "RdmaDevice",
    "an RDMA device (EFA, InfiniBand, RoCE)",
    (
        s.Field("name", s.scalar("text", max_length=64), "`mlx5_1`", required=True, nullable=False),
        s.Field("driver", s.TEXT, "`efa`, `mlx5_core`"),
        s.Field("fw_ver", s.ID64, "the firmware version"),
        s.Field("ports", s.list_of(PORT), "its ports"),
        s.unavailable(),
    ),
)
FABRIC = s.Record(
    "Fabric",
    "the RDMA devices, the GPUs' PCI placement and fi_info",
    s.section_fields(
        s.Field("devices", s.list_of(DEVICE), "every RDMA device, sorted by name"),
        s.Field(
            "gpu_pci",
            s.ANY,
            "where each GPU sits on the PCI tree, by sysfs name: `{function, path, numa_node}`",
        ),
        s.Field(
            "fi_info",
            s.map_of(s.ANY),
            "`fi_info -p efa -t FI_EP_RDM`: `status`, `domains`, `libfabric_version`, ...",
        ),
    ),
)
SECTIONS = (s.Section(s.Field("fabric", FABRIC, "RDMA devices and their ports")),)
