"""`gpuhealth act kubernetes` and the node-problem-detector plugin, offline.

No API server can run on these machines, so what is tested is what can be without one:
- the planned changes of a run's verdicts.json (written by the real report writer), applied
  to node objects by the real kubectl (`kubectl patch --local`: the same merge and strategic
  merge code the API server uses), and the nodes that result;
- `--apply` through the official Python client against a double of the nodes API on
  loopback, which checks method, path, query, content type, auth and body of every request
  the client sends, refuses what a real server would refuse or silently drop (a status sent
  to the node, a stale resourceVersion), and applies each patch with `kubectl patch --local`;
- the NPD monitor config (its rules and timeouts as NPD validates them), and `gpuhealth
  node-check --npd` run as NPD runs it, under the fake NVML, against its timeout.
What only a real cluster shows (RBAC enforced, admission, the scheduler honouring the taint,
NPD itself) is not tested.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes
import pytest
import yaml

from gpuhealth import cli
from gpuhealth import report as reporting
from gpuhealth.integrations import kubernetes as k8s
from gpuhealth.integrations import nodecheck
from gpuhealth.integrations import verdicts as runs
from selftest.fakenvml import load_scenario, nvml_env, write_scenario

REPO = Path(__file__).resolve().parent.parent
NPD_CONFIG = REPO / "deploy" / "npd" / "gpuhealth-monitor.json"
TREE = Path(__file__).parent / "data" / "system" / "hgx-h100-2socket"
NODE_TOOLS = Path(__file__).parent / "standins" / "node"
HOST = socket.gethostname()

RUN_AT = "2026-03-04T05:06:07Z"
BEFORE = "2026-01-01T00:00:00Z"
FOREIGN = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
OURS = k8s.TAINT
READY = {
    "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is ready",
    "lastHeartbeatTime": BEFORE, "lastTransitionTime": BEFORE,
}  # fmt: skip


@pytest.fixture(scope="session")
def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail(
            "kubectl not found: these tests apply the patches with the real kubectl "
            "(`kubectl patch --local`); install Debian's kubernetes-client"
        )
    return path


# ---------------------------------------------------------------- a run and a cluster


def gpu_labels(states: dict[int, str]) -> dict[str, str]:
    return {k8s.gpu_label(i): state for i, state in states.items()}


def condition(status: str, since: str = BEFORE, reason: str = "Before") -> dict[str, str]:
    return {
        "type": k8s.CONDITION, "status": status, "reason": reason, "message": "an earlier run",
        "lastHeartbeatTime": since, "lastTransitionTime": since,
    }  # fmt: skip


def node(
    name: str,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    conditions: list[dict[str, str]] | None = None,
    version: int = 100,
) -> dict[str, Any]:
    """A Node as the API server returns it."""
    spec: dict[str, Any] = {"podCIDR": "10.0.0.0/24"}
    if taints is not None:
        spec["taints"] = taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "resourceVersion": str(version),
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
        },
        "spec": spec,
        "status": {"conditions": [READY, *(conditions or [])]},
    }


def cluster_nodes() -> list[dict[str, Any]]:
    """The cluster before the run is acted on (gpu-e is not in it; cpu-1 is not in the run)."""
    return [
        # Passed last time; an index beyond its 8 slots is left over from another board.
        node("gpu-a", {k8s.VERDICT_LABEL: "PASS", **gpu_labels(dict.fromkeys(range(9), "healthy"))},
             conditions=[condition("True")]),
        # Failed last time (gpuhealth's taint, gpu3 unhealthy); someone else's taint too.
        node("gpu-b", {k8s.VERDICT_LABEL: "FAIL", **gpu_labels({3: "unhealthy"})},
             taints=[FOREIGN, OURS], conditions=[condition("False")]),
        # Seen with gpu1 unhealthy before; unreachable now.
        node("gpu-c", gpu_labels({0: "healthy", 1: "unhealthy"}), conditions=[condition("False")]),
        # Its checks were all deselected this time; Unknown already since BEFORE.
        node("gpu-d", gpu_labels(dict.fromkeys(range(8), "healthy")),
             conditions=[condition("Unknown")]),
        node("cpu-1", {"role": "cpu"}, taints=[FOREIGN]),
    ]  # fmt: skip


def ecc(host: str, gpu: int, status: str) -> reporting.Outcome:
    message = "volatile uncorrected ECC errors 2 > 0" if status == "FAIL" else "no ECC errors"
    return reporting.Outcome(
        "ecc_errors", status, host, gpu, message, f"{host} gpu{gpu} (GPU-{gpu:04d})", "RESET_GPU",
        "reset the GPU, then re-run",
    )  # fmt: skip


def write_run(path: Path, complete: bool = True) -> Path:
    """verdicts.json as a suite run writes it: gpu-a FAIL (gpu3), gpu-b PASS, gpu-c
    UNREACHABLE, gpu-d NOT_CHECKED, gpu-e FAIL (a node the cluster does not have)."""
    book = reporting.VerdictBook()
    for host in ("gpu-a", "gpu-b", "gpu-e"):
        for gpu in range(8):
            bad = host != "gpu-b" and gpu == 3
            book.add(ecc(host, gpu, "FAIL" if bad else "PASS"))
    book.unreachable("gpu-c", "gpu-c: ssh: connect to host gpu-c port 22: No route to host")
    book.add(reporting.Outcome("ecc_errors", "SKIP", "gpu-d", 0, "deselected", "gpu-d gpu0"))
    for host in ("gpu-a", "gpu-b", "gpu-c", "gpu-d", "gpu-e"):
        book.node(host).gpu_slots = 8
    reporting.write_json(book.finish(), path, {"complete": complete})
    doc = json.loads(path.read_text())
    doc["generated_at"] = RUN_AT
    path.write_text(json.dumps(doc))
    return path


def planned(tmp_path: Path, complete: bool = True) -> dict[str, k8s.NodeChange]:
    run = runs.load(write_run(tmp_path / "verdicts.json", complete))
    nodes = {n["metadata"]["name"]: n for n in cluster_nodes()}
    changes, missing = k8s.plan(run, {h: h for h in run.nodes}, nodes, k8s.observed_at(run))
    assert missing == ["gpu-e: FAIL, but the cluster has no node gpu-e: left alone"]
    return {c.node: c for c in changes}


def kubectl_patch(kubectl: str, obj: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """Apply one printed `kubectl patch node NAME ...` command to a node object, offline.
    `--subresource` only picks the endpoint on a server (and kubectl 1.20 lacks it)."""
    assert argv[:4] == ["kubectl", "patch", "node", obj["metadata"]["name"]]
    rest = [a for a in argv[4:] if not a.startswith("--subresource=")]
    done = subprocess.run(
        [kubectl, "patch", "--local", "-f", "-", *rest, "-o", "json"],
        input=json.dumps(obj), capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def after(kubectl: str, change: k8s.NodeChange) -> dict[str, Any]:
    """The node once each printed command of its change has been applied to it."""
    obj = next(n for n in cluster_nodes() if n["metadata"]["name"] == change.node)
    for patch in change.patches:
        obj = kubectl_patch(kubectl, obj, patch.argv(change.node))
    return obj


def ours(obj: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in obj["metadata"]["labels"].items() if k.startswith("gpuhealth.io/")}


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {c["type"]: c for c in obj["status"]["conditions"]}


def taints(obj: dict[str, Any]) -> list[dict[str, str]]:
    return list(obj["spec"].get("taints") or [])


# ---------------------------------------------------------------- the plan, applied by kubectl


EXPECTED = {
    "gpu-a": (
        {k8s.VERDICT_LABEL: "FAIL", **gpu_labels({i: "unhealthy" if i == 3 else "healthy"
                                                 for i in range(8)})},
        [OURS], ("False", "GpuChecksFailed", RUN_AT),
    ),
    "gpu-b": (
        {k8s.VERDICT_LABEL: "PASS", **gpu_labels(dict.fromkeys(range(8), "healthy"))},
        [FOREIGN], ("True", "GpuChecksPassed", RUN_AT),
    ),
    "gpu-c": (
        {k8s.VERDICT_LABEL: "UNREACHABLE",
         **gpu_labels({i: "unhealthy" if i == 1 else "unknown" for i in range(8)})},
        [OURS], ("Unknown", "NodeUnreachable", RUN_AT),
    ),
    "gpu-d": (
        {k8s.VERDICT_LABEL: "NOT_CHECKED", **gpu_labels(dict.fromkeys(range(8), "unknown"))},
        [], ("Unknown", "GpuNotChecked", BEFORE),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_printed_commands_make_the_node_say_what_the_run_says(name, kubectl, tmp_path):
    change = planned(tmp_path)[name]
    labels, taint_list, (status, reason, since) = EXPECTED[name]
    obj = after(kubectl, change)
    assert ours(obj) == labels
    assert taints(obj) == taint_list
    gpu = conditions(obj)[k8s.CONDITION]
    assert (gpu["status"], gpu["reason"], gpu["lastTransitionTime"]) == (status, reason, since)
    assert gpu["lastHeartbeatTime"] == RUN_AT
    assert gpu["message"].startswith(f"{change.verdict}: ")
    assert conditions(obj)["Ready"] == READY  # the kubelet's conditions are left alone
    assert obj["metadata"]["labels"]["kubernetes.io/hostname"] == name


def test_the_change_is_said_in_words_and_as_commands(tmp_path):
    changes = planned(tmp_path)
    assert changes["gpu-a"].changes == [
        f"label {k8s.VERDICT_LABEL}=FAIL (was PASS)",
        "labels gpuhealth.io/gpu.N.state=unhealthy for gpu3 (was healthy)",
        "labels gpuhealth.io/gpu.N.state removed for gpu8 (was healthy)",
        "taint gpuhealth.io/unhealthy=true:NoSchedule: added",
        "condition GpuHealthy=False (was True) (GpuChecksFailed): FAIL: gpu-a gpu3 (GPU-0003): "
        "volatile uncorrected ECC errors 2 > 0 [ecc_errors]",
    ]
    spec, status = changes["gpu-a"].patches
    assert spec.shown("gpu-a").startswith("kubectl patch node gpu-a --type=merge -p '{")
    assert status.shown("gpu-a").startswith(
        "kubectl patch node gpu-a --subresource=status --type=strategic -p '{"
    )
    # The taint list is replaced whole, so only on the node as it was read.
    assert spec.body["metadata"]["resourceVersion"] == "100"
    assert spec.body["spec"]["taints"] == [OURS]
    assert "resourceVersion" not in changes["gpu-d"].patches[0].body["metadata"]
    assert changes["gpu-c"].notes == [
        "labels gpuhealth.io/gpu.N.state=unhealthy for gpu1 kept: this run did not judge the GPUs"
    ]
    assert changes["gpu-d"].changes[-1] == (
        f"condition GpuHealthy=Unknown since {BEFORE} (GpuNotChecked): NOT_CHECKED: no check "
        "passed or failed on gpu-d (1 skipped)"
    )


def test_an_unchanged_node_gets_only_the_condition_heartbeat(kubectl, tmp_path):
    first = planned(tmp_path)["gpu-a"]
    obj = after(kubectl, first)
    run = runs.load(tmp_path / "verdicts.json")
    again = k8s.plan_node(run.nodes["gpu-a"], "gpu-a", obj, True, "2026-03-05T00:00:00Z")
    assert again.changes == []
    assert again.notes == [f"condition GpuHealthy=False since {RUN_AT}, as this run says"]
    assert [p.subresource for p in again.patches] == ["status"]
    gpu = conditions(kubectl_patch(kubectl, obj, again.patches[0].argv("gpu-a")))["GpuHealthy"]
    assert (gpu["lastTransitionTime"], gpu["lastHeartbeatTime"]) == (RUN_AT, "2026-03-05T00:00:00Z")


def test_an_incomplete_run_never_removes_a_taint(kubectl, tmp_path):
    change = planned(tmp_path, complete=False)["gpu-b"]
    assert "taint gpuhealth.io/unhealthy=true:NoSchedule kept: the run did not finish" in (
        change.notes
    )
    obj = after(kubectl, change)
    assert taints(obj) == [FOREIGN, OURS]
    assert conditions(obj)["GpuHealthy"]["message"].endswith("(the run did not finish)")
    # ...but a FAIL of an incomplete run still taints.
    assert taints(after(kubectl, planned(tmp_path, complete=False)["gpu-a"])) == [OURS]


def test_only_gpuhealths_taint_is_ever_touched(kubectl):
    """Taints are unique by key and effect: ours is gpuhealth.io/unhealthy:NoSchedule; the
    same key with another effect is someone else's."""
    others = [FOREIGN, {"key": k8s.TAINT_KEY, "value": "true", "effect": "NoExecute"}]
    edited = {"key": k8s.TAINT_KEY, "value": "maybe", "effect": "NoSchedule"}
    obj = node("n", taints=[*others, edited])
    for verdict, left in (("FAIL", [*others, OURS]), ("PASS", others)):
        state = runs.NodeState("n", verdict, ["why"], [], [], 8)
        (spec, _) = k8s.plan_node(state, "n", obj, True, RUN_AT).patches
        obj = kubectl_patch(kubectl, obj, spec.argv("n"))
        assert taints(obj) == left


