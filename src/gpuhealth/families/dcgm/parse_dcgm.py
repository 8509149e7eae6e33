"""`dcgmi diag -r N -j` and `dcgmi health -c -j` JSON as typed records.

Both DCGM layouts of the diagnostic are read into one shape:

- 2.x/3.x: `{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [{"gpu_ids": "0" | "0,1,..." | 0, "status", "info": str | [str],
  "warnings": [str | {"warning", "error_id"}]}]}]}], "version": ...}}`;
- 4.x: `{"DCGM Diagnostic": {"test_categories": [... results: [{"entity_group": "GPU",
  "entity_id": 3, "status", "info": [str], "warnings": [{"warning", "error_id", ...}]}],
  "test_summary": {"status"}]}], "runtime_error"?}, "metadata": {...}, "entity_groups": [...]}`.

Real output has junk before the `{` (a stray warning line), `null` entries in the test arrays
and upper-case statuses (`PASS`) on old builds; all are tolerated. Text that holds no JSON
object, or JSON that is not a DCGM document, is a ParseError.
"""

from typing import Any, Dict, List, Optional, Tuple

from gpuhealth.parsing import ParseError, load_json, mapping, sequence

STATUSES = ("Pass", "Fail", "Warn", "Skip", "Not Run")
_STATUS = {
    "pass": "Pass",
    "passed": "Pass",
    "fail": "Fail",
    "failed": "Fail",
    "warn": "Warn",
    "warning": "Warn",
    "skip": "Skip",
    "skipped": "Skip",
    "not run": "Not Run",
    "notrun": "Not Run",
}
DIAG_KEYS = {"DCGM Diagnostic": "4.x", "DCGM GPU Diagnostic": "3.x"}


def _document(text: str, what: str) -> Any:
    """The JSON document in `text`, skipping anything printed before its first `{` or `[`."""
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        raise ParseError(f"{what}: no JSON in the output (first line: {first[:200]!r})")
    return load_json(text, what, min(starts))


def status_name(raw: Any) -> str:
    """DCGM's status in one spelling (Pass/Fail/Warn/Skip/Not Run); unknown ones kept as is."""
    text = " ".join(str(raw or "").split())
    return _STATUS.get(text.lower(), text or "missing")


def _messages(value: Any, depth: int = 0) -> List[str]:
    """The texts of a warnings/info value: a string, an object or a list of them."""
    if depth > 8:  # DCGM nests one list; Python 3.13's JSON decoder accepts deep nesting
        raise ParseError("dcgmi diag -j: messages nested more than 8 levels deep")
    if value is None:
        return []
    if isinstance(value, (str, int, float)):
        return [str(value)] if str(value).strip() else []
    if isinstance(value, dict):
        text = value.get("warning") or value.get("message") or value.get("info") or ""
        code = value.get("error_id")
        return [f"{text} (DCGM error {code})" if code is not None and text else str(text)]
    out: List[str] = []
    for item in value:  # a list: the decoded JSON holds nothing else
        out.extend(_messages(item, depth + 1))
    return [m for m in out if m]


def _gpus(result: Dict[str, Any]) -> Tuple[List[int], Optional[str]]:
    """GPU indices a result is about, and a label for a non-GPU entity (4.x CPU, NvSwitch)."""
    group = result.get("entity_group")
    if group is not None:
        entity = result.get("entity_id")
        if str(group).upper() == "GPU" and isinstance(entity, int):
            return [entity], None
        return [], f"{group} {entity}"
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if ids is None or ids == "":
        return [], None
    if isinstance(ids, int):
        return [ids], None
    try:
        return [int(part) for part in str(ids).split(",") if part.strip()], None
    except ValueError:
        raise ParseError(f"dcgmi diag: bad gpu_ids {ids!r}") from None


def _required(node: Dict[str, Any], key: str) -> Any:
    """node[key], which must be there and not null (what it held would vanish, not pass)."""
    if node.get(key) is None:
        keys = ", ".join(sorted(map(str, node)))[:120]
        raise ParseError(f"dcgmi diag -j: an entry without {key!r} (keys: {keys})")
    return node[key]


