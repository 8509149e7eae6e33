"""DCGM checks: the diagnostic (`dcgmi diag`, active) and the health watches (passive).

`dcgm` is one diagnostic run: the active runner writes it (`{"level", "command", "rc",
"error", "action", "duration_s", "diag": <parse_dcgm.parse_diag result> | None}`), triage
builds it from saved `dcgmi diag -j` output. Results about one GPU are judged per GPU
(`dcgm_diag_gpu`); the run itself and results about the whole node (deployment checks, other
entities) by `dcgm_diag`. Fail fails, Warn warns, Skip skips with DCGM's reason.

`dcgm_health` comes from the probe (`dcgmi health -c -j`), where the inventory says DCGM is
installed. A missing dcgmi, a host engine that is not running, or output that is not JSON is a
failure with the reason, never a pass.
"""

from __future__ import annotations

from typing import Any

from gpuhealth.checks import (
    CheckSet,
    NodeView,
    detail,
    load_test_output,
    section,
)
from gpuhealth.facts import reason
from gpuhealth.families.gpu.scope import GPU
from gpuhealth.results import Action, Result, Status, failed, passed, skipped, warned

CHECKS = CheckSet("dcgm", ranks={"dcgm": 1})

_GPU_ACTION = (
    "drain the node, reset the GPU (`nvidia-smi -r -i INDEX`) and run `dcgmi diag -r 3 -i "
    "INDEX`; if it fails again, RMA the GPU with the attached DCGM output"
)
_NODE_ACTION = "fix what DCGM names (driver, persistence mode, permissions...) and re-run"


def _describe(test: dict[str, Any], result: dict[str, Any]) -> str:
    words = result["warnings"] or result["info"]
    detail = f": {' | '.join(words)[:400]}" if words else ""
    return f"{test['name']} {result['status']}{detail}"


def _diag(node: NodeView) -> dict[str, Any]:
    return load_test_output(node, "dcgm", "diag", "DCGM diagnostic did not run", "output")


def _verdict(buckets: dict[str, list[str]]) -> tuple[Status, str] | None:
    """FAIL with the failed (and unknown) results, else WARN with the warnings, else None."""
    bad = buckets["failed"] + buckets["odd"]
    if bad:
        return Status.FAIL, "; ".join(bad)
    if buckets["warned"]:
        return Status.WARN, "; ".join(buckets["warned"])
    return None


def _sort(test: dict[str, Any], result: dict[str, Any], buckets: dict[str, list[str]]) -> None:
    status = result["status"]
    text = _describe(test, result)
    if status == "Fail":
        buckets["failed"].append(text)
    elif status == "Warn":
        buckets["warned"].append(text)
    elif status in ("Skip", "Not Run"):
        buckets["skipped"].append(text)
    elif status == "Pass":
        buckets["passed"].append(test["name"])
    else:
        buckets["odd"].append(f"{test['name']}: unknown status {status!r}")


def _buckets() -> dict[str, list[str]]:
    return {"failed": [], "warned": [], "skipped": [], "passed": [], "odd": []}


def _level(node: NodeView, diag: dict[str, Any]) -> str:
    level = (node.facts.get("dcgm") or {}).get("level")
    version = f" {diag['version']}" if diag.get("version") else ""
    run = f"dcgmi diag -r {level}" if level else "dcgmi diag"
    return f"{run} (DCGM {diag['layout']}{version})"


@CHECKS.node("dcgm_diag", "dcgm", section="dcgm", level="standard", in_use=False)
def dcgm_diag(node: NodeView) -> Result:
    """The DCGM diagnostic ran and its node-wide tests (deployment, non-GPU entities) passed.

    Saved output triaged on its own comes without GPU records to hang per-GPU results on: then
    they are judged here too, each named by its GPU.
    """
    diag = _diag(node)
    here = node.facts.get("gpus") is None
    run = _level(node, diag)
    if diag.get("runtime_error"):
        return failed(
            f"{run} stopped: {diag['runtime_error']}",
            Action.INSPECT,
            "read /var/log/nv-hostengine.log; check that no other job holds the GPUs",
        )
    if not diag["tests"]:
        return failed(f"{run} reported no test results", Action.RERUN, "read the attached output")
    buckets = _buckets()
    per_gpu = 0
    # GPUs judged per GPU (dcgm_diag_gpu); results about any other GPU are judged here.
    slots = 0 if here else GPU.slots(node)
    for test in diag["tests"]:
        for result in test["results"]:
            named = test
            if len(result["gpus"]) == 1 and result["entity"] is None:
                per_gpu += 1
                if 0 <= result["gpus"][0] < slots:  # a negative id is judged here, not lost
                    continue
                named = {**test, "name": f"GPU {result['gpus'][0]} {test['name']}"}
            _sort(named, result, buckets)
        if not test["results"] and test.get("summary"):
            _sort(test, {"status": test["summary"], "warnings": [], "info": []}, buckets)
    verdict = _verdict(buckets)
    if verdict:
        action = Action.RESET_GPU if here else Action.FIX_CONFIG
        return Result(verdict[0], f"{run}: {verdict[1]}", action, _NODE_ACTION)
    skips = f"; skipped: {'; '.join(buckets['skipped'])}" if buckets["skipped"] else ""
    where = "judged here (no GPU records)" if here else "judged per GPU"
    return passed(
        f"{run}: {len(buckets['passed'])} results passed ({per_gpu} per-GPU results {where}){skips}"
    )