@pytest.mark.parametrize("verdict", ["WARN", "NOT_CHECKED"])
def test_only_a_pass_removes_the_taint(verdict):
    state = runs.NodeState("gpu-b", verdict, ["why"], [], [], 8)
    change = k8s.plan_node(state, "gpu-b", node("gpu-b", taints=[OURS]), True, RUN_AT)
    assert (
        change.notes[0]
        == "taint gpuhealth.io/unhealthy=true:NoSchedule kept: only a PASS removes it"
    )
    assert all("spec" not in p.body for p in change.patches)


def test_a_pass_judged_in_use_clears_nothing_an_idle_rule_may_have_set():
    """Faults only were judged: an unhealthy GPU label, the taint and a False condition stay
    until an idle PASS."""
    tainted = node("n", taints=[OURS])
    tainted["metadata"]["labels"] = gpu_labels({3: "unhealthy"})
    tainted["status"] = {"conditions": [{"type": k8s.CONDITION, "status": "False"}]}
    busy = runs.NodeState("n", "PASS", ["ok"], [], [], 8, "in-use")
    assert k8s.wanted_labels(busy, tainted["metadata"]["labels"])[k8s.gpu_label(3)] == "unhealthy"
    change = k8s.plan_node(busy, "n", tainted, True, RUN_AT)
    assert all("spec" not in p.body for p in change.patches)
    assert f"condition {k8s.CONDITION}=False kept: PASS judged in use" in change.notes
    assert any(
        note.endswith("kept: PASS judged in use (fault rules only)") for note in change.notes
    )
    idle = runs.NodeState("n", "PASS", ["ok"], [], [], 8, "idle")
    assert k8s.wanted_labels(idle, tainted["metadata"]["labels"])[k8s.gpu_label(3)] == "healthy"


