"""Plain `nvidia-smi` (its default table) -> facts fragment.

The table is what people paste into tickets. It shows per GPU its index, name, persistence
mode, bus id, volatile uncorrected ECC count, temperature, performance state, power draw and
cap, memory used and total, utilisation, and below the GPUs the processes; everything else a
GPU record holds is "absent" (not evaluated), never healthy. A GPU the driver could not open is
printed above the table (`Unable to determine the device handle for GPU1: 0000:34:00.0:
Unknown Error`) and becomes a record whose every field is that error. `ERR!` is nvidia-smi's
mark for a value NVML failed to read. Both banner spellings are read: "Driver Version" and
"CUDA Version", and since r610 "KMD Version" and "CUDA UMD Version".

Stdlib only, like every parser (the node layer).
"""

import re
from typing import Any, Dict, List, Optional, Tuple

from gpuhealth.facts import mark_unavailable
from gpuhealth.families.gpu.parse_smi import (
    MAX_ATTACHED,
    PROBE_TEXT,
    RawGpu,
    Unavailable,
    build_driver,
    build_gpu,
    convert,
    to_count,
    to_pci_bus_id,
)
from gpuhealth.families.gpu.schema import GPU_KEYS, new_gpu
from gpuhealth.parsing import ParseError

ABSENT = Unavailable("absent", "not in nvidia-smi's table")
ERR = "ERR!"
_ERR_READ = Unavailable("error", "nvidia-smi printed ERR! (NVML could not read it)")

_BANNER = re.compile(r"^\|\s*NVIDIA-SMI (\S{1,40})\s")
# "Driver Version: 550.90.07" / "KMD Version: 610.57.04"; "CUDA Version: 12.4" / "CUDA UMD
# Version: 13.3" (a version, "N/A" or "Not Found").
_DRIVER = re.compile(r"(?:Driver|KMD) Version: (\S{1,40})")
_CUDA = re.compile(r"CUDA (?:UMD )?Version: (\S{1,40})")
_LOST_PREFIX = "Unable to determine the device handle for"
_RULE = re.compile(r"^\+[-=+]*\+$")  # "+----+----+" between GPUs, "+---+" around tables
_HEADER_RULE = re.compile(r"^\|[=|+]+\|$")  # "|=====+=====|" under the column titles
_MAX_CELLS = 8
# What a GPU's rows show: a row cut off leaves these unknown for an error, not absent.
_ROW_KEYS = (
    "persistence_mode",
    "pci_bus_id",
    "ecc",
    "temperature_c",
    "performance_state",
    "power_draw_w",
    "power_limit_w",
    "memory_used_mib",
    "memory_total_mib",
    "utilization_gpu_pct",
)


def _cells(line: str) -> List[str]:
    """The cells of a table row "| a | b | c |" (the separators split it)."""
    return [cell.strip() for cell in line.strip()[1:-1].split("|")]


class _Row:
    """One GPU's three rows of cells, as printed."""

    def __init__(self, line: int, first: List[str]) -> None:
        self.line = line
        self.rows = [first]


class _Table:
    """What the text holds: the banner, the GPU rows, the process rows, the lost GPUs."""

    def __init__(self) -> None:
        self.driver: Optional[str] = None
        self.cuda: Optional[str] = None
        self.gpus: List[_Row] = []
        self.processes: Optional[List[Tuple[int, List[str]]]] = None
        self.process_columns: List[str] = []
        self.lost: List[Tuple[Optional[int], str, str]] = []
        self.banner_line = 0
        self.closed = False  # the last GPU's closing rule was seen


