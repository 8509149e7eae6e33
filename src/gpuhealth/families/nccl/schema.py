"""The NCCL family's facts: the `nccl` section its load test (or triage) adds.
Node side: Python 3.6 and the standard library."""

from gpuhealth import schema as s

# Bandwidth is judged per GPU count and GPU product, and across nodes against the network the
# fabric family's keys describe (its devices, ports and rates).
NEEDS = ("gpu", "fabric")
PROFILE_KEYS = ()  # no node side: the load test runs from the controller

_PLACE = s.Record(
    "NcclPlace",
    "one row's out-of-place or in-place result",
    (
        s.Field("time_us", s.NUMBER, "time per operation"),
        s.Field("algbw_gbps", s.NUMBER, "algorithm bandwidth", unit="GB/s"),
        s.Field("busbw_gbps", s.NUMBER, "bus bandwidth", unit="GB/s"),
        s.Field("wrong", s.COUNT, "wrong elements (null: not validated)"),
    ),
)
RUN = s.Record(
    "NcclRun",
    "an nccl-tests log, parsed",
    (
        s.Field("hosts", s.list_of(s.TEXT), "the hosts its ranks ran on"),
        s.Field(
            "rows",
            s.list_of(
                s.Record(
                    "NcclRow",
                    "one row of the table",
                    (
                        s.Field("size", s.COUNT, "message size", "bytes", True, False),
                        s.Field("out_of_place", _PLACE, "out-of-place result"),
                        s.Field("in_place", _PLACE, "in-place result"),
                    ),
                )
            ),
            "the table's rows",
            required=True,
            nullable=False,
        ),
    ),
)
SECTIONS = (
    s.Section(
        s.Field(
            "nccl",
            s.Record(
                "NcclSection",
                "an nccl-tests run",
                s.load_test_fields(
                    s.Field("hosts", s.list_of(s.TEXT), "the hosts the run spanned"),
                    s.Field("nvlink_domains", s.ANY, "the NVLink domains a run spans"),
                    s.Field("run", RUN, "the parsed log"),
                ),
            ),
            "nccl-tests bandwidth and data integrity (--level standard|full)",
        ),
        writer="load test",
    ),
)