def test_without_a_slot_count_no_gpu_is_called_healthy():
    labels = gpu_labels({0: "healthy", 1: "healthy", 2: "unhealthy"})
    failed = [{"check": "ecc_errors", "gpu": 1}]
    judged = runs.NodeState("n", "FAIL", ["r"], [], failed, None)
    assert k8s.wanted_labels(judged, labels) == {
        k8s.VERDICT_LABEL: "FAIL",
        k8s.gpu_label(0): None, k8s.gpu_label(1): "unhealthy", k8s.gpu_label(2): None,
    }  # fmt: skip
    unseen = runs.NodeState("n", "UNREACHABLE", ["r"], [], [], None)
    assert k8s.wanted_labels(unseen, labels) == {
        k8s.VERDICT_LABEL: "UNREACHABLE",
        k8s.gpu_label(0): "unknown", k8s.gpu_label(1): "unknown", k8s.gpu_label(2): "unhealthy",
    }  # fmt: skip


@pytest.mark.parametrize(
    "node, why",
    [({"failed": 5}, "'failed' is not a list of objects"),
     ({"failed": ["ecc_errors"]}, "'failed' is not a list of objects"),
     ({"failed": [{"check": "x", "gpu": -1}]}, "failure on an invalid GPU (-1)"),
     ({"failed": [{"check": "x", "gpu": True}]}, "failure on an invalid GPU (True)"),
     ({"failed": [{"check": "x", "gpu": "3"}]}, "failure on an invalid GPU ('3')"),
     ({"gpu_slots": 10**9}, "invalid gpu_slots (1000000000)"),
     ({"gpu_slots": True}, "invalid gpu_slots (True)"),
     ({"gpu_slots": 8.0}, "invalid gpu_slots (8.0)"),
     ({"gpu_slots": -1}, "invalid gpu_slots (-1)")],
)  # fmt: skip
def test_a_node_entry_no_run_writes_is_refused_not_guessed_at(tmp_path, node, why):
    """A GPU "-1" or "True" would be a label the API server refuses (and with it the taint),
    a billion slots a billion labels; a failure that cannot be read is not skipped."""
    path = tmp_path / "verdicts.json"
    path.write_text(json.dumps({"nodes": {"n1": {"verdict": "FAIL", **node}}}))
    with pytest.raises(runs.VerdictsError, match="node 'n1'.*" + re.escape(why)):
        runs.load(path)