def _lost(number: int, line: str, table: _Table) -> None:
    """ "...handle for GPU1: 0000:34:00.0: Unknown Error" (r550 and later name the index) or
    "...handle for GPU 0000:0B:00.0: Unknown Error"."""
    rest = line[len(_LOST_PREFIX) :].strip()
    rest = rest[3:].lstrip() if rest[:3].upper() == "GPU" else ""
    parts = rest.split(": ")
    index: Optional[int] = None
    if len(parts) > 1 and re.fullmatch(r"\d{1,3}", parts[0]):
        index = int(parts[0])
        parts = parts[1:]
    if not parts[0] or len(parts[0]) > 20:
        raise ParseError(f"line {number}: no GPU in {line[:100]!r}")
    table.lost.append((index, parts[0], line[:200]))


def _scan(text: str) -> _Table:
    table = _Table()
    state = "before"  # before the banner, "head" (column titles), "gpus", "after", "processes"
    current: Optional[_Row] = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith(_LOST_PREFIX):
            _lost(number, line, table)
            continue
        banner = _BANNER.match(line)
        if banner and state == "before":
            driver, cuda = _DRIVER.search(line), _CUDA.search(line)
            table.driver = driver.group(1) if driver else None
            table.cuda = cuda.group(1) if cuda else None
            table.banner_line, state = number, "head"
            continue
        if state == "before" or not line:
            continue
        if state == "head":
            if _HEADER_RULE.match(line):
                state = "gpus"
            elif not (line.startswith("|") or _RULE.match(line)):
                raise ParseError(f"line {number}: {line[:60]!r} inside the table's column titles")
            continue
        if state == "gpus" and (line.startswith("| Processes:") or re.fullmatch(r"\+-+\+", line)):
            state = "after"  # the next table (processes, MIG devices) begins
        if state == "gpus":
            if _RULE.match(line):
                table.closed, current = current is not None, None
                continue
            if not (line.startswith("|") and line.endswith("|")):
                state = "after"  # the table ended (the blank line or text after it)
            else:
                cells = _cells(line)
                if len(cells) > _MAX_CELLS:
                    raise ParseError(f"line {number}: {len(cells)} cells, more than a GPU row has")
                if current is None:
                    if len(table.gpus) >= MAX_ATTACHED:
                        raise ParseError(f"line {number}: more GPUs than a node holds")
                    current = _Row(number, cells)
                    table.gpus.append(current)
                    table.closed = False
                elif len(current.rows) >= 3:
                    raise ParseError(
                        f"line {number}: a fourth row for the GPU of line {current.line} "
                        "(a '+---+' line lost?)"
                    )
                else:
                    current.rows.append(cells)
                continue
        if line.startswith("| Processes:"):
            state, table.processes = "processes", []
            continue
        if state == "processes" and line.startswith("|") and not _HEADER_RULE.match(line):
            cells = _cells(line)
            if len(cells) == 1 and table.processes is not None:
                words = cells[0].split()
                if words and words[0] == "GPU":
                    table.process_columns = words
                elif words and words[0].isdigit():
                    table.processes.append((number, words))
                elif words and words[0] not in ("ID", "No"):
                    raise ParseError(f"line {number}: {cells[0][:60]!r} is not a process row")
        elif state == "processes" and _RULE.match(line) and table.processes is not None:
            state = "after"
    if state == "before" and not table.lost:
        raise ParseError("no '| NVIDIA-SMI ...' banner: not nvidia-smi's table")
    if state == "head":
        raise ParseError(f"line {table.banner_line}: the table ends in its column titles")
    return table