def parse_diag(text: str) -> Dict[str, Any]:
    """Every test's results, each with its GPU indices, status, info and warnings."""
    doc = _document(text, "dcgmi diag -j")
    if not isinstance(doc, dict):
        raise ParseError("dcgmi diag -j: the output is JSON but not an object")
    key = next((k for k in DIAG_KEYS if k in doc), None)
    if key is None:
        raise ParseError(
            f"dcgmi diag -j: no 'DCGM Diagnostic' or 'DCGM GPU Diagnostic' object "
            f"(keys: {', '.join(sorted(doc))[:200]})"
        )
    body = mapping(doc[key], f"dcgmi diag -j: {key}")
    metadata = mapping(doc.get("metadata"), "dcgmi diag -j: metadata")
    tests = []
    # null entries in the arrays are real (old builds); any other non-object is not.
    for category in sequence(body.get("test_categories"), "dcgmi diag -j: test_categories"):
        if category is None:
            continue
        category = mapping(category, "dcgmi diag -j: a test category")
        # Every DCGM release lists a category's tests and a test's results: without the key
        # the failed test it held would vanish, not pass.
        for test in sequence(_required(category, "tests"), "dcgmi diag -j: tests"):
            if test is None:
                continue
            test = mapping(test, "dcgmi diag -j: a test")
            results = []
            for result in sequence(_required(test, "results"), "dcgmi diag -j: results"):
                if result is None:
                    continue
                result = mapping(result, "dcgmi diag -j: a result")
                gpus, entity = _gpus(result)
                results.append(
                    {
                        "gpus": gpus,
                        "entity": entity,
                        "status": status_name(result.get("status")),
                        "info": _messages(result.get("info")),
                        "warnings": _messages(result.get("warnings")),
                    }
                )
            summary = mapping(test.get("test_summary"), "dcgmi diag -j: test_summary").get("status")
            tests.append(
                {
                    "category": category.get("category"),
                    "name": str(test.get("name") or "unnamed test"),
                    "summary": status_name(summary) if summary is not None else None,
                    "results": results,
                }
            )
    serials = {}
    for group in sequence(doc.get("entity_groups"), "dcgmi diag -j: entity_groups"):
        if isinstance(group, dict) and str(group.get("entity_group", "")).upper() == "GPU":
            for entity in sequence(group.get("entities"), "dcgmi diag -j: entities"):
                if isinstance(entity, dict) and isinstance(entity.get("entity_id"), int):
                    serials[str(entity["entity_id"])] = entity.get("serial_num")
    runtime_error = body.get("runtime_error") or doc.get("runtime_error")
    return {
        "layout": DIAG_KEYS[key],
        "version": metadata.get("version") or body.get("version"),
        "driver_version": metadata.get("Driver Version Detected")
        or body.get("Driver Version Detected"),
        "runtime_error": str(runtime_error) if runtime_error else None,
        "tests": tests,
        "gpu_serials": serials,
    }


def _value(node: Any) -> Optional[str]:
    if isinstance(node, dict):
        value = node.get("value")
        return str(value) if value is not None else None
    return str(node) if node is not None else None


def parse_health(text: str) -> Dict[str, Any]:
    """Overall health and its incidents: entity, subsystem, health and DCGM's message.

    dcgmi prints `{"header": ["Health Monitor Report"], "body": {"Overall Health": {"value":
    "Healthy"}, "GPU": {"children": {"0": {"value": "Warning", "children": {"Errors":
    {"children": {"PCIe system": {"value": "Warning", "overflow": ["..."]}}}}}}}}}`.
    """
    what = "dcgmi health -c -j"
    doc = _document(text, what)
    body = doc.get("body") if isinstance(doc, dict) else None
    if not isinstance(body, dict) or "Overall Health" not in body:
        raise ParseError("dcgmi health -c -j: no 'body' with 'Overall Health'")
    incidents = []
    for group, tree in body.items():
        if group == "Overall Health" or not isinstance(tree, dict):
            continue
        for entity, node in mapping(tree.get("children"), f"{what}: {group}").items():
            children = mapping(mapping(node, f"{what}: {group} {entity}").get("children"), what)
            errors = mapping(mapping(children.get("Errors"), what).get("children"), what)
            for system, info in errors.items():
                overflow = info.get("overflow") if isinstance(info, dict) else None
                if not isinstance(overflow, list):
                    overflow = [overflow] if overflow else []
                incidents.append(
                    {
                        "entity": f"{group} {entity}",
                        "system": system,
                        "health": _value(info),
                        "message": " ".join(str(m) for m in overflow or []) or None,
                    }
                )
            if not errors:
                incidents.append(
                    {
                        "entity": f"{group} {entity}",
                        "system": None,
                        "health": _value(node),
                        "message": None,
                    }
                )
    return {"overall": _value(body["Overall Health"]), "incidents": incidents}
