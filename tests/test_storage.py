"""Storage checks, one test per check, parametrised as test_x[<host>].

Paths come from the inventory var `storage_paths`; mounts of lustre/nfs/nfs4 (plus
`storage_mount_types`) are found on the node.
"""

from gpuhealth.plugin import judge


def test_storage_paths(node):
    """Every storage path readable, writable where marked, with the free space it needs."""
    judge("storage_paths", node)


def test_distributed_mounts(node):
    """Every Lustre/NFS mount answers within the timeout; Lustre health_check reads healthy."""
    judge("distributed_mounts", node)