def test_a_verdicts_file_nested_too_deep_is_one_clear_error(tmp_path):
    path = tmp_path / "verdicts.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(runs.VerdictsError, match="cannot read it"):
        runs.load(path)


def test_a_run_that_does_not_say_it_finished_removes_no_taint(tmp_path):
    path = write_run(tmp_path / "verdicts.json")
    doc = json.loads(path.read_text())
    del doc["complete"]
    path.write_text(json.dumps(doc))
    run = runs.load(path)
    assert not run.complete
    nodes = {n["metadata"]["name"]: n for n in cluster_nodes()}
    change = k8s.plan_node(run.nodes["gpu-b"], "gpu-b", nodes["gpu-b"], run.complete, RUN_AT)
    assert "taint gpuhealth.io/unhealthy=true:NoSchedule kept: the run did not finish" in (
        change.notes
    )


def test_two_hosts_named_as_one_node_are_refused(tmp_path, capsys):
    """Else the second host's verdict undoes the first's: a PASS would untaint a FAIL."""
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        "all:\n  hosts:\n"
        "    gpu-a:\n      kubernetes_node_name: gpu-x\n"
        "    gpu-b:\n      kubernetes_node_name: gpu-x\n"
        "    gpu-c: {}\n"
    )
    verdicts = write_run(tmp_path / "verdicts.json")
    code = cli.main(["act", "kubernetes", "--verdicts", str(verdicts), "--inventory",
                     str(inventory)])  # fmt: skip
    assert code == 2
    assert capsys.readouterr().out == (
        f"gpuhealth act kubernetes: inventory {inventory}: kubernetes_node_name names one node "
        "for several hosts: gpu-a, gpu-b -> gpu-x\n"
    )