def _raw(row: _Row, persistence: bool) -> Tuple[int, RawGpu, List[str]]:
    """(index, raw strings, notes) of one GPU's rows; `persistence`: the first row ends in
    Persistence-M (Linux), not Windows' Driver-Model."""
    first = row.rows[0] + [""] * 3
    ident = first[0].split()
    if len(ident) < 2 or not ident[0].isdigit() or len(ident[0]) > 3:
        raise ParseError(f"line {row.line}: {first[0][:60]!r} does not start with a GPU index")
    index, mode = int(ident[0]), ident[-1]
    name = " ".join(ident[1:-1])
    fields: Dict[str, str] = {}
    notes: List[str] = []
    if persistence:
        fields["persistence_mode"] = mode
    if name and not name.endswith("...") and name != ERR:
        fields["name"] = name
    bus = first[1].split()
    if bus:
        fields["pci_bus_id"] = bus[0]
    fields["ecc_volatile_uncorrected"] = first[2]
    if len(row.rows) > 1:
        second = row.rows[1] + [""] * 3
        fan_temp = second[0].split()
        # Fan, temperature, P-state, then "<draw> / <cap>" (either may be N/A or ERR!).
        if len(fan_temp) != 6 or fan_temp[4] != "/":
            raise ParseError(
                f"line {row.line + 1}: {second[0][:60]!r} is not fan, temp, perf, power"
            )
        fields.update(temperature=fan_temp[1], performance_state=fan_temp[2])
        fields.update(power_draw=fan_temp[3], power_limit=fan_temp[5])
        if fan_temp[0] == ERR:
            notes.append("nvidia-smi printed ERR! for the fan speed")
        memory = second[1].split()
        if len(memory) != 3 or memory[1] != "/":
            raise ParseError(f"line {row.line + 1}: {second[1][:60]!r} is not memory used / total")
        fields.update(memory_used=memory[0], memory_total=memory[2])
        util = second[2].split()
        if util:
            fields["utilization_gpu"] = util[0]
    for key, value in list(fields.items()):
        if value == ERR:
            fields[key] = "[ERR!]"  # nvidia-smi's bracketed error texts read as errors
    return index, RawGpu(fields), notes


def _process_rows(table: _Table) -> Dict[int, List[Dict[str, str]]]:
    """GPU index -> its processes (pid, type, name, used memory) from the process table."""
    columns = table.process_columns
    with_mig = "GI" in columns  # "GPU GI CI PID Type Process name GPU Memory" (r450 and later)
    found: Dict[int, List[Dict[str, str]]] = {}
    for number, words in table.processes or []:
        skip = 3 if with_mig else 1
        if len(words) < skip + 4:
            raise ParseError(f"line {number}: a process row with {len(words)} columns")
        pid, ptype, memory = words[skip], words[skip + 1], words[-1]
        name = " ".join(words[skip + 2 : -1])
        found.setdefault(int(words[0]), []).append(
            {"pid": pid, "type": ptype, "name": name or "N/A", "used_memory": memory}
        )
    return found


def _ecc(gpu: Dict[str, Any], raw: str) -> None:
    """The volatile uncorrected count ("0", "N/A" or "Off" when ECC is disabled); the table
    has no other ECC counter."""
    if raw.lower() == "off":
        gpu["ecc_mode"] = "disabled"
        gpu["unavailable"].pop("ecc_mode", None)
        mark_unavailable(gpu, "ecc", "not_supported", "ECC mode is disabled (nvidia-smi: Off)")
        return
    value, why = convert("[ERR!]" if raw == ERR else raw, to_count)
    if why is not None:
        mark_unavailable(gpu, "ecc", why.kind, f"volatile uncorrected ECC: {why.detail}")
        if why.kind == "not_supported":  # "N/A": a board without ECC
            mark_unavailable(gpu, "ecc_mode", why.kind, f"ECC: {why.detail}")
        return
    gpu["ecc_mode"] = "enabled"  # a count is printed only with ECC on
    gpu["unavailable"].pop("ecc_mode", None)
    absent = {"kind": ABSENT.kind, "detail": ABSENT.detail}
    volatile: Dict[str, Any] = dict.fromkeys(
        ("corrected", "sram_corrected", "sram_uncorrected", "dram_corrected", "dram_uncorrected")
    )
    volatile.update(uncorrected=value, unavailable={k: dict(absent) for k in volatile})
    gpu["ecc"] = {"volatile": volatile, "aggregate": None, "unavailable": {"aggregate": absent}}
    gpu["unavailable"].pop("ecc", None)


