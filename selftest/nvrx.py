"""The launcher's side of the node health service contract: a gRPC client built from the same
proto, asking as NVIDIA's ft_launcher (nvidia-resiliency-ext's NodeHealthCheck) asks, and its
decision rule. Used by selftest/test_serve.py and by the bed (selftest/test_roles.py)."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import grpc

from gpuhealth.integrations import nvhcd_pb2, nvhcd_pb2_grpc

# What ft_launcher sends (newer releases; older ones only "--no-slurm") and how long it waits.
NVRX_ARGS = ["--no-slurm", "--group", "prolog", "epilog", "logs", "gpu"]
NVRX_TIMEOUT_S = 60


def nvrx_healthy(response: Any) -> bool:
    """NodeHealthCheck's rule: unhealthy iff `success` is false, or `output` is not JSON, or
    its `fail_count` is missing or not 0. (Its RPC errors count as healthy; here they raise.)"""
    if not response.success:
        return False
    try:
        document = json.loads(response.output)
    except json.JSONDecodeError:
        return False
    return isinstance(document, dict) and document.get("fail_count") == 0


def ask(
    path: Path, args: list[str] = NVRX_ARGS, timeout_s: float = NVRX_TIMEOUT_S
) -> tuple[Any, float]:
    """One RunHealthCheck as ft_launcher makes it (a fresh channel per check, its deadline):
    (response, ms). A late answer raises grpc.RpcError (DEADLINE_EXCEEDED), which the launcher
    would count as healthy."""
    assert stat.S_ISSOCK(os.lstat(path).st_mode)  # a missing socket is a silent "healthy"
    started = time.perf_counter()
    with grpc.insecure_channel(f"unix://{path}") as channel:
        stub = nvhcd_pb2_grpc.HealthCheckServiceStub(channel)
        response = stub.RunHealthCheck(nvhcd_pb2.HealthCheckRequest(args=args), timeout=timeout_s)
    return response, (time.perf_counter() - started) * 1000


def failed_checks(response: Any) -> set[tuple[str, int | None]]:
    """(check, gpu) of each failed check the answer lists."""
    return {(f["check"], f["gpu"]) for f in json.loads(response.output)["failed_checks"]}
