"""What the kubelet says of this node's GPUs: whether a pod holds one (node state `auto`).

The kubelet's pod-resources API (a gRPC service on a Unix socket, by default
/var/lib/kubelet/pod-resources/kubelet.sock) lists the devices each pod's containers were
given; a pod that holds an `nvidia.com/...` device means a job owns GPUs here. Only the node
itself can ask it, so this runs in node-check and serve (the node-problem-detector plugin and
ft_launcher's service), never over SSH.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from gpuhealth.facts import IDLE, IN_USE

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
# node-check has 40 s in all (NPD's rule 45 s): a kubelet that does not answer in this long is
# taken as no answer, and the probe decides.
DEADLINE_S = 3.0
# The kubelet's own pod-resources client allows 16 MiB; gRPC's default is 4 MiB.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Device-plugin resources (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-1g.10gb, a
# vGPU or passthrough type) and DRA drivers (gpu.nvidia.com, compute-domain.nvidia.com).
# Anything NVIDIA names counts: a wrong `idle` judges a busy node by idle rules and drains it,
# a wrong `in-use` only leaves those rules out while the pod runs.
RESOURCE_PREFIX = "nvidia.com/"
DRIVER_DOMAIN = "nvidia.com"
PODS_NAMED = 3  # the source names this many pods, then counts the rest

_said: list[str] = []  # the reason the kubelet could not be asked, once per process


def holds_nvidia(resource_name: str) -> bool:
    """Whether a device plugin's resource is an NVIDIA device."""
    return resource_name.startswith(RESOURCE_PREFIX)


def nvidia_driver(driver_name: str) -> bool:
    """Whether a DRA driver is NVIDIA's (gpu.nvidia.com and the like)."""
    return driver_name == DRIVER_DOMAIN or driver_name.endswith("." + DRIVER_DOMAIN)


def hint_from(response: Any) -> dict[str, str]:
    """{"state", "source"} from a ListPodResourcesResponse: in-use when a pod's container holds
    an NVIDIA device (a pod holding GPUs is a job that owns them, computing yet or not), idle
    when none does."""
    pods: list[str] = []
    held: dict[str, int] = {}
    for pod in response.pod_resources:
        holds = False
        for container in pod.containers:
            for devices in container.devices:
                if holds_nvidia(devices.resource_name):
                    name = devices.resource_name
                    held[name] = held.get(name, 0) + len(devices.device_ids)
                    holds = True
            for dynamic in container.dynamic_resources:
                for claimed in dynamic.claim_resources:
                    if nvidia_driver(claimed.driver_name):
                        name = f"{claimed.driver_name} (DRA)"
                        held[name] = held.get(name, 0) + 1
                        holds = True
        if holds:
            pods.append(f"{pod.namespace}/{pod.name}")
    if not pods:
        return {"state": IDLE, "source": "kubelet: no pod holds an NVIDIA GPU"}
    named = ", ".join(pods[:PODS_NAMED])
    if len(pods) > PODS_NAMED:
        named += f" and {len(pods) - PODS_NAMED} more"
    what = ", ".join(f"{count} {name}" if count else name for name, count in sorted(held.items()))
    subject = f"pods {named} hold" if len(pods) > 1 else f"pod {named} holds"
    return {"state": IN_USE, "source": f"kubelet: {subject} {what}"}


def list_pod_resources(socket_path: str, deadline_s: float) -> Any:
    """The kubelet's ListPodResourcesResponse (grpc.RpcError when it does not answer). grpc is
    imported here: node-check loads it only where a kubelet socket exists."""
    import grpc

    from gpuhealth.integrations import podresources_pb2, podresources_pb2_grpc

    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(f"unix:{socket_path}", options=options) as channel:
        stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
        return stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=deadline_s)


def node_state_hint(socket_path: str = SOCKET) -> dict[str, str] | None:
    """{"state", "source"} from the kubelet, or None where no kubelet answers here (then the
    probe decides: Slurm, compute processes). Never raises: node-check must judge the node
    whatever the kubelet does."""
    if not os.path.exists(socket_path):
        return None
    try:
        return hint_from(list_pod_resources(socket_path, DEADLINE_S))
    except Exception as exc:  # grpc.RpcError, no grpc installed, a malformed answer
        reason = _reason(exc)
        if not _said:
            _said.append(reason)
            print(
                f"gpuhealth: the kubelet at {socket_path} could not be asked which pods hold "
                f"GPUs ({reason}); the probe decides the node state",
                file=sys.stderr,
            )
        return None


def _reason(exc: Exception) -> str:
    """An RpcError's status and details, else the exception in one line."""
    code, details = getattr(exc, "code", None), getattr(exc, "details", None)
    if callable(code) and callable(details):
        return f"{code()}: {details()}"
    return f"{type(exc).__name__}: {exc}"
