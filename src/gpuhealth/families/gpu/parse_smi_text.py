"""`nvidia-smi -q` (plain text) -> facts fragment.

Saved evidence is often the text output rather than XML (support bundles, GPUd test data),
so triage reads it too. The layout is "Key : Value" lines nested by indentation under
"GPU 00000000:19:00.0" headers. Lines are split at the first " : " (values contain colons),
and a line indented deeper than its predecessor is its child, which also absorbs output whose
columns are misaligned. Output cut off before all attached GPUs is reported, not rejected.

Stdlib only: shipped to GPU nodes inside the probe.
"""

import re
from typing import Any, Dict, List, Optional, Tuple, Union

from gpuhealth.facts import mark_unavailable
from gpuhealth.families.gpu import parse_fabric
from gpuhealth.families.gpu.parse_smi import (
    MAX_ATTACHED,
    PROBE_TEXT,
    RawGpu,
    Section,
    Unavailable,
    add_leaf,
    assemble,
    convert,
    norm,
    pick,
    to_pci_bus_id,
)
from gpuhealth.families.gpu.schema import GPU_KEYS, new_driver, new_gpu
from gpuhealth.parsing import ParseError

# "Key : Value": the key ends at the first whitespace before a colon. Found with a pattern of
# fixed length: `\S.*?\s+:` backtracks quadratically over a long run of spaces.
_BEFORE_COLON = re.compile(r"\s:")
# nvidia-smi nests at most 5 levels (GPU > ECC Errors > Volatile > SRAM ...): far deeper is
# not its output, and the tree walks must not recurse without bound.
_MAX_DEPTH = 32
_MAX_LABEL = 200  # nvidia-smi's longest labels are under 50 characters
_GPU_HEADER = re.compile(
    r"^GPU\s+(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$"
)
_BANNER = re.compile(r"^=+\s*NVSMI LOG\s*=+$")
# Terminal colour and cursor codes (CSI sequences) a paste from a terminal can carry.
_ESCAPE = re.compile(r"\x1b\[[0-9;?]{0,32}[ -/]{0,4}[@-~]")

# Canonical field -> label paths below "GPU ..." (compared normalised), first present wins.
_FIELDS: Dict[str, Tuple[str, ...]] = {
    "name": ("Product Name",),
    "uuid": ("GPU UUID",),
    "serial": ("Serial Number",),
    "pci_bus_id": ("PCI/Bus Id",),
    "pci_device_id": ("PCI/Device Id",),
    "architecture": ("Product Architecture",),
    "vbios_version": ("VBIOS Version",),
    "persistence_mode": ("Persistence Mode",),
    "memory_total": ("FB Memory Usage/Total",),
    "memory_used": ("FB Memory Usage/Used",),
    "temperature": ("Temperature/GPU Current Temp",),
    "tlimit_margin": ("Temperature/GPU T.Limit Temp",),
    "shutdown_abs": ("Temperature/GPU Shutdown Temp",),
    "slowdown_abs": ("Temperature/GPU Slowdown Temp",),
    "max_operating_abs": ("Temperature/GPU Max Operating Temp",),
    "shutdown_offset": ("Temperature/GPU Shutdown T.Limit Temp",),
    "slowdown_offset": ("Temperature/GPU Slowdown T.Limit Temp",),
    "max_operating_offset": ("Temperature/GPU Max Operating T.Limit Temp",),
    "ecc_mode": ("ECC Mode/Current",),
    "power_draw": ("GPU Power Readings/Power Draw", "Power Readings/Power Draw"),
    "power_draw_average": (
        "GPU Power Readings/Average Power Draw",
        "Power Readings/Average Power Draw",
    ),
    "power_draw_instant": (
        "GPU Power Readings/Instantaneous Power Draw",
        "GPU Power Readings/Instant Power Draw",
        "Power Readings/Instantaneous Power Draw",
    ),
    "power_limit": (
        "GPU Power Readings/Current Power Limit",
        "Power Readings/Current Power Limit",
        "Power Readings/Enforced Power Limit",
        "Power Readings/Power Limit",
    ),
    "performance_state": ("Performance State",),
    "utilization_gpu": ("Utilization/Gpu",),
    "pcie_gen_current": ("PCI/GPU Link Info/PCIe Generation/Current",),
    "pcie_gen_max": ("PCI/GPU Link Info/PCIe Generation/Max",),
    "pcie_width_current": ("PCI/GPU Link Info/Link Width/Current",),
    "pcie_width_max": ("PCI/GPU Link Info/Link Width/Max",),
    "replay_count": ("PCI/Replays Since Reset",),
    "recovery_action": ("GPU Recovery Action",),
}
_NORM_FIELDS = {
    name: tuple("/".join(norm(p) for p in path.split("/")) for path in paths)
    for name, paths in _FIELDS.items()
}


