"""Kubernetes: label, taint and condition each node as the run judged it.

Per node: a label `gpuhealth.io/verdict=<verdict>`, a label `gpuhealth.io/gpu.<N>.state` per
GPU slot (AMD's per-GPU convention), the taint `gpuhealth.io/unhealthy=true:NoSchedule` on
FAIL and UNREACHABLE (removed on a PASS of a complete run, and no other taint is ever
touched), and a `GpuHealthy` node condition (True/False/Unknown, the headline as message).
Missing data never reads as healthy: an UNREACHABLE or NOT_CHECKED node's GPUs are `unknown`,
except one gpuhealth last saw `unhealthy`, which stays so until a run judges it again.

Why the official Python client (`kubernetes` on PyPI) and not kubectl:
- the changes are read-modify-write: a merge patch replaces the taint list whole, so the new
  list is computed from the node as read and sent with its `metadata.resourceVersion`; the
  API server refuses it (409) if the node changed in between, and the node is read again and
  the change re-planned. With the client that is a status code and a retry loop, not parsing
  kubectl's error text;
- the condition lives in the status subresource (`nodes/status`), patched with a strategic
  merge patch keyed by condition type so the kubelet's own conditions stay; kubectl can do it
  only from 1.24 (`--subresource`), and Debian ships kubectl 1.20;
- it is a Python dependency pinned with gpuhealth (`gpuhealth[kubernetes]`), not a binary
  whose version must stay within one minor release of each cluster's;
- in a pod it uses the service account (in-cluster config), elsewhere a kubeconfig (and its
  auth plugins) exactly as kubectl would read it.
Every change is also printed as the kubectl command that makes it: the dry run (the default)
reads the cluster and prints them, `--apply` makes them and prints what it did. A node of the
run that the cluster does not have is named and left alone; nodes not in the run are not read
beyond the list.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from packaging.version import Version

from gpuhealth import report as reporting
from gpuhealth.config import ConfigError
from gpuhealth.integrations import verdicts as runs
from gpuhealth.report import gpu_ranges

PREFIX = "gpuhealth.io"
VERDICT_LABEL = f"{PREFIX}/verdict"
GPU_LABEL = re.compile(r"gpuhealth\.io/gpu\.(\d+)\.state")
HEALTHY, UNHEALTHY, UNKNOWN = "healthy", "unhealthy", "unknown"
TAINT_KEY = f"{PREFIX}/unhealthy"
TAINT = {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}
TAINTED = ("FAIL", "UNREACHABLE")
JUDGED = ("PASS", "WARN", "FAIL")  # verdicts that say something about every GPU slot
CONDITION = "GpuHealthy"
# The condition per verdict: status, reason (CamelCase, as Kubernetes' own reasons).
CONDITIONS = {
    "PASS": ("True", "GpuChecksPassed"),
    "WARN": ("True", "GpuChecksWarned"),
    "FAIL": ("False", "GpuChecksFailed"),
    "UNREACHABLE": ("Unknown", "NodeUnreachable"),
    "NOT_CHECKED": ("Unknown", "GpuNotChecked"),
}
MESSAGE_MAX = 512  # a condition message is read in `kubectl describe node`: the headline
REQUEST_TIMEOUT_S = (10, 30)  # connect, read: per API request
ATTEMPTS = 3  # a node that keeps changing under us is reported, not fought over
PAGE = 500  # nodes per list request
FIELD_MANAGER = "gpuhealth"
CLIENT_MIN = "36"  # the first release of the official client that takes `_content_type`
MERGE, STRATEGIC = "merge", "strategic"
CONTENT_TYPES = {
    MERGE: "application/merge-patch+json",
    STRATEGIC: "application/strategic-merge-patch+json",
}


class KubernetesError(Exception):
    """The cluster could not be reached, or refused a request (`status` is its HTTP code)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def gpu_label(index: int) -> str:
    """The label of one GPU slot: `gpuhealth.io/gpu.3.state`."""
    return f"{PREFIX}/gpu.{index}.state"


