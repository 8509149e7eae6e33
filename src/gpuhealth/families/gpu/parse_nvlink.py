"""`nvidia-smi nvlink --status` into per-GPU NVLink link states.

`nvidia-smi -q -x` does not report NVLink, so a probe without nvidia-ml-py reads this instead.
A link that is up shows its speed ("Link 3: 25 GB/s"); a down one shows "<inactive>".
"""

import re
from typing import Any, Dict, List, Optional, Tuple

from gpuhealth.facts import mark_unavailable
from gpuhealth.families.gpu.schema import GPU_KEYS, NVLINK_ERROR_COUNTERS, new_driver, new_gpu
from gpuhealth.parsing import ParseError

_GPU = re.compile(r"^GPU (\d{1,18}): .*")
# The state is stripped after the match (a lazy `(.*?)\s*$` is quadratic in runs of spaces).
_LINK = re.compile(r"^\s+Link (\d{1,18}): (.*)$")
_SPEED = re.compile(r"^(\d{1,18}(?:\.\d{1,18})?) GB/s$")


def parse_status(text: str) -> Dict[int, List[Dict[str, Any]]]:
    """GPU index -> [{"link", "up", "speed_gbps"}]; a GPU without links maps to []."""
    result: Dict[int, List[Dict[str, Any]]] = {}
    current: Optional[List[Dict[str, Any]]] = None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        gpu = _GPU.match(line)
        if gpu:
            current = result.setdefault(int(gpu.group(1)), [])
            continue
        link = _LINK.match(line)
        if link is None or current is None:
            raise ParseError(
                f"line {number}: not nvidia-smi nvlink --status output: {line[:120]!r}"
            )
        speed = _SPEED.match(link.group(2).strip())
        current.append(
            {
                "link": int(link.group(1)),
                "up": speed is not None,
                "speed_gbps": float(speed.group(1)) if speed else None,
            }
        )
    return result


# ---------------------------------------------------------------- pasted into a ticket

# What a person pastes around the output: the command line, and an elision for lines left out.
_ELISION = re.compile(r"^(?:\[\s*(?:\.{3}|\u2026)\s*\]|\.{3,}|\u2026)$")
_ALL_INACTIVE = "unable to retrieve nvlink information as all links are inactive"
# "Link 3: Replay Errors: 0" (-e); the label is cut at the last ": " after the match.
_COUNTER_LINK = re.compile(r"^\s+Link (\d{1,18}): (\S.*)$")
_UUID = re.compile(r"^GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")
# nvidia-smi nvlink -e's labels (normalised) -> NVLINK_ERROR_COUNTERS names.
_COUNTER_LABELS = {
    "replayerrors": "replay",
    "recoveryerrors": "recovery",
    "crcfliterrors": "crc_flit",
    "crcdataerrors": "crc_data",
    "eccdataerrors": "ecc_data",
}
PASTED = "not in the pasted nvidia-smi nvlink output"
_MAX_GPUS = 256


def _norm(label: str) -> str:
    return re.sub(r"[^a-z0-9]", "", label.lower())


def _is_prompt(stripped: str) -> bool:
    """The command line a paste starts with ("$ nvidia-smi nvlink -s", "nvidia-smi nvlink -e")."""
    return stripped.startswith(("$", "#")) or stripped.startswith("nvidia-smi")


class _PastedGpu:
    """One `GPU N: ...` block of a paste: its header and the lines below it."""

    def __init__(self, index: int, header: str) -> None:
        self.index = index
        self.header = header
        self.links: Dict[int, Dict[str, Any]] = {}
        self.elided = False
        self.all_inactive = False


def _gpu_header(number: int, line: str) -> "Optional[Tuple[int, str]]":
    found = _GPU.match(line)
    if found is None:
        return None
    index = int(found.group(1))
    if index >= _MAX_GPUS:
        raise ParseError(f"line {number}: GPU {index}: more GPUs than a node holds")
    return index, line[line.index(":") + 1 :].strip()