class _Node:
    """One line of the output and the lines indented below it."""

    def __init__(self, key: str, value: Optional[str], line: int, indent: int) -> None:
        self.key = key
        self.value = value
        self.line = line
        self.indent = indent
        self.children: List[_Node] = []

    def child(self, *labels: str) -> "Optional[_Node]":
        wanted = {norm(label) for label in labels}
        return next((c for c in self.children if norm(c.key) in wanted), None)


def _key_value(content: str) -> Tuple[str, Optional[str]]:
    """("Key", "Value") of a "Key : Value" line ("" when nothing follows the colon), or
    (the line, None) when it is a section title."""
    found = _BEFORE_COLON.search(content)
    if found is None:
        return content, None
    rest = content[found.end() :]
    if rest and not rest[0].isspace():  # "Key :value" is not nvidia-smi's layout
        return content, None
    return content[: found.start()].rstrip(), rest.strip()


def _tree(text: str) -> Tuple[_Node, Optional[int]]:
    """Indentation tree of the output, and the number of the first line that is neither
    blank, the banner, nor part of the structure (for the "not nvidia-smi" error)."""
    root = _Node("", None, 0, -1)
    stack = [root]
    first_line: Optional[int] = None
    for number, line in enumerate(text.splitlines(), start=1):
        line = _ESCAPE.sub("", line).expandtabs(4).rstrip()
        content = line.strip()
        if not content or _BANNER.match(content):
            continue
        if first_line is None:
            first_line = number
        indent = len(line) - len(line.lstrip(" "))
        key, value = _key_value(content)
        if len(key) > _MAX_LABEL:  # every path below it would repeat it (quadratic)
            raise ParseError(
                f"line {number}: a label of {len(key)} characters, which nvidia-smi -q never prints"
            )
        node = _Node(key, value, number, indent)
        while stack[-1].indent >= indent:
            stack.pop()
        if len(stack) > _MAX_DEPTH:
            raise ParseError(
                f"line {number}: nested more than {_MAX_DEPTH} levels deep, which nvidia-smi -q "
                "output never is"
            )
        stack[-1].children.append(node)
        stack.append(node)
    return root, first_line