@CHECKS.per(GPU, "dcgm_diag_gpu", "dcgm", section="dcgm", level="standard", in_use=False)
def dcgm_diag_gpu(node: NodeView, gpu: dict[str, Any]) -> Result:
    """Every DCGM diagnostic test that ran on this GPU passed (Warn warns, Skip skips)."""
    run_section = section(node, "dcgm")
    if run_section.get("error") or run_section.get("diag") is None:
        return skipped("no per-GPU results: the diagnostic did not run (see dcgm_diag)")
    diag = run_section["diag"]
    index = gpu["index"]
    per_gpu = [
        (test, result)
        for test in diag["tests"]
        for result in test["results"]
        if len(result["gpus"]) == 1 and result["entity"] is None
    ]
    mine = [(test, result) for test, result in per_gpu if result["gpus"] == [index]]
    run = _level(node, diag)
    if not per_gpu:
        return skipped(f"{run} ran no per-GPU tests")
    if not mine:
        seen = sorted({r["gpus"][0] for _, r in per_gpu})
        return failed(
            f"{run} has no result for GPU {index} (results for GPUs {seen})",
            Action.INSPECT,
            "check that DCGM sees the GPU (`dcgmi discovery -l`); reseat or RMA it if not",
        )
    buckets = _buckets()
    for test, result in mine:
        _sort(test, result, buckets)
    verdict = _verdict(buckets)
    if verdict:
        advice = _GPU_ACTION.replace("INDEX", str(index))
        action = Action.RESET_GPU if verdict[0] is Status.FAIL else Action.INSPECT
        return Result(verdict[0], f"{run}: {verdict[1]}", action, advice)
    if not buckets["passed"]:
        return skipped(f"{run}: every test skipped: {'; '.join(buckets['skipped'])}")
    skips = f"; skipped: {'; '.join(buckets['skipped'])}" if buckets["skipped"] else ""
    return passed(f"{run}: {', '.join(buckets['passed'])} passed{skips}")


def _health_action(text: str) -> tuple[Action, str]:
    text = text.lower()
    if "not found" in text or "no such file" in text:
        return (
            Action.FIX_CONFIG,
            "install DCGM (role dcgm: datacenter-gpu-manager), or set dcgm_installed: false",
        )
    if "watches not enabled" in text:
        return (
            Action.FIX_CONFIG,
            "enable the health watches (`dcgmi health -s a`; they are lost when nv-hostengine "
            "restarts, so let the dcgm role or a unit set them)",
        )
    if "connect" in text or "host engine" in text:
        return (
            Action.FIX_CONFIG,
            "start the host engine: `systemctl enable --now nvidia-dcgm`, then check its log",
        )
    return Action.RERUN, "run `dcgmi health -c` on the node to see the error"


def _incident(incident: dict[str, Any]) -> str:
    where = " ".join(part for part in (incident["entity"], incident["system"]) if part)
    text = f"{where} {incident['health']}"
    return f"{text}: {incident['message']}" if incident["message"] else text


@CHECKS.node("dcgm_health", "dcgm", section="dcgm_health", in_use=True)
def dcgm_health(node: NodeView) -> Result:
    """DCGM's health watches report Healthy (where DCGM is installed)."""
    watches = section(node, "dcgm_health")
    health = watches.get("health")
    if health is None:
        text = detail(watches, "health")
        if reason(watches, "health")["kind"] == "absent":
            return skipped(f"not evaluated: the evidence holds no DCGM health ({text})")
        return failed(f"could not read DCGM health: {text}", *_health_action(text))
    incidents = [_incident(i) for i in health["incidents"] if i.get("health") != "Healthy"]
    listed = f": {'; '.join(incidents)[:600]}" if incidents else ""
    # The worst of the overall value and the entities': evidence that says Healthy overall but
    # lists a Warning is inconsistent, and an entity whose health is unknown is not healthy.
    ranks = {"Healthy": 0, "Warning": 1}
    healths = [health["overall"], *(i.get("health") or "unknown" for i in health["incidents"])]
    overall = max(healths, key=lambda h: ranks.get(str(h), 2))
    if overall != health["overall"]:
        listed = f" (overall says {health['overall']}){listed}"
    if overall == "Healthy":
        return passed("DCGM overall health Healthy")
    if overall == "Warning":
        return warned(
            f"DCGM overall health Warning{listed}", Action.INSPECT, "watch the named subsystem"
        )
    return failed(
        f"DCGM overall health {overall}{listed}",
        Action.RESET_GPU,
        "drain the node and act on the named subsystem (reset or RMA the GPU it names)",
    )