def _status_link(number: int, line: str, gpu: _PastedGpu) -> None:
    link = _LINK.match(line)
    if link is None:
        raise ParseError(f"line {number}: not nvidia-smi nvlink --status output: {line[:120]!r}")
    state = link.group(2).strip()
    speed = _SPEED.match(state)
    if speed is None and state != "<inactive>":
        raise ParseError(
            f"line {number}: link state {state[:60]!r} is neither a speed nor <inactive>"
        )
    gpu.links[int(link.group(1))] = {
        "link": int(link.group(1)),
        "up": speed is not None,
        "speed_gbps": float(speed.group(1)) if speed else None,
    }


def _counter_link(number: int, line: str, gpu: _PastedGpu) -> None:
    found = _COUNTER_LINK.match(line)
    label, sep, value = found.group(2).rpartition(": ") if found else ("", "", "")
    if found is None or not sep:
        raise ParseError(f"line {number}: not nvidia-smi nvlink -e output: {line[:120]!r}")
    value = value.strip()
    if not re.fullmatch(r"\d{1,18}", value):
        raise ParseError(f"line {number}: {label[:60]!r} is {value[:60]!r}, not a counter value")
    entry = gpu.links.setdefault(int(found.group(1)), {"link": int(found.group(1)), "raw": {}})
    key = _norm(label)
    if key in entry["raw"]:
        raise ParseError(f"line {number}: a second {label[:60]!r} for link {found.group(1)}")
    entry["raw"][key] = (label.strip(), int(value))


def _walk(text: str) -> Tuple[List[_PastedGpu], bool, Optional[str]]:
    """The GPU blocks of a pasted `nvidia-smi nvlink -s` or `-e`, whether an elision comes
    before the first, and which of the two it is ("status", "errors"; None without links)."""
    gpus: List[_PastedGpu] = []
    seen: Dict[int, int] = {}
    elided_before = False
    mode: Optional[str] = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        stripped = line.strip()
        if not stripped or (not gpus and _is_prompt(stripped)):
            continue
        if _ELISION.match(stripped):
            if gpus:
                gpus[-1].elided = True
            else:
                elided_before = True
            continue
        header = _gpu_header(number, line)
        if header is not None:
            if header[0] in seen:
                raise ParseError(
                    f"line {number}: GPU {header[0]} again (first at line {seen[header[0]]})"
                )
            seen[header[0]] = number
            gpus.append(_PastedGpu(*header))
            continue
        if not gpus:
            raise ParseError(f"line {number}: {stripped[:60]!r} before any 'GPU N: ...' line")
        if _ALL_INACTIVE in stripped.lower() and stripped.startswith("NVML"):
            gpus[-1].all_inactive = True
            continue
        this = "errors" if _COUNTER_LINK.match(line) and line.count(": ") >= 2 else "status"
        if mode is not None and this != mode:
            raise ParseError(f"line {number}: nvlink --status and -e lines mixed in one paste")
        mode = this
        (_counter_link if this == "errors" else _status_link)(number, line, gpus[-1])
    if not gpus:
        raise ParseError("no 'GPU N: ...' line: not nvidia-smi nvlink output")
    return gpus, elided_before, mode


def _identity(gpu: Dict[str, Any], block: _PastedGpu) -> None:
    """Name and UUID from `GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)`."""
    name, uuid = block.header, ""
    cut = block.header.rfind(" (UUID: ")
    if cut >= 0 and block.header.endswith(")"):
        name, uuid = block.header[:cut].strip(), block.header[cut + 8 : -1].strip()
    for key, value, ok in (("name", name, bool(name)), ("uuid", uuid, bool(_UUID.match(uuid)))):
        if ok:
            gpu[key] = value
        else:
            shown = f" ({value[:40]!r}, redacted?)" if value else ""
            mark_unavailable(gpu, key, "absent", f"{PASTED}{shown}")


def _states(gpu: Dict[str, Any], block: _PastedGpu) -> None:
    links = [block.links[n] for n in sorted(block.links)]
    if block.all_inactive:
        mark_unavailable(
            gpu,
            "nvlink",
            "not_supported",
            "nvidia-smi: Unable to retrieve NVLink information as all links are inActive "
            "(every link down, or a board without NVLink)",
        )
    elif block.elided and all(link["up"] for link in links):
        # Links left out of the paste may be down: only a link shown down is evidence.
        mark_unavailable(gpu, "nvlink", "absent", "the paste leaves some of this GPU's links out")
    elif not links:
        mark_unavailable(gpu, "nvlink", "not_supported", "nvidia-smi nvlink lists no links")
    else:
        gpu["nvlink"] = links


