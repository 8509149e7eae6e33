"""The memory-reclaim family's facts: the `memory_reclaim` section.
Node side: Python 3.6 and the standard library."""

from gpuhealth import schema as s

NEEDS = ("gpu",)  # polls the GPUs the GPU family found, over its NVML
PROFILE_KEYS = (
    "expect_idle",
    "max_idle_memory_used_mib",
    "reclaim_wait_s",
    "reclaim_poll_s",
    "nvml_call_timeout_s",
)

RECLAIM = s.Record(
    "Reclaim",
    "GPU memory left by the last job, polled until it is freed",
    s.section_fields(
        s.Field("threshold_mib", s.NUMBER, "memory in use that counts as free"),
        s.Field("wait_s", s.NUMBER, "the longest wait"),
        s.Field("poll_s", s.NUMBER, "time between polls"),
        s.Field("waited_s", s.NUMBER, "time waited"),
        s.Field("polls", s.COUNT, "polls made"),
        s.Field("error", s.TEXT, "an NVML call that failed while polling"),
        s.Field(
            "gpus",
            s.list_of(
                s.Record(
                    "ReclaimGpu",
                    "one GPU's memory before and after the wait",
                    (
                        s.Field("index", s.INT, "NVML's index", required=True, nullable=False),
                        s.Field("used_mib", s.NUMBER, "in use after the wait"),
                        s.Field("initial_used_mib", s.NUMBER, "in use in the GPU family's pass"),
                        s.Field("total_mib", s.NUMBER, "the GPU's memory"),
                        s.Field(
                            "processes",
                            s.list_of(s.map_of(s.ANY)),
                            "compute processes of a GPU still above the threshold",
                        ),
                        s.unavailable(),
                    ),
                )
            ),
            "one record per GPU of the GPU family's pass",
        ),
    ),
)
SECTIONS = (s.Section(s.Field("memory_reclaim", RECLAIM, "GPU memory freed after a job")),)
