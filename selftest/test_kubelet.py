"""Node state `auto` from the kubelet's pod-resources API: the decision from a List answer, and
the question asked for real, over gRPC on a Unix socket, of a fake kubelet serving pods the
test defines (the generated servicer of podresources.proto, as the kubelet serves api.proto)."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor

from gpuhealth.integrations import kubelet, podresources_pb2, podresources_pb2_grpc
from selftest.test_node_check import H100, node_check

pb = podresources_pb2


def pod(namespace: str, name: str, *devices: tuple[str, int], dra: tuple[str, ...] = ()) -> Any:
    """A pod of one container holding `count` devices of each resource, and DRA devices of
    each driver in `dra`."""
    container = pb.ContainerResources(
        name="main",
        devices=[
            pb.ContainerDevices(resource_name=r, device_ids=[f"{r}-{i}" for i in range(n)])
            for r, n in devices
        ],
        dynamic_resources=[
            pb.DynamicResource(claim_resources=[pb.ClaimResource(driver_name=d) for d in dra])
        ]
        if dra
        else [],
    )
    return pb.PodResources(name=name, namespace=namespace, containers=[container])


def answer(*pods: Any) -> Any:
    return pb.ListPodResourcesResponse(pod_resources=list(pods))


SYSTEM = pod("kube-system", "kube-proxy-x2k")  # a pod holding no device
SRIOV = pod("net", "sriov-test", ("intel.com/sriov_netdevice", 1))
TRAIN = pod("ml", "train-0", ("nvidia.com/gpu", 8))


# --- the decision -----------------------------------------------------------------------------


def test_a_pod_holding_gpus_makes_the_node_in_use_and_is_named():
    hint = kubelet.hint_from(answer(SYSTEM, TRAIN))
    assert hint == {"state": "in-use", "source": "kubelet: pod ml/train-0 holds 8 nvidia.com/gpu"}


def test_several_pods_are_named_with_what_they_hold():
    mig = pod("team-b", "notebook", ("nvidia.com/mig-1g.10gb", 1), ("cpu", 0))
    hint = kubelet.hint_from(
        answer(TRAIN, SYSTEM, mig, pod("ml", "train-1", ("nvidia.com/gpu", 8)))
    )
    assert hint["state"] == "in-use"
    assert hint["source"] == (
        "kubelet: pods ml/train-0, team-b/notebook, ml/train-1 hold "
        "16 nvidia.com/gpu, 1 nvidia.com/mig-1g.10gb"
    )


def test_many_pods_are_counted_past_the_first_few():
    pods = [pod("ml", f"w{i}", ("nvidia.com/gpu", 1)) for i in range(5)]
    source = kubelet.hint_from(answer(*pods))["source"]
    assert source == "kubelet: pods ml/w0, ml/w1, ml/w2 and 2 more hold 5 nvidia.com/gpu"


def test_gpus_claimed_through_dra_count():
    claimed = pod("ml", "dra-job", dra=("gpu.nvidia.com", "gpu.nvidia.com"))
    hint = kubelet.hint_from(answer(SYSTEM, claimed))
    assert hint == {
        "state": "in-use",
        "source": "kubelet: pod ml/dra-job holds 2 gpu.nvidia.com (DRA)",
    }
    other = pod("net", "dra-nic", dra=("dra.example.com", "notnvidia.com"))
    assert kubelet.hint_from(answer(other))["state"] == "idle"


def test_pods_without_an_nvidia_device_leave_the_node_idle():
    idle = {"state": "idle", "source": "kubelet: no pod holds an NVIDIA GPU"}
    assert kubelet.hint_from(answer(SYSTEM, SRIOV)) == idle
    assert kubelet.hint_from(answer()) == idle


def test_what_counts_as_an_nvidia_device():
    assert all(
        kubelet.holds_nvidia(r)
        for r in ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-3g.40gb")
    )
    assert not any(kubelet.holds_nvidia(r) for r in ("cpu", "amd.com/gpu", "gpu", "nvidia.com"))
    assert kubelet.nvidia_driver("gpu.nvidia.com") and kubelet.nvidia_driver(
        "compute-domain.nvidia.com"
    )
    assert not kubelet.nvidia_driver("fakenvidia.com")


def test_the_wire_contract_is_the_kubelets():
    """Package, service, method and field numbers are those of kubernetes/kubelet
    pkg/apis/podresources/v1/api.proto (what a real kubelet sends)."""
    service = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    method = service.methods_by_name["List"]
    assert (method.input_type.full_name, method.output_type.full_name) == (
        "v1.ListPodResourcesRequest",
        "v1.ListPodResourcesResponse",
    )

    def fields(message: str) -> dict[str, tuple[int, int]]:
        return {
            f.name: (f.number, f.type) for f in pb.DESCRIPTOR.message_types_by_name[message].fields
        }

    message, string = FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_STRING
    assert fields("ListPodResourcesResponse") == {"pod_resources": (1, message)}
    assert fields("PodResources") == {
        "name": (1, string),
        "namespace": (2, string),
        "containers": (3, message),
    }
    assert fields("ContainerResources") == {
        "name": (1, string),
        "devices": (2, message),
        "dynamic_resources": (5, message),
    }
    assert fields("ContainerDevices") == {"resource_name": (1, string), "device_ids": (2, string)}
    assert fields("DynamicResource") == {"claim_resources": (4, message)}
    assert fields("ClaimResource") == {"driver_name": (2, string)}


def test_fields_of_the_real_api_this_subset_leaves_out_are_skipped():
    """A real kubelet also sends cpu_ids, memory, topology, claim names, CDI devices: unknown
    fields to this subset, decoded past. Hand-encoded: PodResources{name, namespace,
    containers=[{name, devices=[{resource_name, device_ids, topology (3)}], cpu_ids (3)}],
    cpu_ids (4)}."""

    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    topology = field(1, bytes([1 << 3, 0]))  # TopologyInfo{nodes=[NUMANode{ID=0}]}
    devices = field(1, b"nvidia.com/gpu") + field(2, b"GPU-1") + field(3, topology)
    container = field(1, b"main") + field(2, devices) + bytes([3 << 3, 7])  # cpu_ids: 7
    pod_bytes = field(1, b"train-0") + field(2, b"ml") + field(3, container) + bytes([4 << 3, 7])
    response = pb.ListPodResourcesResponse.FromString(field(1, pod_bytes))
    hint = kubelet.hint_from(response)
    assert hint["source"] == "kubelet: pod ml/train-0 holds 1 nvidia.com/gpu"


# --- asking a kubelet ---------------------------------------------------------------------------


class FakeKubelet(podresources_pb2_grpc.PodResourcesListerServicer):
    """Answers List with the pods it is given; with `hang`, answers nothing until released."""

    def __init__(self, pods: list[Any], hang: bool = False) -> None:
        self.pods = pods
        self.hang = hang
        self.release = threading.Event()
        self.asked = 0

    def List(self, request: Any, context: Any) -> Any:
        self.asked += 1
        if self.hang:
            self.release.wait(10)
        return answer(*self.pods)


@contextmanager
def serving(path: Path, kubelet_fake: FakeKubelet) -> Iterator[FakeKubelet]:
    """A gRPC server on the Unix socket `path`, as the kubelet serves pod-resources."""
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(kubelet_fake, server)
    server.add_insecure_port(f"unix:{path}")
    server.start()
    try:
        yield kubelet_fake
    finally:
        kubelet_fake.release.set()
        server.stop(0).wait()


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "kubelet.sock"


@pytest.fixture(autouse=True)
def fresh_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the once-per-process warning afresh."""
    monkeypatch.setattr(kubelet, "_said", [])