@dataclass(frozen=True)
class Patch:
    """One PATCH of a node (or its status): its type and body, and the same as kubectl."""

    kind: str  # MERGE or STRATEGIC
    body: dict[str, Any]
    subresource: str | None = None  # "status" for the conditions

    @property
    def content_type(self) -> str:
        """The Content-Type the API server reads the body by."""
        return CONTENT_TYPES[self.kind]

    def argv(self, node: str) -> list[str]:
        """The kubectl command that makes the same change."""
        args = ["kubectl", "patch", "node", node]
        if self.subresource:
            args.append(f"--subresource={self.subresource}")
        return [*args, f"--type={self.kind}", "-p", json.dumps(self.body, separators=(",", ":"))]

    def shown(self, node: str) -> str:
        """The kubectl command as one would type it in a shell."""
        return shlex.join(self.argv(node))


@dataclass(frozen=True)
class NodeChange:
    """What one node gets: the changes in words, what is left alone and why, the patches."""

    host: str
    node: str
    verdict: str
    changes: list[str]
    notes: list[str] = field(default_factory=list)
    patches: list[Patch] = field(default_factory=list)

    @property
    def where(self) -> str:
        """The node as the output names it (with its inventory name where that differs)."""
        return self.node if self.node == self.host else f"{self.node} ({self.host})"


def wanted_labels(state: runs.NodeState, labels: dict[str, str]) -> dict[str, str | None]:
    """gpuhealth's labels as the run says they should be (None: remove the label).

    A judged node's GPU slots are `healthy` unless a check failed on them; without a slot
    count (an older verdicts.json) only the failed ones are labelled. An UNREACHABLE or
    NOT_CHECKED node's slots are `unknown`, but an `unhealthy` one stays so. Labels of GPU
    indices beyond the slots are removed."""
    wanted: dict[str, str | None] = {VERDICT_LABEL: state.verdict}
    current = {
        int(m.group(1)): value
        for key, value in labels.items()
        if (m := GPU_LABEL.fullmatch(key)) is not None
    }
    bad = state.bad_gpus()
    judged = state.verdict in JUDGED
    slots = set(range(state.gpu_slots)) if state.gpu_slots is not None else set(current)
    for index in sorted(slots | bad | set(current)):
        value: str | None
        if index in bad:
            value = UNHEALTHY
        elif index not in slots:
            value = None
        elif judged and not state.vouches_for_idle and current.get(index) == UNHEALTHY:
            value = UNHEALTHY  # a PASS judged in use does not clear what an idle rule found
        elif judged:
            value = HEALTHY if state.gpu_slots is not None else None
        else:
            value = UNHEALTHY if current.get(index) == UNHEALTHY else UNKNOWN
        wanted[gpu_label(index)] = value
    return wanted


def _gpus(value: str, indices: list[int]) -> str:
    """GPU labels in words: `labels gpuhealth.io/gpu.N.state=healthy for gpu0-2, gpu4-7`."""
    return f"labels {PREFIX}/gpu.N.state{value} for {gpu_ranges(indices)}"


def _label_changes(patch: dict[str, str | None], labels: dict[str, str]) -> list[str]:
    """The label changes in words, the GPU labels grouped by their old and new value."""
    lines: list[str] = []
    groups: dict[tuple[str | None, str | None], list[int]] = {}
    for key, value in patch.items():
        match = GPU_LABEL.fullmatch(key)
        if match is None:
            before = labels.get(key)
            lines.append(f"label {key}={value}" + (f" (was {before})" if before else ""))
        else:
            groups.setdefault((labels.get(key), value), []).append(int(match.group(1)))
    for (before, value), indices in groups.items():
        now = " removed" if value is None else f"={value}"
        lines.append(_gpus(now, indices) + (f" (was {before})" if before else ""))
    return lines


