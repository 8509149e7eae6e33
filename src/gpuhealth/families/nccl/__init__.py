"""NCCL family: nccl-tests all_reduce bandwidth and data integrity (load tests)."""