# Kubernetes' label syntax (apimachinery's IsQualifiedName and IsValidLabelValue).
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def valid_label(key: str, value: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return (
        (not prefix or (len(prefix) <= 253 and DNS_SUBDOMAIN.fullmatch(prefix) is not None))
        and len(name) <= 63 and NAME.fullmatch(name) is not None
        and len(value) <= 63 and VALUE.fullmatch(value) is not None
    )  # fmt: skip


@pytest.mark.parametrize("verdict", runs.VERDICTS)
def test_every_label_and_the_taint_are_valid_kubernetes_syntax(verdict):
    failed = [{"check": "ecc_errors", "gpu": 127}]
    state = runs.NodeState("n", verdict, ["why"], [], failed, 128)
    labels = k8s.wanted_labels(state, gpu_labels({1: "unhealthy", 200: "healthy"}))
    assert {k8s.gpu_label(127), k8s.gpu_label(200)} <= set(labels)
    for key, value in labels.items():
        assert valid_label(key, value or ""), (key, value)
    assert valid_label(k8s.TAINT_KEY, k8s.TAINT["value"])
    status, reason = k8s.CONDITIONS[verdict]
    assert status in ("True", "False", "Unknown")
    assert re.fullmatch(r"[A-Z][A-Za-z]*", reason)


# ---------------------------------------------------------------- a double of the nodes API


# The ClusterRole the README gives `gpuhealth act kubernetes` (copied there verbatim).
CLUSTER_ROLE = """\
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: gpuhealth-act
rules:
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get", "list", "patch"]
  - apiGroups: [""]
    resources: ["nodes/status"]
    verbs: ["patch"]
"""


def granted() -> set[tuple[str, str]]:
    rules = yaml.safe_load(CLUSTER_ROLE)["rules"]
    return {(res, verb) for rule in rules for res in rule["resources"] for verb in rule["verbs"]}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str | None
    body: Any

    @property
    def permission(self) -> tuple[str, str]:
        """The (resource, verb) RBAC checks for this request."""
        status = self.path.endswith("/status")
        resource = "nodes/status" if status else "nodes"
        if self.method == "PATCH":
            return resource, "patch"
        return resource, "list" if self.path == "/api/v1/nodes" else "get"


STATUS_REASONS = {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict"}


class NodesApi:
    """The nodes API on loopback: what a real API server accepts, applied by kubectl."""

    TOKEN = "selftest-token"

    def __init__(self, kubectl: str, nodes: list[dict[str, Any]], page: int = 2) -> None:
        self.kubectl = kubectl
        self.nodes = {n["metadata"]["name"]: copy.deepcopy(n) for n in nodes}
        self.page = page  # fewer than the client's limit, as a server may: paging is used
        self.requests: list[Request] = []
        self.before_patch: Callable[[str], None] | None = None
        self.forbidden: set[str] = set()  # paths RBAC refuses
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                api.serve(self, "GET")

            def do_PATCH(self) -> None:
                api.serve(self, "PATCH")

            def do_PUT(self) -> None:
                api.serve(self, "PUT")

            def do_POST(self) -> None:
                api.serve(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def kubeconfig(self, path: Path) -> Path:
        server = f"http://127.0.0.1:{self.server.server_address[1]}"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "double",
            "clusters": [{"name": "double", "cluster": {"server": server}}],
            "users": [{"name": "gpuhealth", "user": {"token": self.TOKEN}}],
            "contexts": [{"name": "double", "context": {"cluster": "double", "user": "gpuhealth"}}],
        }))  # fmt: skip
        return path

    def bump(self, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        """Someone else changes a node (a new resourceVersion)."""
        obj = self.nodes[name]
        change(obj)
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)

    @staticmethod
    def answer(handler: BaseHTTPRequestHandler, code: int, doc: dict[str, Any]) -> None:
        data = json.dumps(doc).encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def refuse(self, handler: BaseHTTPRequestHandler, code: int, message: str) -> None:
        self.answer(handler, code, {
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "reason": STATUS_REASONS.get(code, "BadRequest"), "message": message,
        })  # fmt: skip

    def serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        with self.lock:
            self.requests.append(
                Request(method, url.path, parse_qs(url.query), handler.headers.get("Content-Type"),
                        body)
            )  # fmt: skip
            if handler.headers.get("Authorization") != f"Bearer {self.TOKEN}":
                return self.refuse(handler, 401, "Unauthorized")
            if url.path in self.forbidden:
                return self.refuse(handler, 403, f"{method} {url.path} is forbidden (RBAC)")
            match = re.fullmatch(r"/api/v1/nodes(?:/([^/]+)(/status)?)?", url.path)
            if match is None or method not in ("GET", "PATCH"):
                return self.refuse(handler, 405, f"{method} {url.path}: not part of the nodes API")
            name, status = match.groups()
            if method == "GET" and name is None:
                return self.list(handler, parse_qs(url.query))
            if name not in self.nodes:
                return self.refuse(handler, 404, f'nodes "{name}" not found')
            if method == "GET":
                return (
                    self.answer(handler, 200, self.nodes[name])
                    if not status
                    else (
                        self.refuse(handler, 405, "read nodes/status is not what gpuhealth needs")
                    )
                )
            return self.patch(handler, name, bool(status), body)

    def list(self, handler: BaseHTTPRequestHandler, query: dict[str, list[str]]) -> None:
        names = sorted(self.nodes)
        start = int(query.get("continue", ["0"])[0])
        size = min(self.page, int(query.get("limit", [str(len(names))])[0]))
        meta = {"resourceVersion": "1000"}
        if start + size < len(names):
            meta["continue"] = str(start + size)
        items = [self.nodes[n] for n in names[start : start + size]]
        self.answer(handler, 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": meta,
                                   "items": items})  # fmt: skip

    def patch(self, handler: BaseHTTPRequestHandler, name: str, status: bool, body: Any) -> None:
        kinds = {v: k for k, v in k8s.CONTENT_TYPES.items()}
        kind = kinds.get(handler.headers.get("Content-Type", ""))
        if kind is None:
            return self.refuse(handler, 415, f"content type {handler.headers.get('Content-Type')}")
        if not isinstance(body, dict):
            return self.refuse(handler, 400, "the patch is not a JSON object")
        # What a real server would silently drop is a bug of the client: refuse it loud.
        if status and set(body) != {"status"}:
            return self.refuse(handler, 400, "nodes/status keeps only status: dropped " +
                               ", ".join(sorted(set(body) - {"status"})))  # fmt: skip
        if not status and "status" in body:
            return self.refuse(handler, 400, "a node's status is changed on nodes/status only")
        if self.before_patch is not None:
            self.before_patch(name)
        current = self.nodes[name]
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
            return self.refuse(handler, 409, f'Operation cannot be fulfilled on nodes "{name}": '
                               "the object has been modified")  # fmt: skip
        done = subprocess.run(
            [self.kubectl, "patch", "--local", "-f", "-", f"--type={kind}", "-p",
             json.dumps(body), "-o", "json"],
            input=json.dumps(current), capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            return self.refuse(handler, 422, done.stderr.strip())
        self.nodes[name] = json.loads(done.stdout)
        self.bump(name, lambda obj: None)
        self.answer(handler, 200, self.nodes[name])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api(kubectl) -> Iterator[NodesApi]:
    double = NodesApi(kubectl, cluster_nodes())
    yield double
    double.close()


def act(tmp_path: Path, api: NodesApi, *extra: str) -> int:
    verdicts = tmp_path / "verdicts.json"
    if not verdicts.exists():
        write_run(verdicts)
    kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
    return cli.main(["act", "kubernetes", "--verdicts", str(verdicts), "--kubeconfig",
                     str(kubeconfig), *extra])  # fmt: skip


def test_the_dry_run_reads_the_cluster_prints_every_change_and_changes_nothing(
    api, tmp_path, capsys
):
    before = copy.deepcopy(api.nodes)
    assert act(tmp_path, api) == 0
    out = capsys.readouterr().out
    assert api.nodes == before
    assert {(r.method, r.path) for r in api.requests} == {("GET", "/api/v1/nodes")}
    assert [r.query.get("continue") for r in api.requests] == [None, ["2"], ["4"]]
    assert "gpu-e: FAIL, but the cluster has no node gpu-e: left alone" in out
    assert "cpu-1" not in out
    printed = [
        line.split("would run: ", 1)[1] for line in out.splitlines() if "would run: " in line
    ]
    changes = planned(tmp_path)
    assert printed == [p.shown(name) for name, c in sorted(changes.items()) for p in c.patches]
    assert out.rstrip().endswith("dry run: nothing changed (--apply makes these changes)")


def test_apply_sends_each_patch_where_a_real_server_takes_it(api, tmp_path, capsys):
    assert act(tmp_path, api, "--apply") == 0
    out = capsys.readouterr().out
    patches = [r for r in api.requests if r.method == "PATCH"]
    assert [(r.path, r.content_type) for r in patches] == [
        (path, k8s.CONTENT_TYPES[kind])
        for name in ("gpu-a", "gpu-b", "gpu-c", "gpu-d")
        for path, kind in (
            ((f"/api/v1/nodes/{name}", "merge"), (f"/api/v1/nodes/{name}/status", "strategic"))
        )
    ]
    assert all(r.query["fieldManager"] == ["gpuhealth"] for r in patches)
    for name, (labels, taint_list, (status, reason, since)) in EXPECTED.items():
        obj = api.nodes[name]
        assert ours(obj) == labels
        assert taints(obj) == taint_list
        gpu = conditions(obj)["GpuHealthy"]
        assert (gpu["status"], gpu["reason"], gpu["lastTransitionTime"]) == (status, reason, since)
        assert conditions(obj)["Ready"] == READY
    assert api.nodes["cpu-1"] == cluster_nodes()[-1]
    assert "done: kubectl patch node gpu-a --type=merge" in out
    assert "taint gpuhealth.io/unhealthy=true:NoSchedule: removed" in out


def test_a_node_changed_since_it_was_read_is_read_again_and_nothing_is_lost(api, tmp_path, capsys):
    late = {"key": "maintenance", "value": "soon", "effect": "PreferNoSchedule"}

    def someone_else(name: str) -> None:
        if name == "gpu-a" and api.before_patch is not None:
            api.before_patch = None
            api.bump("gpu-a", lambda obj: obj["spec"].setdefault("taints", []).append(late))

    api.before_patch = someone_else
    assert act(tmp_path, api, "--apply") == 0
    assert "gpu-a changed since it was read: reading it again" in capsys.readouterr().out
    assert {r.permission for r in api.requests} == granted()  # all it needs, nothing more
    assert taints(api.nodes["gpu-a"]) == [late, OURS]
    sent = [
        (r.method, r.path, ((r.body or {}).get("metadata") or {}).get("resourceVersion"))
        for r in api.requests
        if "gpu-a" in r.path
    ]
    assert sent == [
        ("PATCH", "/api/v1/nodes/gpu-a", "100"),  # refused: 409
        ("GET", "/api/v1/nodes/gpu-a", None),
        ("PATCH", "/api/v1/nodes/gpu-a", "101"),
        ("PATCH", "/api/v1/nodes/gpu-a/status", None),
    ]


def test_a_refused_patch_is_reported_and_the_other_nodes_still_done(api, tmp_path, capsys):
    api.forbidden.add("/api/v1/nodes/gpu-b/status")
    assert act(tmp_path, api, "--apply") == 1
    out = capsys.readouterr().out
    assert (
        "FAILED: patch node gpu-b/status: 403 PATCH /api/v1/nodes/gpu-b/status is forbidden" in out
    )
    assert "1 of 4 nodes not changed (see FAILED above)" in out
    assert ours(api.nodes["gpu-d"])[k8s.VERDICT_LABEL] == "NOT_CHECKED"


def test_inventory_names_map_to_kubernetes_node_names(kubectl, tmp_path, capsys):
    renamed = cluster_nodes()
    renamed[0]["metadata"]["name"] = "gpu-a.k8s.internal"
    double = NodesApi(kubectl, renamed)
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  hosts:\n    gpu-a:\n      kubernetes_node_name: "
                         "gpu-a.k8s.internal\n    gpu-b: {}\n")  # fmt: skip
    try:
        assert act(tmp_path, double, "--apply", "--inventory", str(inventory)) == 0
    finally:
        double.close()
    assert "gpu-a.k8s.internal (gpu-a): FAIL" in capsys.readouterr().out
    assert ours(double.nodes["gpu-a.k8s.internal"])[k8s.gpu_label(3)] == "unhealthy"


