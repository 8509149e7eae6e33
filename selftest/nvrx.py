"""The launcher's side of the node health service contract, as NVIDIA's code does it: a gRPC
client built from the same proto, asking as ft_launcher (nvidia-resiliency-ext's
NodeHealthCheck, src/nvidia_resiliency_ext/shared_utils/health_check.py) asks, resolving its
endpoint as the launcher does and reading the answer by the launcher's rule, leniency included.

That rule counts as healthy every answer it cannot read as a failure, and every way of not
getting one: so a test must also show that the service was reached (`reached`), never only that
the launcher's rule says healthy. Used by selftest/test_serve.py and the bed (test_roles.py).
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import grpc

from gpuhealth.integrations import nvhcd_pb2, nvhcd_pb2_grpc

# What ft_launcher sends (its NodeHealthCheck sends only "--no-slurm"; some releases also
# "--group prolog epilog logs gpu") and how long it waits.
NVRX_ARGS = ["--no-slurm", "--group", "prolog", "epilog", "logs", "gpu"]
NVRX_TIMEOUT_S = 60


def nvrx_target(endpoint: str) -> str | None:
    """The channel target NodeHealthCheck makes of --ft-node-health-check-endpoint, once, when
    the launcher starts; None means it skips the check (healthy) for the launcher's whole life:
    `unix://...` is taken as written, a path starting with `/` or `./` gets `unix://` in front,
    anything else (`unix:/path`, host:port) is no Unix socket to it; and a socket path that does
    not exist at that moment is taken for a service not deployed."""
    if endpoint.startswith("unix://"):
        target = endpoint
    elif endpoint.startswith(("/", "./")):
        target = f"unix://{endpoint}"
    else:
        return None
    return target if os.path.exists(target[len("unix://") :]) else None


def nvrx_healthy(response: Any) -> bool:
    """NodeHealthCheck's rule on an answer: unhealthy when `success` is false, when `output`
    is not JSON, or when it is a JSON object whose `fail_count` is missing, null or not equal
    to 0. Any other JSON (`[]`, `0`, `null`, a string) fails the launcher's own reading with an
    exception, which it counts as healthy, as it counts every other exception."""
    if not response.success:
        return False
    try:
        document = json.loads(response.output)
    except json.JSONDecodeError:
        return False
    if not isinstance(document, dict):
        return True  # the launcher's `.get` raises on it: "connectivity error", healthy
    fail_count = document.get("fail_count")
    return fail_count is not None and fail_count == 0


class Launcher:
    """One ft_launcher's node health check: the endpoint resolved once, at construction; each
    check a fresh channel, args ["--no-slurm"], its deadline; every error healthy."""

    def __init__(self, endpoint: str, timeout_s: float = NVRX_TIMEOUT_S) -> None:
        self.target = nvrx_target(endpoint)
        self.timeout_s = timeout_s

    def check(self) -> tuple[bool, Any]:
        """(healthy by the launcher's rule, the response when the service answered, else
        None): what the launcher decides, and whether anything answered it."""
        if self.target is None:
            return True, None
        try:
            with grpc.insecure_channel(self.target) as channel:
                stub = nvhcd_pb2_grpc.HealthCheckServiceStub(channel)
                request = nvhcd_pb2.HealthCheckRequest(args=["--no-slurm"])
                response = stub.RunHealthCheck(request, timeout=self.timeout_s)
        except Exception:
            return True, None
        return nvrx_healthy(response), response


def reached(response: Any) -> bool:
    """Whether an answer came from gpuhealth serve: its output is gpuhealth's document (the
    launcher's rule alone cannot tell a service nobody reached from a healthy node)."""
    if response is None:
        return False
    try:
        document = json.loads(response.output)
    except json.JSONDecodeError:
        return False
    return isinstance(document, dict) and {"verdict", "host", "node_state"} <= set(document)


def ask(
    path: Path, args: list[str] = NVRX_ARGS, timeout_s: float = NVRX_TIMEOUT_S
) -> tuple[Any, float]:
    """One RunHealthCheck as ft_launcher makes it (a fresh channel per check, its deadline):
    (response, ms). Unlike the launcher, an RPC error raises (grpc.RpcError): a test must see
    that the service answered, which the launcher would count as healthy either way."""
    assert stat.S_ISSOCK(os.lstat(path).st_mode)  # a missing socket is a silent "healthy"
    started = time.perf_counter()
    with grpc.insecure_channel(f"unix://{path}") as channel:
        stub = nvhcd_pb2_grpc.HealthCheckServiceStub(channel)
        response = stub.RunHealthCheck(nvhcd_pb2.HealthCheckRequest(args=args), timeout=timeout_s)
    return response, (time.perf_counter() - started) * 1000


def failed_checks(response: Any) -> set[tuple[str, int | None]]:
    """(check, gpu) of each failed check the answer lists."""
    return {(f["check"], f["gpu"]) for f in json.loads(response.output)["failed_checks"]}
