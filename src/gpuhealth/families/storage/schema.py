"""The storage family's facts: the `storage` section (configured paths and network mounts).
Node side: Python 3.6 and the standard library."""

from gpuhealth import schema as s

NEEDS = ()
PROFILE_KEYS = ("storage_timeout_s", "storage_mount_types", "storage_paths")

_STEP = (
    s.Field("ok", s.FLAG, "every step succeeded"),
    s.Field("error", s.TEXT, "the step that failed and why (`read: permission denied`)"),
    s.Field("timed_out", s.FLAG, "the step ran out of `timeout_s`"),
    s.Field("elapsed_s", s.NUMBER, "time taken"),
)
STORAGE = s.Record(
    "Storage",
    "the paths jobs depend on and the network filesystems under them",
    s.section_fields(
        s.Field("timeout_s", s.NUMBER, "each path's and mount's time limit"),
        s.Field("mount_types", s.list_of(s.TEXT), "the filesystem types looked at (globs)"),
        s.Field(
            "paths",
            s.list_of(
                s.Record(
                    "StoragePath",
                    "one `storage_paths` entry as the probe found it",
                    (
                        s.Field("path", s.TEXT, "as configured", required=True, nullable=False),
                        *_STEP,
                        s.Field("kind", s.TEXT, "`file`, `dir` or `other`"),
                        s.Field("entries", s.COUNT, "a directory's entries (at most 1000)"),
                        s.Field("bytes_read", s.COUNT, "a file's bytes read (at most 4096)"),
                        s.Field("free_gb", s.NUMBER, "space available to non-root users"),
                        s.Field("wrote", s.FLAG, "a test file was written (null: not asked)"),
                    ),
                )
            ),
            "one record per `storage_paths` entry, in order",
        ),
        s.Field(
            "mounts",
            s.list_of(
                s.Record(
                    "Mount",
                    "one network filesystem mount",
                    (
                        s.Field("mountpoint", s.TEXT, "where", required=True, nullable=False),
                        s.Field("device", s.TEXT, "what (`10.20.0.5:/export/home`)"),
                        s.Field("fstype", s.TEXT, "its type (`nfs4`, `lustre`)"),
                        *_STEP,
                    ),
                )
            ),
            "every mount of a `mount_types` type, stat'ed and statfs'ed",
        ),
        s.Field("lustre_health_check", s.TEXT, "`healthy`, `NOT HEALTHY` or `LBUG`"),
    ),
)
SECTIONS = (s.Section(s.Field("storage", STORAGE, "storage paths and network mounts")),)