def _leaves(node: _Node, prefix: str = "", out: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """{"volatile/sram correctable": value} below node (labels as printed, "/"-joined)."""
    out = {} if out is None else out
    for child in node.children:
        path = f"{prefix}{child.key}"
        if child.value is not None:
            add_leaf(out, path, child.value)
        _leaves(child, f"{path}/", out)
    return out


def _section(gpu: _Node, *labels: str) -> Optional[Section]:
    node = gpu.child(*labels)
    if node is None:
        return None
    if not node.children:
        return node.value or ""
    return _leaves(node)


def _descendants(node: _Node) -> List[Tuple[str, str]]:
    out = []
    for child in node.children:
        if child.value is not None:
            out.append((child.key, child.value))
        out.extend(_descendants(child))
    return out


def _clock_reasons(gpu: _Node) -> Optional[Union[List[Tuple[str, str]], str]]:
    node = gpu.child("Clocks Event Reasons", "Clocks Throttle Reasons")
    if node is None:
        return None
    if not node.children:
        return node.value or ""
    return _descendants(node)


def _processes(gpu: _Node) -> Optional[Union[List[Dict[str, str]], str]]:
    node = gpu.child("Processes")
    if node is None:
        return None
    if not node.children:
        return node.value or ""
    procs = []
    for child in node.children:
        if norm(child.key) != "processid":
            continue  # "GPU instance ID" / "Compute instance ID" belong to MIG
        proc = {"pid": child.value or ""}
        for label, key in (("Type", "type"), ("Name", "name"), ("Used GPU Memory", "used_memory")):
            sub = child.child(label)
            if sub is not None and sub.value is not None:
                proc[key] = sub.value
        procs.append(proc)
    return procs


def _raw_gpu(gpu: _Node, bus_id: str) -> RawGpu:
    leaves = {
        "/".join(norm(p) for p in path.split("/")): value for path, value in _leaves(gpu).items()
    }
    fields = pick(leaves, _NORM_FIELDS)
    fields.setdefault("pci_bus_id", bus_id)
    ecc, retired, remapped = (
        _section(gpu, "ECC Errors"),
        _section(gpu, "Retired Pages"),
        _section(gpu, "Remapped Rows"),
    )
    return RawGpu(fields, ecc, retired, remapped, _clock_reasons(gpu), _processes(gpu))


def _one_gpu(gpu: _Node) -> None:
    """A GPU section prints each of its parts once: a second one means the section swallowed
    the next GPU's, whose header line was lost (its faults would be read as this GPU's)."""
    seen: Dict[str, int] = {}
    for child in gpu.children:
        key = norm(child.key)
        if key in seen:
            raise ParseError(
                f"line {child.line}: a second {child.key[:60]!r} in the GPU section of line "
                f"{gpu.line} (first at line {seen[key]}): a 'GPU <bus id>' line lost?"
            )
        seen[key] = child.line


def parse(text: str) -> Dict[str, Any]:
    """Facts fragment (driver, gpu_count, gpus, errors) from `nvidia-smi -q` text.

    Raises ParseError, naming the line, when the text is not nvidia-smi -q output at all.
    A document with fewer GPU sections than "Attached GPUs" is returned with an `errors`
    entry, and what its last GPU section lacks is kind `error`, not `absent`.
    """
    if not text.strip():
        raise ParseError("line 1: empty input, expected nvidia-smi -q output")
    root, first_line = _tree(text)
    header = {norm(n.key): n for n in root.children if n.value is not None}
    blocks = []
    for child in root.children:
        match = _GPU_HEADER.match(child.key) if child.value is None else None
        if match:
            for field in child.children:  # "Product Name : X" holds nothing; a damaged
                if field.value is not None and field.children:  # indent hides the rest in it
                    raise ParseError(
                        f"line {field.line}: {field.key[:60]!r} has a value and holds an "
                        "indented block, which a GPU section's fields never do (garbled?)"
                    )
            _one_gpu(child)
            blocks.append((child, match.group("bus")))
        elif child.child("Product Name", "GPU UUID", "PCI"):  # a GPU section, header lost
            raise ParseError(
                f"line {child.line}: {child.key[:60]!r} holds an indented block but is not a "
                "'GPU <bus id>' header (garbled?)"
            )
    if "driverversion" not in header and not blocks:
        lines = text.splitlines()
        number = first_line or 1
        shown = lines[number - 1].strip()[:60] if number <= len(lines) else ""
        raise ParseError(
            f"line {number}: {shown!r} is not nvidia-smi -q output "
            "(no 'Driver Version' line and no 'GPU <bus id>' section)"
        )

    def top(label: str) -> Optional[str]:
        node = header.get(norm(label))
        return None if node is None else node.value

    raws = [_raw_gpu(node, bus_id) for node, bus_id in blocks]
    versions = (top("Driver Version"), top("CUDA Version"), top("Attached GPUs"))
    missing = Unavailable("absent", "not in nvidia-smi -q output")
    doc = assemble(PROBE_TEXT, raws, versions, missing)
    fabrics = [_section(node, "Fabric") for node, _ in blocks]
    parse_fabric.attach(doc["gpus"], fabrics, doc["gpu_count"], missing)
    return doc


# What a pasted `nvidia-smi -q | grep -A8 Fabric` leaves out: everything but the fabric, and
# the last lines of a block that -A8 cut off.
_FRAGMENT_MISSING = ("absent", "not in the pasted Fabric lines of nvidia-smi -q")


def _fabric_blocks(node: _Node, found: List[Tuple[_Node, Optional[str]]], bus: List[str]) -> None:
    """The `Fabric` blocks below node in document order, each with the bus id of a "GPU ..."
    header the paste kept between it and the block before (`bus` carries it along)."""
    for child in node.children:
        header = _GPU_HEADER.match(child.key) if child.value is None else None
        if header:
            bus[:] = [header.group("bus")]
        if norm(child.key) == "fabric" and child.value is None and child.child("State"):
            found.append((child, bus.pop() if bus else None))
        else:
            _fabric_blocks(child, found, bus)


# `grep -A<N> Fabric` prints each line naming Fabric and N lines after it; people paste -A8 to
# -A12 (Blackwell's block with its health is 12 lines long). Further from a Fabric line than this
# is no grep output.
GREP_AFTER_MAX = 16


def _outside_grep_windows(text: str) -> None:
    """Refuse text that `grep -A<N> Fabric` cannot have printed: a whole `nvidia-smi -q` cut
    at its top would otherwise be read for its fabric alone, every other fault it shows
    dropped (a false PASS)."""
    since: Optional[int] = None  # lines since the last one naming Fabric
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if "Fabric" in line:
            since = 0
        elif stripped == "--":
            since = None  # grep's group separator: the next line must name Fabric
        elif since is None and ("nvidia-smi" in line or stripped.startswith(("$", "#"))):
            continue  # the pasted command line (a prompt), before its output
        elif stripped and (since is None or since >= GREP_AFTER_MAX):
            raise ParseError(
                f"line {number}: {stripped[:60]!r} is more than {GREP_AFTER_MAX} lines from "
                "any Fabric line: not `grep -A8 Fabric` output (a whole nvidia-smi -q cut at "
                "its top? paste it whole)"
            )
        elif since is not None:
            since += 1


def parse_fabric_fragment(text: str) -> Dict[str, Any]:
    """Facts (driver, gpu_count, gpus, errors) from the `Fabric` blocks of `nvidia-smi -q`
    pasted on their own (`nvidia-smi -q | grep -A8 Fabric`): one GPU per block, in order.

    grep separates its groups with "--" and also matches "GPU Fabric GUID" lines, whose
    context is no Fabric block: both are passed over. What the lines do not show is kind
    `absent`. Raises ParseError when the text holds no Fabric block at all.
    """
    if not text.strip():
        raise ParseError("line 1: empty input, expected the Fabric blocks of nvidia-smi -q")
    _outside_grep_windows(text)
    kept = "\n".join("" if line.strip() == "--" else line for line in text.splitlines())
    root, _ = _tree(kept)
    found: List[Tuple[_Node, Optional[str]]] = []
    _fabric_blocks(root, found, [])
    if not found:
        raise ParseError(
            "no 'Fabric' block with a 'State : ...' line: not the Fabric lines of nvidia-smi -q"
        )
    if len(found) > MAX_ATTACHED:
        raise ParseError(f"{len(found)} Fabric blocks: more GPUs than a node holds")
    gpus = []
    for index, (block, bus) in enumerate(found):
        gpu = new_gpu(index)
        bus_id, _ = convert(bus or "", to_pci_bus_id)
        gpu["pci_bus_id"] = bus_id
        for key in GPU_KEYS[1:]:
            if key != "fabric" and gpu[key] is None:
                mark_unavailable(gpu, key, *_FRAGMENT_MISSING)
        fabric, why = parse_fabric.from_printed(_leaves(block), _FRAGMENT_MISSING)
        if why is not None:
            mark_unavailable(gpu, "fabric", why[0], why[1])
        else:
            gpu["fabric"] = fabric
        gpus.append(gpu)
    driver = new_driver(True)  # nvidia-smi answered
    for key in ("version", "cuda_driver_version", "nvml_version"):
        mark_unavailable(driver, key, *_FRAGMENT_MISSING)
    return {"driver": driver, "gpu_count": None, "gpus": gpus, "errors": []}


# The sections of a GPU in `nvidia-smi -q` that people grep out and paste on their own
# (`nvidia-smi -q | grep -A10 "Clocks Event Reasons"`), compared normalised.
FRAGMENT_TITLES = frozenset(
    norm(title)
    for title in (
        "Clocks Event Reasons",
        "Clocks Throttle Reasons",
        "Clocks",
        "Max Clocks",
        "Applications Clocks",
        "Default Applications Clocks",
        "ECC Mode",
        "ECC Errors",
        "Retired Pages",
        "Remapped Rows",
        "Temperature",
        "GPU Power Readings",
        "Power Readings",
        "FB Memory Usage",
        "Utilization",
        "PCI",
        "Processes",
    )
)
# "Performance State : P0" and the GPU's other one-line fields, pasted beside its sections.
_TOP_FIELDS = frozenset(
    path for paths in _NORM_FIELDS.values() for path in paths if "/" not in path
)
_FRAGMENT_MISSING_Q = Unavailable("absent", "not in the pasted lines of nvidia-smi -q")


def _pasted_lines(text: str) -> List[str]:
    """The text without what a paste adds around grep's output: the command line, grep's
    "--" group separators and terminal escape codes."""
    kept = []
    for line in text.splitlines():
        plain = _ESCAPE.sub("", line)
        stripped = plain.strip()
        if stripped == "--" or (stripped.startswith(("$", "#")) and "nvidia-smi" in stripped):
            kept.append("")
        else:
            kept.append(plain)
    return kept


def looks_like_fragment(text: str) -> bool:
    """Sections of one GPU of `nvidia-smi -q` pasted without the rest: the first line is a
    section title (or a "GPU <bus id>" header) with an indented "Key : Value" line below."""
    lines = [line for line in _pasted_lines(text[:65536]) if line.strip()][:2]
    if len(lines) < 2:
        return False
    title, first = lines[0].expandtabs(4), lines[1].expandtabs(4)
    if len(first) - len(first.lstrip()) <= len(title) - len(title.lstrip()):
        return False  # the line below a title is indented deeper
    if _GPU_HEADER.match(title.strip()):
        return True
    valued = _key_value(first.strip())[1] is not None
    return valued and _key_value(title.strip())[1] is None and norm(title) in FRAGMENT_TITLES


def parse_fragment(text: str) -> Dict[str, Any]:
    """Facts (driver, gpu_count, gpus, errors) from sections of `nvidia-smi -q` pasted on their
    own, as grep prints them, with or without their indentation.

    With its "GPU <bus id>" header a fragment is read as nvidia-smi -q. Without it, the GPUs are
    told apart by their sections: a section a GPU already has starts the next GPU (grep -A of
    an 8-GPU node prints 8 blocks), numbered in order, bus id unknown. What the lines do not
    show is "absent", so its checks say "not evaluated". Raises ParseError for a line that is
    no section of a GPU.
    """
    kept = "\n".join(_pasted_lines(text))
    if not kept.strip():
        raise ParseError("line 1: empty input, expected sections of nvidia-smi -q")
    root, _ = _tree(kept)
    if any(_GPU_HEADER.match(child.key) for child in root.children if child.value is None):
        return parse(kept)
    groups: List[List[_Node]] = [[]]
    for child in root.children:
        key = norm(child.key)
        if key not in (_TOP_FIELDS if child.value is not None else FRAGMENT_TITLES):
            raise ParseError(
                f"line {child.line}: {child.key[:60]!r} is not a section of a GPU in "
                "nvidia-smi -q (paste whole sections, or the whole output)"
            )
        if any(norm(other.key) == key for other in groups[-1]):
            groups.append([])  # this GPU has the section already: the next GPU's begins
        groups[-1].append(child)
    if len(groups) > MAX_ATTACHED:
        raise ParseError(f"{len(groups)} GPUs' sections: more GPUs than a node holds")
    raws, fabrics = [], []
    for group in groups:
        gpu = _Node("", None, 0, -1)
        gpu.children = group
        raw = _raw_gpu(gpu, "")
        raw.fields.pop("pci_bus_id")  # no header pasted: the bus id is unknown, not empty
        raws.append(raw)
        fabrics.append(_section(gpu, "Fabric"))
    doc = assemble(PROBE_TEXT, raws, (None, None, None), _FRAGMENT_MISSING_Q)
    parse_fabric.attach(doc["gpus"], fabrics, None, _FRAGMENT_MISSING_Q)
    for key in ("version", "cuda_driver_version"):
        doc["driver"]["unavailable"][key]["detail"] = _FRAGMENT_MISSING_Q.detail
    return doc