def _counters(gpu: Dict[str, Any], block: _PastedGpu) -> None:
    once = "nvidia-smi nvlink -e is one reading: growth not judged"
    entries = []
    for number in sorted(block.links):
        raw = block.links[number]["raw"]
        entry: Dict[str, Any] = {"link": number, "unavailable": {}}
        named = {
            _COUNTER_LABELS[key]: value for key, value in raw.items() if key in _COUNTER_LABELS
        }
        other = ", ".join(
            f"{label}: {count}" for key, (label, count) in raw.items() if key not in _COUNTER_LABELS
        )
        for name, _, _ in NVLINK_ERROR_COUNTERS:
            if name in named:
                entry[name] = {"first": named[name][1], "second": None, "unavailable": {}}
                mark_unavailable(entry[name], "second", "absent", once)
            else:
                detail = f"{PASTED} (it printed {other})" if other else PASTED
                mark_unavailable(entry, name, "absent", detail)
        entries.append(entry)
    if block.all_inactive or not entries:
        why_not = "all links are inActive" if block.all_inactive else "no links listed"
        mark_unavailable(gpu, "nvlink_errors", "not_supported", f"nvidia-smi nvlink -e: {why_not}")
        return
    record: Dict[str, Any] = {"source": "error_counter", "window_s": None, "links": entries}
    record["unavailable"] = {}
    mark_unavailable(record, "window_s", "absent", once)
    gpu["unavailable"].pop("nvlink_errors", None)
    gpu["nvlink_errors"] = record


def looks_like_pasted(text: str) -> bool:
    """`nvidia-smi nvlink -s` or `-e`: a "GPU N: <name>" line (after a command line or an
    elision) and, right below it, a link line or NVML's "all links are inActive"."""
    lines: List[str] = []
    for line in text[:65536].splitlines():
        stripped = line.strip()
        if stripped and not _ELISION.match(stripped) and not (not lines and _is_prompt(stripped)):
            lines.append(line.rstrip())
        if len(lines) == 2:
            break
    return (
        len(lines) == 2
        and _GPU.match(lines[0]) is not None
        and (_LINK.match(lines[1]) is not None or _ALL_INACTIVE in lines[1].lower())
    )


def parse_pasted(text: str) -> Dict[str, Any]:
    """Facts (driver, gpu_count, gpus, errors) from `nvidia-smi nvlink -s` or `-e` as people
    paste it: with its command line, and with `[...]` where lines were left out.

    A GPU whose links the paste elides is "not evaluated" unless a link it shows is down; GPUs
    missing from the paste (`-i N`, an elision before them) are counted but have no record,
    so they read "not evaluated", never healthy. `-e` is one reading of the counters.
    """
    gpus_seen, elided_before, mode = _walk(text)
    records = []
    for block in sorted(gpus_seen, key=lambda b: b.index):
        gpu = new_gpu(block.index)
        _identity(gpu, block)
        (_counters if mode == "errors" else _states)(gpu, block)
        for key in GPU_KEYS[1:]:
            if gpu[key] is None and key not in gpu["unavailable"]:
                mark_unavailable(gpu, key, "absent", PASTED)
        records.append(gpu)
    indices = [gpu["index"] for gpu in records]
    errors = []
    gpu_count = None
    if elided_before or indices != list(range(len(indices))):
        gpu_count = max(indices) + 1  # the GPUs left out are unknown, not missing
        errors.append(
            {
                "probe": "nvidia-smi nvlink",
                "error": f"the paste shows GPUs {indices} only: the others are not evaluated",
            }
        )
    driver = new_driver(True)
    for key in ("version", "cuda_driver_version", "nvml_version"):
        mark_unavailable(driver, key, "absent", PASTED)
    return {"driver": driver, "gpu_count": gpu_count, "gpus": records, "errors": errors}