def condition_message(state: runs.NodeState, complete: bool) -> str:
    """The condition's message: the verdict and the headline, on one bounded line."""
    text = reporting.headline(state.verdict, state.reasons)
    if not complete:
        text += " (the run did not finish)"
    return reporting.one_line(text, MESSAGE_MAX)


def _ours(taint: dict[str, Any]) -> bool:
    """gpuhealth's taint: taints are unique by key and effect, so the same key with another
    effect is someone else's."""
    return taint.get("key") == TAINT_KEY and taint.get("effect") == TAINT["effect"]


def _plan_taints(
    state: runs.NodeState, taints: list[dict[str, Any]], complete: bool
) -> tuple[list[dict[str, Any]] | None, list[str], list[str]]:
    """The node's new taint list (None: unchanged), the change in words, what is kept."""
    verdict = state.verdict
    mine = [t for t in taints if _ours(t)]
    others = [t for t in taints if not _ours(t)]
    shown = f"taint {TAINT_KEY}={TAINT['value']}:{TAINT['effect']}"
    if verdict in TAINTED:
        return (None, [], []) if mine == [TAINT] else ([*others, TAINT], [f"{shown}: added"], [])
    if not mine:
        return None, [], []
    if verdict != "PASS":
        return None, [], [f"{shown} kept: only a PASS removes it"]
    if not complete:
        return None, [], [f"{shown} kept: the run did not finish"]
    if not state.vouches_for_idle:
        return None, [], [f"{shown} kept: PASS judged in use (fault rules only)"]
    return others, [f"{shown}: removed"], []


def _plan_condition(
    state: runs.NodeState, conditions: list[dict[str, Any]], complete: bool, at: str
) -> tuple[dict[str, str], list[str], list[str]]:
    """The GpuHealthy condition to set (its transition time kept while its status stays), the
    change in words, what stays."""
    status, reason = CONDITIONS[state.verdict]
    old = next((c for c in conditions if c.get("type") == CONDITION), None)
    if old and old.get("status") == "False" and status == "True" and not state.vouches_for_idle:
        # Faults only were judged: what an idle rule found stands until an idle PASS.
        stays = {**old, "lastHeartbeatTime": at}
        return stays, [], [f"condition {CONDITION}=False kept: {state.verdict} judged in use"]
    since = old.get("lastTransitionTime") if old and old.get("status") == status else None
    condition = {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": condition_message(state, complete),
        "lastHeartbeatTime": at,
        "lastTransitionTime": since or at,
    }
    if old is None or not since:
        was = f" (was {old.get('status')})" if old else ""
        return condition, [f"condition {CONDITION}={status}{was} ({reason}): "
                           f"{condition['message']}"], []  # fmt: skip
    kept = f"condition {CONDITION}={status} since {since}"
    if (old.get("reason"), old.get("message")) == (reason, condition["message"]):
        return condition, [], [f"{kept}, as this run says"]
    return condition, [f"{kept} ({reason}): {condition['message']}"], []


def plan_node(
    state: runs.NodeState, name: str, node: dict[str, Any], complete: bool, at: str
) -> NodeChange:
    """The change that makes the node `node` (as the API returned it) say what the run
    says about `state`; `at` is when the run observed it (the condition's times)."""
    meta = node.get("metadata") or {}
    labels: dict[str, str] = meta.get("labels") or {}
    label_patch = {
        key: value
        for key, value in wanted_labels(state, labels).items()
        if labels.get(key) != value
    }
    changes = _label_changes(label_patch, labels)
    notes: list[str] = []
    if state.verdict not in JUDGED:
        kept = [
            int(m.group(1))
            for key, value in labels.items()
            if value == UNHEALTHY and key not in label_patch and (m := GPU_LABEL.fullmatch(key))
        ]
        if kept:
            notes.append(f"{_gpus('=' + UNHEALTHY, kept)} kept: this run did not judge the GPUs")

    taints = (node.get("spec") or {}).get("taints") or []
    new_taints, changed, kept_taints = _plan_taints(state, taints, complete)
    changes += changed
    notes += kept_taints
    patches: list[Patch] = []
    if label_patch or new_taints is not None:
        metadata: dict[str, Any] = {"labels": label_patch} if label_patch else {}
        body: dict[str, Any] = {"metadata": metadata}
        if new_taints is not None:
            # The list is replaced whole: only if the node is still the one it was read as.
            if meta.get("resourceVersion"):
                metadata["resourceVersion"] = meta["resourceVersion"]
            body["spec"] = {"taints": new_taints}
        patches.append(Patch(MERGE, body))

    conditions = (node.get("status") or {}).get("conditions") or []
    condition, changed, kept_condition = _plan_condition(state, conditions, complete, at)
    changes += changed
    notes += kept_condition
    # Conditions merge by type in a strategic merge patch: the kubelet's own ones stay.
    patches.append(Patch(STRATEGIC, {"status": {"conditions": [condition]}}, "status"))
    return NodeChange(state.host, name, state.verdict, changes, notes, patches)


