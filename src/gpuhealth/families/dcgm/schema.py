"""The DCGM family's facts: the health watches (`dcgm_health`, from the probe) and the
diagnostic (`dcgm`, a load test). Node side: Python 3.6 and the standard library."""

from gpuhealth import schema as s

NEEDS = ("gpu",)  # a diagnostic's results are judged per GPU of the GPU family
PROFILE_KEYS = ("dcgm_installed", "dcgm_health_timeout_s")

# Required: keys the parsers always write (null: DCGM did not print it), which the checks index.

RESULT = s.Record(
    "DcgmResult",
    "one result of a diagnostic test",
    (
        s.Field(
            "gpus",
            s.list_of(s.INT),
            "the GPUs' indices (`[]`: node-wide)",
            required=True,
            nullable=False,
        ),
        s.Field("entity", s.TEXT, "a non-GPU entity (4.x)", required=True),
        s.Field("status", s.TEXT, "Pass, Fail, Warn, Skip, Not Run", required=True),
        s.Field("info", s.list_of(s.TEXT), "DCGM's info messages", required=True, nullable=False),
        s.Field("warnings", s.list_of(s.TEXT), "DCGM's warnings", required=True, nullable=False),
    ),
)
TEST = s.Record(
    "DcgmTest",
    "one diagnostic test",
    (
        s.Field("name", s.TEXT, "the test", required=True, nullable=False),
        s.Field("summary", s.TEXT, "its overall status", required=True),
        s.Field("results", s.list_of(RESULT), "its results", required=True, nullable=False),
    ),
)
DIAG = s.Record(
    "DcgmDiag",
    "`dcgmi diag -j`, parsed",
    (
        s.Field("runtime_error", s.TEXT, "DCGM's error when the diagnostic did not run"),
        s.Field("tests", s.list_of(TEST), "the tests run", required=True, nullable=False),
    ),
)
INCIDENT = s.Record(
    "DcgmIncident",
    "one entity's health in one subsystem",
    (
        s.Field("entity", s.TEXT, "`GPU 3`, `NvSwitch 0`", required=True),
        s.Field("system", s.TEXT, "the subsystem (`PCIe system`)", required=True),
        s.Field("health", s.TEXT, "Healthy, Warning, Failure", required=True),
        s.Field("message", s.TEXT, "DCGM's message", required=True),
    ),
)
HEALTH = s.Record(
    "DcgmHealthReport",
    "`dcgmi health -c -j`, parsed",
    (
        s.Field("overall", s.TEXT, "Healthy, Warning, Failure", required=True),
        s.Field(
            "incidents",
            s.list_of(INCIDENT),
            "every entity's subsystems",
            required=True,
            nullable=False,
        ),
    ),
)
SECTIONS = (
    s.Section(
        s.Field(
            "dcgm_health",
            s.Record(
                "DcgmHealth",
                "DCGM's health watches",
                s.section_fields(s.Field("health", HEALTH, "what the health watches report")),
            ),
            "DCGM's health watches",
        )
    ),
    s.Section(
        s.Field(
            "dcgm",
            s.Record(
                "DcgmRun",
                "a DCGM diagnostic run",
                s.load_test_fields(
                    s.Field("level", s.ANY, "the diagnostic's level (`-r`)"),
                    s.Field("diag", DIAG, "the diagnostic's results"),
                ),
            ),
            "the DCGM diagnostic (--level standard|full)",
        ),
        writer="load test",
    ),
)