def _lost_gpu(index: int, bus: str, printed: str) -> Dict[str, Any]:
    """A GPU the driver could not open: every field is that error (the checks fail it)."""
    gpu = new_gpu(index)
    detail = f"nvidia-smi: {printed}"
    for key in GPU_KEYS[1:]:
        mark_unavailable(gpu, key, "error", detail)
    bus_id, _ = convert(bus, to_pci_bus_id)
    if bus_id is not None:
        gpu["pci_bus_id"] = bus_id
        gpu["unavailable"].pop("pci_bus_id")
    return gpu


def parse(text: str) -> Dict[str, Any]:
    """Facts fragment (driver, gpu_count, gpus, errors) from nvidia-smi's default table.

    Raises ParseError, naming the line, for text that is not the table or is garbled where it
    matters (a row of the wrong shape, a GPU index twice).
    """
    table = _scan(text)
    persistence = "Persistence-M" in text
    gpus: Dict[int, Dict[str, Any]] = {}
    errors: List[Dict[str, str]] = []
    processes = _process_rows(table) if table.processes is not None else None
    for row in table.gpus:
        index, raw, notes = _raw(row, persistence)
        if index in gpus:
            raise ParseError(f"line {row.line}: GPU {index} twice in the table")
        if processes is not None:
            raw.processes = processes.get(index, [])
        gpu, more = build_gpu(index, raw, driver_version=table.driver, missing=ABSENT)
        _ecc(gpu, raw.fields["ecc_volatile_uncorrected"])
        for key in ("fabric", "nvlink"):
            mark_unavailable(gpu, key, *ABSENT)
        if raw.fields.get("name") is None and row.rows[0][0].split()[1:-1]:
            shown = " ".join(row.rows[0][0].split()[1:-1])
            mark_unavailable(gpu, "name", *_name_reason(shown))
        gpus[index] = gpu
        errors.extend({"probe": PROBE_TEXT, "error": f"GPU {index}: {n}"} for n in notes + more)
    if table.gpus and not table.closed:
        errors.append({"probe": PROBE_TEXT, "error": "the table is cut off in its last GPU's rows"})
        last = gpus[max(gpus)]
        for key in _ROW_KEYS:
            if last[key] is None and last["unavailable"][key]["kind"] == "absent":
                mark_unavailable(last, key, "error", "the table is cut off in this GPU's rows")
    _place_lost(table, gpus, errors)
    indices = sorted(gpus)
    gpu_count = None
    if indices and indices != list(range(len(indices))):
        gpu_count = indices[-1] + 1  # the GPUs the table leaves out are unknown, not healthy
        errors.append({"probe": PROBE_TEXT, "error": f"the table shows GPUs {indices} only"})
    return {
        "driver": build_driver(table.driver, table.cuda),
        "gpu_count": gpu_count,
        "gpus": [gpus[i] for i in indices],
        "errors": errors,
    }


def _name_reason(shown: str) -> Tuple[str, str]:
    if shown == ERR:
        return _ERR_READ.kind, f"name: {_ERR_READ.detail}"
    return "absent", f"nvidia-smi's table cuts the name short ({shown[:60]!r})"


def _place_lost(
    table: _Table, gpus: Dict[int, Dict[str, Any]], errors: List[Dict[str, str]]
) -> None:
    """Give each GPU the driver could not open its record: at the index nvidia-smi named, else
    at the first index the table skips (GPUs are numbered in bus order)."""
    for index, bus, printed in table.lost:
        if index is None:
            index = next(i for i in range(len(gpus) + 1) if i not in gpus)
            errors.append(
                {
                    "probe": PROBE_TEXT,
                    "error": f"GPU {bus} could not be opened; taken for GPU {index}",
                }
            )
        if index in gpus:
            raise ParseError(f"GPU {index} is both in the table and unable to be opened")
        gpus[index] = _lost_gpu(index, bus, printed)
