"""The probe's entry point: gather everything about one node into one facts document.

Each family with a node side (`gpuhealth/families/<name>/probe.py`) fills its sections of the
document, in the order of `gpuhealth.families.NAMES` (the GPU family first: the others may use
what it found). A family that fails records its error and the next one still runs: the probe
itself never fails.

Node side: Python 3.6 and the standard library (plus nvidia-ml-py when importable).
"""

import importlib
import json
import sys
import time
from typing import Any, Dict, List, Optional

from gpuhealth.facts import PROBE_VERSION, SCHEMA_VERSION
from gpuhealth.families import NAMES
from gpuhealth.probe import node


class Context:
    """What a family's probe is given: where the node's files are, what the node is expected
    to be (the resolved profile keys), where to note failures, and the facts so far."""

    def __init__(
        self, root: str, expect: Dict[str, Any], errors: List[Dict[str, Any]], facts: Dict[str, Any]
    ) -> None:
        self.root = root
        self.expect = expect
        self.errors = errors
        self.facts = facts

    def setting(self, key: str) -> Any:
        """A profile key's value; the controller always sends every key it resolved."""
        if key not in self.expect:
            raise KeyError(f"the probe was not given the profile key {key!r}")
        return self.expect[key]

    def error(self, probe: str, error: str, call: Optional[str] = None) -> None:
        """Note a failure in the document's `errors` (cut to 500 characters)."""
        entry = {"probe": probe, "error": str(error)[:500]}
        if call:
            entry["call"] = call
        self.errors.append(entry)


def family_probe(name: str) -> Any:
    """A family's node-side module, or None when the family has none (a load test only)."""
    module = f"gpuhealth.families.{name}.probe"
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        # A family without a node side is not shipped at all (transport.node_modules).
        if getattr(exc, "name", None) in (module, "gpuhealth.families." + name):
            return None
        raise


def collect(config: Dict[str, Any]) -> Dict[str, Any]:
    """Build the facts document for the node this runs on.

    `config`: {"root": "/", "expect": {profile key: value}} as the controller resolved them.
    """
    root = str(config.get("root") or "/")
    started = time.monotonic()
    errors: List[Dict[str, Any]] = []
    doc: Dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "probe_version": PROBE_VERSION,
        "source": "none",
        "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_s": None,
        "host": node.host_info(root),
        "errors": errors,
        "pci": {"nvidia_gpus": node.nvidia_pci_gpus(root)},
    }
    ctx = Context(root, dict(config.get("expect") or {}), errors, doc)
    for name in NAMES:
        try:
            module = family_probe(name)
        except Exception as exc:  # a module that does not even import: name it, go on
            ctx.error(name, f"cannot load the probe: {type(exc).__name__}: {exc}")
            continue
        if module is None:
            continue
        try:
            doc.update(module.collect(ctx))
        except Exception as exc:  # a bug in one family must not cost the others
            ctx.error(name, f"{type(exc).__name__}: {exc}")
            for key in module.SECTIONS:
                doc[key] = None
    doc["duration_s"] = round(time.monotonic() - started, 3)
    return doc


def main(config: Dict[str, Any]) -> None:
    """Print the facts document as one JSON line."""
    sys.stdout.write(json.dumps(collect(config), sort_keys=True) + "\n")
    sys.stdout.flush()