def plan(
    run: runs.Run, names: dict[str, str], nodes: dict[str, dict[str, Any]], at: str
) -> tuple[list[NodeChange], list[str]]:
    """Per node of the run that the cluster has, its change; and the nodes it does not have."""
    changes: list[NodeChange] = []
    missing: list[str] = []
    for host, state in sorted(run.nodes.items()):
        name = names.get(host, host)
        node = nodes.get(name)
        if node is None:
            where = host if name == host else f"{host} (Kubernetes {name})"
            missing.append(
                f"{where}: {state.verdict}, but the cluster has no node {name}: left alone"
            )
            continue
        changes.append(plan_node(state, name, node, run.complete, at))
    return changes, missing


def observed_at(run: runs.Run) -> str:
    """When the run judged its nodes (the condition's heartbeat), else now; RFC 3339."""
    try:
        when = time.strptime(run.generated_at, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        when = time.gmtime()
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", when)


class Cluster:
    """The nodes API through the official Python client: list, read, patch."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None) -> None:
        """Connect as the pod's service account when in a pod and no kubeconfig or context is
        named, else as the kubeconfig says (KUBECONFIG, ~/.kube/config, or `kubeconfig`)."""
        try:
            import kubernetes
            from kubernetes import client, config
        except ImportError:
            raise KubernetesError(
                "the kubernetes Python client is not installed: pip install 'gpuhealth[kubernetes]'"
            ) from None
        if Version(kubernetes.__version__) < Version(CLIENT_MIN):
            # Older clients cannot name a patch's content type (they send every object as a
            # strategic merge patch and refuse the argument).
            raise KubernetesError(
                f"the kubernetes Python client {kubernetes.__version__} is too old: gpuhealth "
                f"needs {CLIENT_MIN} or newer (pip install 'gpuhealth[kubernetes]')"
            )
        self._client = client
        try:
            if kubeconfig is None and context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                configuration = client.Configuration()
                config.load_incluster_config(client_configuration=configuration)
                api_client = client.ApiClient(configuration)
            else:
                api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
        except (config.ConfigException, OSError, ValueError) as exc:
            raise KubernetesError(f"no cluster to talk to: {exc}") from None
        self.server = str(api_client.configuration.host)
        self.api = client.CoreV1Api(api_client)

    def _call(self, what: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One request; its JSON answer, or KubernetesError saying what failed and why."""
        import urllib3

        try:
            response = method(
                *args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S, **kwargs
            )
            return json.loads(response.data)
        except self._client.ApiException as exc:
            try:
                said = json.loads(exc.body or "{}").get("message") or exc.reason
            except (ValueError, AttributeError):
                said = exc.reason
            raise KubernetesError(f"{what}: {exc.status} {said}", exc.status) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubernetesError(f"{what}: cannot reach {self.server}: {exc}") from None
        except ValueError as exc:
            raise KubernetesError(f"{what}: the answer is not JSON: {exc}") from None

    def nodes(self) -> dict[str, dict[str, Any]]:
        """Every node of the cluster by name (listed a page at a time)."""
        found: dict[str, dict[str, Any]] = {}
        token: str | None = None
        while True:
            extra = {"_continue": token} if token else {}
            page = self._call("list nodes", self.api.list_node, limit=PAGE, **extra)
            for node in page.get("items") or []:
                found[node["metadata"]["name"]] = node
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return found

    def node(self, name: str) -> dict[str, Any]:
        """One node as it is now."""
        return dict(self._call(f"read node {name}", self.api.read_node, name))

    def patch(self, name: str, patch: Patch) -> dict[str, Any]:
        """Send one patch; the node as the server left it."""
        method = self.api.patch_node_status if patch.subresource else self.api.patch_node
        what = f"patch node {name}" + (f"/{patch.subresource}" if patch.subresource else "")
        return dict(
            self._call(
                what,
                method,
                name,
                patch.body,
                field_manager=FIELD_MANAGER,
                _content_type=patch.content_type,
            )
        )


def apply(
    change: NodeChange,
    state: runs.NodeState,
    cluster: Cluster,
    complete: bool,
    at: str,
    say: Callable[[str], None] = print,
) -> bool:
    """Make one node's change; whether it was made. A node that changed since it was read
    (409) is read again and its change planned anew, up to ATTEMPTS times."""
    attempt = 1
    while True:
        try:
            for patch in change.patches:
                cluster.patch(change.node, patch)
                say(f"  done: {patch.shown(change.node)}")
            for line in change.changes:
                say(f"  {line}")
            return True
        except KubernetesError as exc:
            if exc.status != 409 or attempt == ATTEMPTS:
                say(f"  FAILED: {exc}")
                return False
        attempt += 1
        say(f"  {change.node} changed since it was read: reading it again")
        try:
            change = plan_node(state, change.node, cluster.node(change.node), complete, at)
        except KubernetesError as exc:
            say(f"  FAILED: {exc}")
            return False


def _show(change: NodeChange, apply_it: bool) -> None:
    print(f"{change.where}: {change.verdict}")
    for note in change.notes:
        print(f"  {note}")
    if not apply_it:
        if not change.changes:
            print("  nothing to change but the condition's heartbeat")
        for line in change.changes:
            print(f"  {line}")
        for patch in change.patches:
            print(f"  would run: {patch.shown(change.node)}")


def _act(args: argparse.Namespace) -> int:
    try:
        run = runs.load(args.verdicts)
        names = runs.node_names(list(run.nodes), args.inventory, "kubernetes_node_name")
        cluster = Cluster(args.kubeconfig, args.context)
        nodes = cluster.nodes()
    except (runs.VerdictsError, ConfigError, KubernetesError) as exc:
        print(f"gpuhealth act kubernetes: {exc}")
        return 2
    at = observed_at(run)
    changes, missing = plan(run, names, nodes, at)
    print(f"{run.title}: {len(run.nodes)} nodes, {len(changes)} in the cluster at {cluster.server}")
    for line in missing:
        print(f"  {line}")
    failed = 0
    for change in changes:
        _show(change, args.apply)
        if args.apply and not apply(change, run.nodes[change.host], cluster, run.complete, at):
            failed += 1
    if not args.apply and changes:
        print("dry run: nothing changed (--apply makes these changes)")
    if failed:
        print(f"{failed} of {len(changes)} nodes not changed (see FAILED above)")
    return 1 if failed else 0


def add_parser(targets: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """`gpuhealth act kubernetes`."""
    parser = targets.add_parser(
        "kubernetes",
        parents=[common],
        help="label, taint and set a GpuHealthy condition on each node as the run judged it",
        description=__doc__.splitlines()[0],
    )
    parser.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: the service account in a pod, else KUBECONFIG or "
        "~/.kube/config)",
    )
    parser.add_argument("--context", help="kubeconfig context (default: its current one)")
    parser.set_defaults(func=_act)
