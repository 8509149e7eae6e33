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

from gpuhealth.facts import IDLE, PROBE_VERSION, SCHEMA_VERSION
from gpuhealth.families import NAMES
from gpuhealth.probe import node, state


class Context:
    """What a family's probe is given: where the node's files are, what the node is expected
    to be (the resolved profile keys), where to note failures, the facts so far, when the
    probe must be done by (`deadline`, time.monotonic(); None: no deadline was given) and
    where the GPU family reads the GPUs from (`gpu_source`)."""

    def __init__(
        self,
        root: str,
        expect: Dict[str, Any],
        errors: List[Dict[str, Any]],
        facts: Dict[str, Any],
        deadline: Optional[float] = None,
        hint: Optional[Dict[str, Any]] = None,
        slurm_node: Optional[str] = None,
        gpu_source: str = "auto",
    ) -> None:
        self.root = root
        self.expect = expect
        self.errors = errors
        self.facts = facts
        self.deadline = deadline
        self._hint = hint
        self._slurm_node = slurm_node
        self.gpu_source = gpu_source

    def left_s(self) -> Optional[float]:
        """Seconds left before the probe's deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - time.monotonic()

    def node_state(self) -> str:
        """`idle` or `in-use`, decided once (after the GPU family listed the processes) and
        written to the document's `node_state` section."""
        if "node_state" not in self.facts:
            self.facts["node_state"] = state.decide(
                self.expect.get("node_state", IDLE),
                self._hint,
                self.facts.get("gpus"),
                self._slurm_node,
            )
        return str(self.facts["node_state"]["state"])

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

    `config`: {"root": "/", "expect": {profile key: value}} as the controller resolved them,
    with `deadline_s` (the probe is killed then), `node_state_hint` (what the controller learnt
    of the node state, e.g. from the kubelet) and `slurm_node` (this node's Slurm name) where
    the caller has them, and `gpu_source` ("nvidia-smi": read the GPUs from nvidia-smi even
    where NVML loads, as `gpuhealth bundle` does for its second document; default "auto").
    """
    root = str(config.get("root") or "/")
    started = time.monotonic()
    deadline_s = config.get("deadline_s")
    errors: List[Dict[str, Any]] = []
    doc: Dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "probe_version": PROBE_VERSION,
        "source": "none",
        "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_s": None,
        "host": node.host_info(root),
        "errors": errors,
        "pci": {
            "nvidia_gpus": node.nvidia_pci_gpus(root),
            "device_nodes": node.nvidia_device_nodes(root),
        },
    }
    ctx = Context(
        root,
        dict(config.get("expect") or {}),
        errors,
        doc,
        started + float(deadline_s) if deadline_s else None,
        config.get("node_state_hint"),
        config.get("slurm_node"),
        str(config.get("gpu_source") or "auto"),
    )
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
    try:
        ctx.node_state()  # every document says which state its node was judged in
    except Exception as exc:
        ctx.error("node_state", f"{type(exc).__name__}: {exc}")
        doc["node_state"] = None
    doc["duration_s"] = round(time.monotonic() - started, 3)
    return doc


def main(config: Dict[str, Any]) -> None:
    """Print the facts document as one JSON line."""
    sys.stdout.write(json.dumps(collect(config), sort_keys=True) + "\n")
    sys.stdout.flush()
