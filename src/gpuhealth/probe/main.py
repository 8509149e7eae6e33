"""The probe's entry point: gather everything about one node into one facts document.

Each family with a node side (`gpuhealth/families/<name>/probe.py`) fills its sections of the
document, after the families it builds on (the `NEEDS` of its `schema.py`: the GPU family
before those that use what it found), else in the order of `gpuhealth.families.NAMES`. A
family that fails records its error and the next one still runs: the probe itself never fails.

Node side: Python 3.6 and the standard library (plus nvidia-ml-py when importable).
"""

import importlib
import json
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from gpuhealth.facts import IDLE, PROBE_VERSION, SCHEMA_VERSION
from gpuhealth.families import NAMES
from gpuhealth.probe import node, state
from gpuhealth.schema import needs_order


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
        # The family whose probe runs, and the profile keys it declares (None: no family).
        self.family = ""
        self.declared: Optional[Tuple[str, ...]] = None
        # (family, read) of every family probe's GPU_READS: what it reads of each GPU during
        # the GPU family's NVML pass, over its session (the NVLink fabric's).
        self.gpu_reads: List[Tuple[str, Any]] = []

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
        """A profile key's value. The running family reads only the keys its schema.py
        declares (PROFILE_KEYS), which the controller sends."""
        if self.declared is not None and key not in self.declared:
            raise KeyError(
                f"the {self.family} family reads the profile key {key!r} without declaring "
                "it (PROFILE_KEYS of its schema.py)"
            )
        if key not in self.expect:
            raise KeyError(f"the probe was not given the profile key {key!r}")
        return self.expect[key]

    def error(self, probe: str, error: str, call: Optional[str] = None) -> None:
        """Note a failure in the document's `errors` (cut to 500 characters)."""
        entry = {"probe": probe, "error": str(error)[:500]}
        if call:
            entry["call"] = call
        self.errors.append(entry)


def probe_order(probes: Dict[str, Any]) -> List[str]:
    """The families of `probes` (name -> probe module) in the order they run: each after the
    families it needs (those with a probe: the others write nothing on the node)."""
    needs: Dict[str, Tuple[str, ...]] = {}
    for name in probes:
        needs[name] = tuple(other for other in declaration(name).NEEDS if other in probes)
    return needs_order(needs, list(probes))


def declaration(name: str) -> Any:
    """A family's `schema.py`: its sections, what it NEEDS, the PROFILE_KEYS it reads."""
    return importlib.import_module("gpuhealth.families." + name + ".schema")


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
    probes: Dict[str, Any] = {}
    for name in NAMES:
        try:
            module = family_probe(name)
        except Exception as exc:  # a module that does not even import: name it, go on
            ctx.error(name, f"cannot load the probe: {type(exc).__name__}: {exc}")
            continue
        if module is not None:
            probes[name] = module
            ctx.gpu_reads += [(name, read) for read in getattr(module, "GPU_READS", ())]
    try:
        order = probe_order(probes)
    except Exception as exc:  # the controller's registry refuses a circle: only a bug is left
        ctx.error("probe", f"cannot order the families: {type(exc).__name__}: {exc}")
        order = list(probes)
    for name in order:
        module = probes[name]
        try:
            ctx.family, ctx.declared = name, tuple(declaration(name).PROFILE_KEYS)
            doc.update(module.collect(ctx))
        except Exception as exc:  # a bug in one family must not cost the others
            ctx.error(name, f"{type(exc).__name__}: {exc}")
            for key in module.SECTIONS:
                doc[key] = None
    ctx.family, ctx.declared = "", None
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
