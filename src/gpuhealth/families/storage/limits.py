"""Profile keys of the storage family: the paths jobs depend on and the network mounts.

Sizes in _gb are GiB (2^30 bytes), as `df -h` prints them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictStr

from gpuhealth.limits import AbsolutePath, FamilyLimits, Flag, Number, Seconds


class StoragePath(BaseModel):
    """One entry of storage_paths: `/datasets`, or `{path, writable, min_free_gb}`."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)

    path: AbsolutePath
    writable: Flag = False
    min_free_gb: Number | None = None


def _fstype(value: str) -> str:
    if not value.strip():
        raise ValueError("not a filesystem type")
    return value


def _entry(value: object) -> object:
    return {"path": value} if isinstance(value, str) else value


class StorageLimits(FamilyLimits):
    """Paths are checked in killable child processes, each within storage_timeout_s."""

    storage_paths: list[Annotated[StoragePath, BeforeValidator(_entry)]] = Field(
        [], description="absolute paths, or {path, writable, min_free_gb} mappings"
    )
    storage_timeout_s: Seconds = Field(
        5, description="per-path and per-mount timeout of the storage probe"
    )
    storage_mount_types: list[Annotated[StrictStr, AfterValidator(_fstype)]] = Field(
        [], description="fstype globs checked besides lustre, nfs, nfs4 (wekafs, fuse.*)"
    )
    storage_min_free_gb: Number | None = Field(
        None, description="free space every storage path must have (null: none)"
    )
