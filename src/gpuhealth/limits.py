"""The vocabulary of profile keys: the base model every family's `limits.py` subclasses, and
the value types keys are declared with (units are in the key names).

Below gpuhealth.config, which combines the families' models into profiles: the families import
this, config imports the registry of families, and nothing goes round in a circle. The run's
own keys and the keys several families read are declared here too (RunLimits, SharedLimits).
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)


class FamilyLimits(BaseModel):
    """The profile keys of one family: strict types (no "75" for 75, no 1 for true), no NaN or
    infinity, no unknown keys. Subclasses declare `key: type = Field(default, description=...)`."""

    model_config = ConfigDict(
        strict=True, extra="forbid", allow_inf_nan=False, frozen=True, validate_default=True
    )


# Field types of profile keys. Numbers keep their int-ness (85 stays 85, not 85.0).
Count = Annotated[StrictInt, Field(ge=0)]
Number = Annotated[StrictInt | StrictFloat, Field(ge=0)]
Seconds = Annotated[StrictInt | StrictFloat, Field(gt=0)]
Signed = StrictInt | StrictFloat
Celsius = Signed  # Blackwell reports thresholds as negative offsets
Flag = StrictBool
Text = StrictStr


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError("not an absolute path")
    return path


AbsolutePath = Annotated[StrictStr, AfterValidator(_absolute)]


def _driver_version(value: str | int) -> str:
    text = str(value)
    if not re.fullmatch(r"\d+(\.\d+)*", text):
        raise ValueError(f"must look like '570' or '570.124.06', got {value!r}")
    return text


DriverVersion = Annotated[StrictStr | StrictInt, AfterValidator(_driver_version)]


class RunLimits(FamilyLimits):
    """Keys of the run itself rather than of one family."""

    node_state: Literal["idle", "in-use", "auto"] = Field(
        "idle",
        description="the state the node is judged in: idle (every rule), in-use (a job owns "
        "the GPUs: fault rules only) or auto (Slurm, the kubelet, else compute processes say)",
    )

    probe_timeout_s: Seconds = Field(
        120, description="the whole probe on a node (killed there, and given up on here)"
    )


class SharedLimits(FamilyLimits):
    """Keys several families read: what the node has (its RDMA fabric, the services installed
    on it) and the NVLink domain it belongs to. They are declared once here, so no family
    imports another's model for them (families import each other only as their NEEDS say)."""

    fabric: Literal["none", "efa", "infiniband"] = Field(
        "none", description="the node's RDMA fabric: none, efa or infiniband"
    )
    dcgm_installed: Flag = Field(
        False, description="nvidia-dcgm is installed on the node and must run"
    )
    gpud_installed: Flag = Field(False, description="gpud is installed on the node and must run")
    nvlink_domain: Annotated[Text, Field(min_length=1, max_length=200)] | None = Field(
        None,
        description="the NVLink domain the node belongs to (an NVL72 rack or its partition, "
        "e.g. rack07): nodes with one value must report one clique and cluster UUID",
    )