def test_what_stops_the_command_is_one_clear_error(tmp_path, capsys, monkeypatch):
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    verdicts = write_run(tmp_path / "verdicts.json")
    code = cli.main(["act", "kubernetes", "--verdicts", str(verdicts), "--kubeconfig",
                     str(kubeconfig)])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 2
    assert out.startswith(
        f"gpuhealth act kubernetes: list nodes: cannot reach http://127.0.0.1:{port}"
    )
    assert cli.main(["act", "kubernetes", "--verdicts", str(verdicts), "--kubeconfig",
                     str(tmp_path / "none")]) == 2  # fmt: skip
    assert "no cluster to talk to" in capsys.readouterr().out
    monkeypatch.setattr(kubernetes, "__version__", "35.0.0")
    assert cli.main(["act", "kubernetes", "--verdicts", str(verdicts)]) == 2
    assert "client 35.0.0 is too old: gpuhealth needs 36 or newer" in capsys.readouterr().out
    assert cli.main(["act", "kubernetes", "--verdicts", str(verdicts), "--inventory",
                     str(tmp_path / "none.yml")]) == 2  # fmt: skip
    assert "none.yml: no such file" in capsys.readouterr().out


# ---------------------------------------------------------------- node-problem-detector


GO_DURATION = re.compile(r"(\d+)(h|m|s)")


