"""DCGM checks: the diagnostic (`dcgmi diag`, active) and the health watches (passive).

`dcgm` is one diagnostic run: the active runner writes it (`{"level", "command", "rc",
"error", "action", "duration_s", "diag": <parsers.dcgm.parse_diag result> | None}`), triage
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
    FAIL,
    PASS,
    SKIP,
    WARN,
    NodeView,
    Result,
    check,
    load_test_output,
)

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


def _verdict(failed: list[str], warned: list[str], odd: list[str]) -> Result | None:
    if failed or odd:
        return Result(FAIL, "; ".join(failed + odd), None)
    if warned:
        return Result(WARN, "; ".join(warned), None)
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
    level = node.facts["dcgm"].get("level")
    version = f" {diag['version']}" if diag.get("version") else ""
    run = f"dcgmi diag -r {level}" if level else "dcgmi diag"
    return f"{run} (DCGM {diag['layout']}{version})"


@check("dcgm_diag", "node", "dcgm", section="dcgm", level="standard")
def dcgm_diag(node: NodeView) -> Result:
    """The DCGM diagnostic ran and its node-wide tests (deployment, non-GPU entities) passed.

    Saved output triaged on its own comes without GPU records to hang per-GPU results on: then
    they are judged here too, each named by its GPU.
    """
    diag = _diag(node)
    here = node.facts.get("gpus") is None
    run = _level(node, diag)
    if diag.get("runtime_error"):
        return Result(
            FAIL,
            f"{run} stopped: {diag['runtime_error']}",
            "read /var/log/nv-hostengine.log; check that no other job holds the GPUs",
        )
    if not diag["tests"]:
        return Result(FAIL, f"{run} reported no test results", "read the attached output")
    buckets = _buckets()
    per_gpu = 0
    for test in diag["tests"]:
        for result in test["results"]:
            named = test
            if len(result["gpus"]) == 1 and result["entity"] is None:
                per_gpu += 1
                if not here:
                    continue
                named = {**test, "name": f"GPU {result['gpus'][0]} {test['name']}"}
            _sort(named, result, buckets)
        if not test["results"] and test.get("summary"):
            _sort(test, {"status": test["summary"], "warnings": [], "info": []}, buckets)
    verdict = _verdict(buckets["failed"], buckets["warned"], buckets["odd"])
    if verdict:
        return Result(verdict.status, f"{run}: {verdict.message}", _NODE_ACTION)
    skipped = f"; skipped: {'; '.join(buckets['skipped'])}" if buckets["skipped"] else ""
    where = "judged here (no GPU records)" if here else "judged per GPU"
    return Result(
        PASS,
        f"{run}: {len(buckets['passed'])} results passed ({per_gpu} per-GPU results {where})"
        f"{skipped}",
    )


@check("dcgm_diag_gpu", "gpu", "dcgm", section="dcgm", level="standard")
def dcgm_diag_gpu(node: NodeView, gpu: dict[str, Any]) -> Result:
    """Every DCGM diagnostic test that ran on this GPU passed (Warn warns, Skip skips)."""
    section = node.facts["dcgm"]
    if section.get("skip"):
        return Result(SKIP, section["skip"])
    if section.get("error") or section.get("diag") is None:
        return Result(SKIP, "no per-GPU results: the diagnostic did not run (see dcgm_diag)")
    diag = section["diag"]
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
        return Result(SKIP, f"{run} ran no per-GPU tests")
    if not mine:
        seen = sorted({r["gpus"][0] for _, r in per_gpu})
        return Result(
            FAIL,
            f"{run} has no result for GPU {index} (results for GPUs {seen})",
            "check that DCGM sees the GPU (`dcgmi discovery -l`); reseat or RMA it if not",
        )
    buckets = _buckets()
    for test, result in mine:
        _sort(test, result, buckets)
    verdict = _verdict(buckets["failed"], buckets["warned"], buckets["odd"])
    if verdict:
        action = _GPU_ACTION.replace("INDEX", str(index))
        return Result(verdict.status, f"{run}: {verdict.message}", action)
    if not buckets["passed"]:
        return Result(SKIP, f"{run}: every test skipped: {'; '.join(buckets['skipped'])}")
    skipped = f"; skipped: {'; '.join(buckets['skipped'])}" if buckets["skipped"] else ""
    return Result(PASS, f"{run}: {', '.join(buckets['passed'])} passed{skipped}")


def _health_action(detail: str) -> str:
    text = detail.lower()
    if "not found" in text or "no such file" in text:
        return "install DCGM (role dcgm: datacenter-gpu-manager), or set dcgm_installed: false"
    if "watches not enabled" in text:
        return (
            "enable the health watches (`dcgmi health -s a`; they are lost when nv-hostengine "
            "restarts, so let the dcgm role or a unit set them)"
        )
    if "connect" in text or "host engine" in text:
        return "start the host engine: `systemctl enable --now nvidia-dcgm`, then check its log"
    return "run `dcgmi health -c` on the node to see the error"


def _incident(incident: dict[str, Any]) -> str:
    where = " ".join(part for part in (incident["entity"], incident["system"]) if part)
    text = f"{where} {incident['health']}"
    return f"{text}: {incident['message']}" if incident["message"] else text


@check("dcgm_health", "node", "dcgm", section="dcgm_health")
def dcgm_health(node: NodeView) -> Result:
    """DCGM's health watches report Healthy (where DCGM is installed)."""
    section = node.facts["dcgm_health"]
    if not section.get("expected"):
        return Result(SKIP, "DCGM not expected on this host (dcgm_installed: false)")
    health = section.get("health")
    if health is None:
        why = (section.get("unavailable") or {}).get("health") or {}
        detail = why.get("detail") or "no answer"
        if why.get("kind") == "absent":
            return Result(SKIP, f"not evaluated: the evidence holds no DCGM health ({detail})")
        return Result(FAIL, f"could not read DCGM health: {detail}", _health_action(detail))
    incidents = [_incident(i) for i in health["incidents"]]
    listed = f": {'; '.join(incidents)[:600]}" if incidents else ""
    overall = health["overall"]
    if overall == "Healthy":
        return Result(PASS, "DCGM overall health Healthy")
    if overall == "Warning":
        return Result(WARN, f"DCGM overall health Warning{listed}", "watch the named subsystem")
    return Result(
        FAIL,
        f"DCGM overall health {overall}{listed}",
        "drain the node and act on the named subsystem (reset or RMA the GPU it names)",
    )