def test_a_kubelet_with_a_gpu_pod_says_in_use(sock: Path):
    with serving(sock, FakeKubelet([SYSTEM, TRAIN])) as fake:
        hint = kubelet.node_state_hint(str(sock))
    assert fake.asked == 1
    assert hint == {"state": "in-use", "source": "kubelet: pod ml/train-0 holds 8 nvidia.com/gpu"}


def test_a_kubelet_whose_pods_hold_no_gpu_says_idle(sock: Path):
    with serving(sock, FakeKubelet([SYSTEM, SRIOV])):
        hint = kubelet.node_state_hint(str(sock))
    assert hint == {"state": "idle", "source": "kubelet: no pod holds an NVIDIA GPU"}


def test_no_socket_is_no_kubelet_and_no_word_of_it(sock: Path, capsys: pytest.CaptureFixture):
    assert kubelet.node_state_hint(str(sock)) is None
    assert capsys.readouterr().err == ""


def test_a_socket_nobody_serves_is_none_fast_and_said_once(
    sock: Path, capsys: pytest.CaptureFixture
):
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(sock))  # bound, never listening: connections are refused
    try:
        started = time.monotonic()
        assert kubelet.node_state_hint(str(sock)) is None
        assert kubelet.node_state_hint(str(sock)) is None
        assert time.monotonic() - started < 2
    finally:
        dead.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"the kubelet at {sock} could not be asked" in err and "UNAVAILABLE" in err


def test_a_kubelet_that_does_not_answer_is_given_up_on_its_deadline(
    sock: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
):
    monkeypatch.setattr(kubelet, "DEADLINE_S", 0.5)
    with serving(sock, FakeKubelet([TRAIN], hang=True)):
        started = time.monotonic()
        assert kubelet.node_state_hint(str(sock)) is None
        assert time.monotonic() - started < 3
    assert "DEADLINE_EXCEEDED" in capsys.readouterr().err


def test_a_kubelet_without_the_v1_api_is_none(sock: Path, capsys: pytest.CaptureFixture):
    """The base servicer answers UNIMPLEMENTED, as a kubelet without v1 List would."""
    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    podresources_pb2_grpc.add_PodResourcesListerServicer_to_server(
        podresources_pb2_grpc.PodResourcesListerServicer(), server
    )
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    try:
        assert kubelet.node_state_hint(str(sock)) is None
    finally:
        server.stop(0).wait()
    assert "UNIMPLEMENTED" in capsys.readouterr().err


def test_node_check_auto_takes_the_kubelets_word(fake_nvml_lib, tmp_path: Path, sock: Path):
    """End to end: node-check --node-state auto on a healthy H100 node under the fake NVML (no
    compute process on any GPU) asks the kubelet, whose pod holds the GPUs: in use."""
    with serving(sock, FakeKubelet([SYSTEM, TRAIN])) as fake:
        done = node_check(
            fake_nvml_lib,
            "healthy-h100x8",
            tmp_path,
            *H100,
            "--node-state",
            "auto",
            "--kubelet-socket",
            str(sock),
            "--json",
        )
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert fake.asked == 1
    assert (doc["verdict"], doc["node_state"]) == ("PASS", "in-use")
    assert doc["node_state_source"] == "kubelet: pod ml/train-0 holds 8 nvidia.com/gpu"