def seconds(text: str) -> float:
    """A Go duration as NPD's config has them ("5m", "45s", "1m30s")."""
    parts = GO_DURATION.findall(text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a Go duration: {text!r}"
    return sum(int(n) * {"h": 3600, "m": 60, "s": 1}[u] for n, u in parts)


@pytest.fixture(scope="module")
def npd() -> dict[str, Any]:
    return dict(json.loads(NPD_CONFIG.read_text()))


def test_the_npd_config_is_one_npd_accepts_and_fits_its_timeouts(npd):
    """NPD's own Validate() rules, then the budget: gpuhealth answers before NPD kills it."""
    assert npd["plugin"] == "custom"
    glob = npd["pluginConfig"]
    interval, timeout = seconds(glob["invoke_interval"]), seconds(glob["timeout"])
    assert glob["max_output_length"] >= nodecheck.NPD_MESSAGE_MAX
    defaults = {c["type"] for c in npd["conditions"]}
    assert {r["type"] for r in npd["rules"]} == {"permanent", "temporary"}
    for rule in npd["rules"]:
        assert seconds(rule["timeout"]) <= timeout < 60
        assert re.fullmatch(r"[A-Z][A-Za-z]+", rule["reason"])
        if rule["type"] == "permanent":
            assert rule["condition"] in defaults
        # Both rules run the same gpuhealth on the same inventory.
        assert (rule["path"], rule["args"]) == (npd["rules"][0]["path"], npd["rules"][0]["args"])
        args = cli.build_parser().parse_args(rule["args"])
        assert (args.command, args.npd, args.inventory) == (
            "node-check",
            True,
            "/etc/gpuhealth/inventory.yml",
        )
        # The probe is killed 5 s after --timeout (timeout -k 5): room left for start-up.
        assert args.timeout + 5 + 5 <= seconds(rule["timeout"])
    # Rules run one at a time (concurrency 1: one probe at once): all within one interval.
    assert glob["concurrency"] == 1
    assert len(npd["rules"]) * timeout < interval


NPD_CASES = {
    "healthy": ("healthy-h100x8", True, nodecheck.NPD_OK, "PASS"),
    "faulty": ("ecc-gpu3-recovery-gpu5", True, nodecheck.NPD_PROBLEM, "FAIL"),
    "not-listed": ("healthy-h100x8", False, nodecheck.NPD_UNKNOWN, "cannot check this node"),
}


def run_as_npd(npd, case, tmp_path, lib) -> tuple[subprocess.CompletedProcess[str], float]:
    """The permanent rule's command as NPD runs it, with its timeout; on this machine the
    plugin is the venv's gpuhealth, the inventory a file naming (or not) this host, and the
    node's /proc and /sys the H100 fixture tree."""
    scenario, listed, _, _ = NPD_CASES[case]
    rule = next(r for r in npd["rules"] if r["type"] == "permanent")
    inventory = tmp_path / "inventory.yml"
    host = HOST if listed else "some-other-node"
    inventory.write_text(f"all:\n  hosts:\n    {host}:\n      gpu_profile: h100-sxm\n"
                         "      gpu_count: 8\n")  # fmt: skip
    args = [str(inventory) if a == "/etc/gpuhealth/inventory.yml" else a for a in rule["args"]]
    env = nvml_env(lib.parent, write_scenario(load_scenario(scenario), tmp_path / "s.conf"))
    env["PATH"] = f"{NODE_TOOLS}:{env['PATH']}"
    plugin = str(Path(sys.executable).with_name("gpuhealth"))
    started = time.monotonic()
    done = subprocess.run(
        [plugin, *args, "--root", str(TREE)], capture_output=True, text=True, env=env,
        timeout=seconds(rule["timeout"]), check=False,
    )  # fmt: skip
    return done, time.monotonic() - started


@pytest.fixture(scope="module")
def npd_answer(npd, tmp_path_factory, fake_nvml_lib):
    """Each case run once for this module: its answer and how long it took."""
    answers: dict[str, tuple[subprocess.CompletedProcess[str], float]] = {}

    def answer(case: str) -> tuple[subprocess.CompletedProcess[str], float]:
        if case not in answers:
            answers[case] = run_as_npd(npd, case, tmp_path_factory.mktemp(case), fake_nvml_lib)
        return answers[case]

    return answer


@pytest.mark.parametrize("case", sorted(NPD_CASES))
def test_node_check_answers_npd_in_one_line_well_within_its_timeout(case, npd, npd_answer):
    done, took = npd_answer(case)
    _, _, code, says = NPD_CASES[case]
    assert done.returncode == code, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1 and says in lines[0]
    assert len(lines[0]) <= npd["pluginConfig"]["max_output_length"]
    assert took < seconds(npd["pluginConfig"]["timeout"]) / 4, f"{took:.1f} s"


def test_the_npd_message_names_the_problem(npd_answer):
    done, _ = npd_answer("faulty")
    assert re.search(r"gpu[35]\b.*(recovery|GPU_RESET|ECC)", done.stdout), done.stdout
