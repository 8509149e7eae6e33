"""`gpuhealth bundle`: every raw output the probe and the checks read on this node, in one
archive for a ticket; and reading one back for `gpuhealth triage BUNDLE.tar.gz`.

A verdict someone doubts needs the outputs it came from, taken at the same moment, and the
same outputs are what the project turns into test fixtures. The archive holds the tools' own
outputs (nvidia-smi in its forms, the kernel log, the fabric tools, DCGM's and GPUd's views),
the files the probe reads (at their paths, so an unpacked bundle is a `--root` tree), the facts
documents of both GPU paths (NVML, and nvidia-smi's XML with NVML left alone) and node-check's
verdict. MANIFEST.json says for each member what produced it, its exit status, how long it
took and whether it was cut.

Bounded: each tool has a deadline (`--tool-timeout`), the whole bundle one more (`--timeout`;
what is left when it passes is listed as not collected), each member is cut at
MAX_MEMBER_BYTES and the members together at MAX_BUNDLE_BYTES. Redacted: no process
environment or command line is read, and every member's text passes gpuhealth.redact before it
is written; MANIFEST counts what was masked (never the values).

Runs on the node as installed gpuhealth (like node-check); the probe itself is the shipped one.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuhealth import __version__
from gpuhealth import report as reporting
from gpuhealth.config import ConfigError, ProfileSet, resolve_limits
from gpuhealth.documents import MAX_BYTES as MAX_FACTS_BYTES
from gpuhealth.documents import FactsError, validated
from gpuhealth.evidence import EvidenceError, facts_from_files
from gpuhealth.facts import AUTO
from gpuhealth.families.fabric.probe import CLASS_DIR, find_fi_info
from gpuhealth.families.gpu.compare import compare
from gpuhealth.families.gpud.probe import base_url, fetch
from gpuhealth.integrations import nodecheck
from gpuhealth.local import DEFAULT_TIMEOUT_S as PROBE_TIMEOUT_S
from gpuhealth.local import judge_here, run_local_probe
from gpuhealth.redact import redact
from gpuhealth.registry import Kind
from gpuhealth.results import Action
from gpuhealth.targets import Target
from gpuhealth.transport import ProbeError

FORMAT = "gpuhealth-bundle"  # MANIFEST's `format`: what triage recognises
FORMAT_VERSION = 1
MANIFEST = "MANIFEST.json"
FACTS = "facts.json"  # the probe as node-check runs it: NVML where nvidia-ml-py loads
FACTS_SMI = "facts-nvidia-smi.json"  # the probe told to read the GPUs from nvidia-smi
VERDICT = "node-check.json"
UNAME = "commands/uname-a.txt"
DEFAULT_TIMEOUT_S = 120.0
TOOL_TIMEOUT_S = 30.0
MAX_MEMBER_BYTES = 16 * 1024 * 1024
MAX_BUNDLE_BYTES = 64 * 1024 * 1024
MIN_STEP_S = 1.0  # less time than this left: a step is not started
KILL_GRACE_S = 2.0

# The tools, in the order they run: the ones that do not need the GPU driver first (quick, and
# what tells a hung driver apart), the probe and node-check, then nvidia-smi's own outputs.
EARLY_TOOLS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (UNAME, ("uname", "-a")),
    ("commands/journalctl-k.txt", ("journalctl", "-k", "-b", "-o", "short-iso", "--no-pager")),
    ("commands/dmesg.txt", ("dmesg", "--time-format=iso")),
    ("commands/ibstat.txt", ("ibstat",)),
    ("commands/fi_info-p-efa.txt", ("fi_info", "-p", "efa")),
    ("commands/nvidia-imex-ctl-N.txt", ("nvidia-imex-ctl", "-N")),
    ("commands/dcgmi-health-c-j.json", ("dcgmi", "health", "-c", "-j")),
)
SMI_TOOLS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("commands/nvidia-smi-q-x.xml", ("nvidia-smi", "-q", "-x")),
    ("commands/nvidia-smi-q.txt", ("nvidia-smi", "-q")),
    ("commands/nvidia-smi.txt", ("nvidia-smi",)),
    ("commands/nvidia-smi-topo-m.txt", ("nvidia-smi", "topo", "-m")),
    ("commands/nvidia-smi-nvlink-s.txt", ("nvidia-smi", "nvlink", "-s")),
    ("commands/nvidia-smi-nvlink-e.txt", ("nvidia-smi", "nvlink", "-e")),
)
FILES = ("/etc/os-release", "/proc/driver/nvidia/version")
GPUD_MEMBER = "gpud/v1-states.json"
# What the fabric family reads of /sys/class/infiniband (families/fabric/sysfs.py).
IB_DEVICE_FILES = ("fw_ver", "board_id", "hca_type")
IB_PORT_FILES = ("state", "phys_state", "rate", "link_layer")
IB_PORT_FOLDERS = ("counters", "hw_counters")


class _Collector:
    """The members gathered so far, their MANIFEST entries, and the bundle's deadline."""

    def __init__(self, timeout_s: float, tool_timeout_s: float) -> None:
        self.deadline = time.monotonic() + timeout_s
        self.tool_timeout_s = tool_timeout_s
        self.members: dict[str, bytes] = {}
        self.entries: list[dict[str, Any]] = []
        self.not_collected: list[dict[str, Any]] = []
        self.redacted: Counter[str] = Counter()
        self.deadline_reached = False

    def budget(self, want_s: float) -> float | None:
        """Seconds a step may take (at most `want_s`), or None when the deadline is too near."""
        left = self.deadline - time.monotonic()
        if left < MIN_STEP_S:
            self.deadline_reached = True
            return None
        return min(want_s, left)

    def skip(self, command: str, reason: str) -> None:
        """A step that wrote nothing, and why."""
        self.not_collected.append({"command": command, "reason": reason})

    def add(self, member: str, command: str, data: bytes, **details: Any) -> None:
        """A member, cut to the size limits and redacted; its MANIFEST entry with `details`
        (exit_status, duration_s, timed_out, error, output_bytes)."""
        room = MAX_BUNDLE_BYTES - sum(len(d) for d in self.members.values())
        if room <= 0:
            self.skip(command, f"the bundle reached its size limit ({MAX_BUNDLE_BYTES} bytes)")
            return
        limit = min(MAX_MEMBER_BYTES, room)
        text, counts = redact(data[:limit].decode("utf-8", errors="replace"))
        self.members[member] = text.encode()
        self.redacted.update(counts)
        entry: dict[str, Any] = {"member": member, "command": command}
        entry.update({"exit_status": None, "duration_s": None, "timed_out": False, **details})
        entry["bytes"] = len(self.members[member])
        entry["cut"] = len(data) > limit or details.get("output_bytes", 0) > limit
        entry["redacted"] = dict(counts)
        self.entries.append(entry)

    def tool(self, member: str, argv: tuple[str, ...]) -> None:
        """Run a tool where it is installed, its stdout the member (stderr's tail in MANIFEST)."""
        command = " ".join(argv)
        binary = find_fi_info() if argv[0] == "fi_info" else shutil.which(argv[0])
        if binary is None:
            self.skip(command, f"{argv[0]} is not installed (not on PATH)")
            return
        timeout_s = self.budget(self.tool_timeout_s)
        if timeout_s is None:
            self.skip(command, "not run: the bundle's deadline had passed")
            return
        started = time.monotonic()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(
                    [binary, *argv[1:]],
                    stdout=out,
                    stderr=err,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            except OSError as exc:
                self.skip(command, f"could not run: {exc}")
                return
            rc, timed_out = _wait(proc, timeout_s)
            size = os.fstat(out.fileno()).st_size
            out.seek(0)
            data = out.read(MAX_MEMBER_BYTES + 1)
            err.seek(0)
            stderr = err.read(4096).decode("utf-8", errors="replace").strip()
        details: dict[str, Any] = {
            "exit_status": rc,
            "duration_s": round(time.monotonic() - started, 3),
            "timed_out": timed_out,
            "output_bytes": size,
        }
        if timed_out:
            details["error"] = f"killed at its deadline ({timeout_s:g} s); the output is partial"
        if stderr:
            details["stderr"] = redact(stderr[-500:])[0]
        self.add(member, command, data, **details)

    def file(self, root: str, path: str) -> None:
        """A file the probe reads, under its own path (without the leading /)."""
        started = time.monotonic()
        try:
            with open(os.path.join(root, path.lstrip("/")), "rb") as handle:
                data = handle.read(MAX_MEMBER_BYTES + 1)
        except OSError as exc:
            self.skip(f"read {path}", exc.strerror or str(exc))
            return
        duration = round(time.monotonic() - started, 3)
        self.add(path.lstrip("/"), f"read {path}", data, duration_s=duration)

    def infiniband(self, root: str) -> None:
        """What the fabric family reads of /sys/class/infiniband, as a tree of members."""
        base = os.path.join(root, CLASS_DIR.lstrip("/"))
        try:
            devices = sorted(os.listdir(base))
        except OSError as exc:
            self.skip(f"read {CLASS_DIR}", exc.strerror or str(exc))
            return
        paths = []
        for device in devices:
            paths += [f"{device}/{name}" for name in IB_DEVICE_FILES]
            ports = os.path.join(base, device, "ports")
            for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
                paths += [f"{device}/ports/{port}/{name}" for name in IB_PORT_FILES]
                for folder in IB_PORT_FOLDERS:
                    inner = os.path.join(ports, port, folder)
                    names = sorted(os.listdir(inner)) if os.path.isdir(inner) else []
                    paths += [f"{device}/ports/{port}/{folder}/{name}" for name in names]
        for path in paths:
            if self.budget(1.0) is None:
                self.skip(f"read {CLASS_DIR}/{path}", "not read: the bundle's deadline had passed")
                return
            if os.path.isfile(os.path.join(base, path)):
                self.file(root, f"{CLASS_DIR}/{path}")

    def gpud(self, address: str, timeout_s: float) -> None:
        """GPUd's /v1/states, where GPUd answers."""
        url = base_url(address) + "/v1/states"
        budget = self.budget(timeout_s)
        if budget is None:
            self.skip(f"GET {url}", "not asked: the bundle's deadline had passed")
            return
        started = time.monotonic()
        body, reason = fetch(url, budget)
        if body is None:
            detail = reason["detail"] if reason else "no answer"
            self.skip(f"GET {url}", f"GPUd not answering: {detail}")
            return
        duration = round(time.monotonic() - started, 3)
        self.add(GPUD_MEMBER, f"GET {url}", body.encode(), duration_s=duration)


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int | None, bool]:
    """(exit status, timed out): the whole process group is killed at the deadline, and a
    process stuck in the kernel after that is left behind, never waited for."""
    try:
        return proc.wait(timeout=timeout_s), False
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        return None, True


def _json(doc: Any) -> bytes:
    return json.dumps(doc, indent=1, sort_keys=True).encode()


def _probes(collector: _Collector, chosen: nodecheck.Selection, target: Target) -> str:
    """node-check (the probe's normal path) and the probe again on nvidia-smi's path; the
    verdict."""
    budget = collector.budget(PROBE_TIMEOUT_S)
    if budget is None:
        for command in ("gpuhealth node-check --json", "the probe"):
            collector.skip(command, "not run: the bundle's deadline had passed")
        return "not judged"
    result = judge_here(dataclasses.replace(chosen, timeout_s=budget), target)
    healthy = result.verdict.verdict in reporting.HEALTHY
    duration = round(result.duration_s, 3)
    if result.facts is not None:
        collector.add(FACTS, "the probe (NVML where it loads)", _json(result.facts), exit_status=0)
    else:
        error = "; ".join(o.message for o in result.outcomes if o.check == "probe")
        collector.skip("the probe (NVML where it loads)", error)
    collector.add(
        VERDICT,
        "gpuhealth node-check --json",
        _json(result.document()),
        exit_status=0 if healthy else 1,
        duration_s=duration,
    )
    budget = collector.budget(PROBE_TIMEOUT_S)
    command = "the probe with gpu_source nvidia-smi"
    if budget is None:
        collector.skip(command, "not run: the bundle's deadline had passed")
        return result.verdict.verdict
    limits = resolve_limits(target.expectations, ProfileSet(chosen.profile_dir), None)
    config = {"root": chosen.root, "expect": limits.values, "gpu_source": "nvidia-smi"}
    started = time.monotonic()
    try:
        doc = run_local_probe(config, target.python, budget)
    except (ProbeError, FactsError) as exc:
        collector.skip(command, str(exc))
    else:
        duration = round(time.monotonic() - started, 3)
        collector.add(FACTS_SMI, command, _json(doc), exit_status=0, duration_s=duration)
    return result.verdict.verdict


def collect(
    chosen: nodecheck.Selection, target: Target, timeout_s: float, tool_timeout_s: float
) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Every member of this node's bundle and its MANIFEST, within `timeout_s`."""
    started, clock = time.time(), time.monotonic()
    collector = _Collector(timeout_s, tool_timeout_s)
    for path in FILES:
        collector.file(chosen.root, path)
    for member, argv in EARLY_TOOLS:
        collector.tool(member, argv)
    collector.infiniband(chosen.root)
    limits = resolve_limits(target.expectations, ProfileSet(chosen.profile_dir), None).values
    collector.gpud(str(limits["gpud_address"]), float(limits["gpud_timeout_s"]))
    verdict = _probes(collector, chosen, target)
    for member, argv in SMI_TOOLS:
        collector.tool(member, argv)
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "gpuhealth": __version__,
        "host": target.name,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "timeout_s": timeout_s,
        "tool_timeout_s": tool_timeout_s,
        "duration_s": round(time.monotonic() - clock, 3),
        "deadline_reached": collector.deadline_reached,
        "verdict": verdict,
        "selection": {
            "profile": chosen.profile,
            "expected_gpus": chosen.expected_gpus,
            "inventory": chosen.inventory,
            "node_state": chosen.node_state,
        },
        "members": collector.entries,
        "not_collected": collector.not_collected,
        "redacted": {"total": sum(collector.redacted.values()), **collector.redacted},
    }
    return collector.members, manifest


def write(path: Path, members: dict[str, bytes], manifest: dict[str, Any]) -> None:
    """The archive, MANIFEST.json first; written beside `path` and renamed into place, so a
    failed write leaves no half archive."""
    stamp = time.time()
    fd, partial = tempfile.mkstemp(prefix=".gpuhealth-bundle-", dir=path.parent or Path("."))
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
            for name, data in [(MANIFEST, _json(manifest)), *members.items()]:
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), int(stamp), 0o644
                tar.addfile(info, io.BytesIO(data))
        os.chmod(partial, 0o600)  # a bundle can say more about a node than its users should read
        os.replace(partial, path)
    except BaseException:
        os.unlink(partial)
        raise


def default_name(host: str) -> str:
    """gpuhealth-bundle-<host>-<UTC stamp>.tar.gz"""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host) or "node"
    return f"gpuhealth-bundle-{safe}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.tar.gz"


def run(args: argparse.Namespace) -> int:
    """`gpuhealth bundle`: 0 when the archive was written, 1 when it could not be, 2 usage."""
    try:
        if not 0 < args.timeout <= 3600 or not 0 < args.tool_timeout <= 3600:
            raise ConfigError("--timeout and --tool-timeout must be between 0 and 3600 seconds")
        args.timeout, bundle_timeout = PROBE_TIMEOUT_S, args.timeout
        chosen = nodecheck.selection(args)
        target = chosen.target()
    except ConfigError as exc:
        print(f"gpuhealth bundle: {exc}", file=sys.stderr)
        return 2
    members, manifest = collect(chosen, target, bundle_timeout, args.tool_timeout)
    out = args.output or Path(default_name(target.name))
    try:
        write(out, members, manifest)
    except OSError as exc:
        print(f"gpuhealth bundle: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    cut = sum(e["cut"] for e in manifest["members"])
    print(
        f"{out}: {len(members)} members, {len(manifest['not_collected'])} not collected, "
        f"{cut} cut, {manifest['redacted']['total']} values redacted, "
        f"{manifest['duration_s']:.1f} s; node-check said {manifest['verdict']}"
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`gpuhealth bundle` and its options (node-check's, with --timeout for the whole)."""
    parser = sub.add_parser(
        "bundle",
        help="write this node's raw outputs, facts and verdict into one archive for a ticket",
        description=__doc__.splitlines()[0],
        conflict_handler="resolve",  # --timeout bounds the whole bundle here
    )
    nodecheck.add_selection(parser, AUTO)
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="the archive to write")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=f"seconds the whole bundle may take (default {DEFAULT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--tool-timeout",
        type=float,
        default=TOOL_TIMEOUT_S,
        help=f"seconds each tool may take (default {TOOL_TIMEOUT_S:g})",
    )
    parser.set_defaults(func=run)


# --------------------------------------------------------------------------- reading one back

_GZIP_MAGIC = b"\x1f\x8b"
_MAX_SCAN_BYTES = 1 << 30  # a bundle is megabytes: stop looking for members past this
_READ = (MANIFEST, FACTS, FACTS_SMI, VERDICT, UNAME)


def is_bundle(path: Path) -> bool:
    """A gzip tar whose MANIFEST.json says it is a gpuhealth bundle (a regular file: opening a
    FIFO or a device to look would block)."""
    try:
        if not path.is_file():
            return False
        with path.open("rb") as handle:
            if handle.read(2) != _GZIP_MAGIC:
                return False
        return _members(path, (MANIFEST,)).get(MANIFEST, {}).get("format") == FORMAT
    except (OSError, EvidenceError):
        return False


def _members(path: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """The JSON (or, for UNAME, text) of the named members, without unpacking anything."""
    found: dict[str, Any] = {}
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for info in tar:
                if info.offset > _MAX_SCAN_BYTES:
                    break
                if info.name not in names or not info.isfile() or info.size > MAX_FACTS_BYTES:
                    continue
                handle = tar.extractfile(info)
                text = handle.read().decode("utf-8", errors="replace") if handle else ""
                found[info.name] = text if info.name == UNAME else json.loads(text)
                if len(found) == len(names):
                    break
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise EvidenceError(f"{path}: not a readable gzip tar: {exc}") from exc
    except (ValueError, RecursionError) as exc:
        raise EvidenceError(f"{path}: a member is not usable JSON: {exc}") from exc
    return found


@dataclass
class Opened:
    """A bundle as triage judges it: the node, its NVML facts, the outcomes the bundle adds
    (the two paths compared, a probe that failed there) and header notes."""

    host: str
    facts: dict[str, Any]
    outcomes: list[reporting.Outcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _kernel(uname: str | None) -> str | None:
    """The kernel release of `uname -a` (its third word)."""
    words = (uname or "").split()
    return words[2] if len(words) > 2 else None


def paths_outcomes(
    host: str, facts: dict[str, Any], smi: dict[str, Any] | None
) -> list[reporting.Outcome]:
    """The two GPU paths compared, as outcomes: a WARN [INSPECT] per disagreement (the suspect
    is gpuhealth's probe, not the node), a PASS when they agree, a SKIP when there is nothing
    to compare."""
    check, label = "probe_paths", host
    if smi is None or facts.get("source") != "nvml" or smi.get("source") != "nvidia-smi":
        why = (
            "the bundle has no nvidia-smi-path facts"
            if smi is None
            else f"the two documents read {facts.get('source')!r} and {smi.get('source')!r}, "
            "not NVML and nvidia-smi"
        )
        return [reporting.Outcome(check, "SKIP", host, None, f"not evaluated: {why}", label)]
    result = compare(facts, smi)
    advice = (
        "a defect in gpuhealth's probe (one of its two GPU readers), unless a counter grew "
        "between the two reads: bundle again, and report it with both bundles"
    )
    found = [
        reporting.Outcome(
            check,
            "WARN",
            host,
            d.gpu,
            f"probe defect: {d.text()}",
            label if d.gpu is None else f"{host} gpu{d.gpu}",
            Action.INSPECT.value,
            advice,
        )
        for d in result.disagreements
    ]
    if not found:
        skipped = f"; not compared: {', '.join(result.not_compared)}" if result.not_compared else ""
        message = (
            f"NVML and nvidia-smi agree on {result.compared} values of {result.gpus} GPUs{skipped}"
        )
        found.append(reporting.Outcome(check, "PASS", host, None, message, label))
    return found


def opened(paths: list[Path], node: str | None) -> Opened | None:
    """The bundle among `paths` read for triage (None: none is a bundle); a bundle must come
    alone, and its NVML facts are validated as `pytest --facts` validates saved facts."""
    bundles = [p for p in paths if not p.is_dir() and is_bundle(p)]
    if not bundles:
        return None
    if len(paths) > 1:
        raise EvidenceError(
            f"{bundles[0]}: a gpuhealth bundle is judged on its own, not with other files"
        )
    path = bundles[0]
    found = _members(path, _READ)
    manifest = found[MANIFEST]
    host = node or str(manifest.get("host") or path.name)
    try:
        facts = validated(found[FACTS], f"{path}:{FACTS}") if FACTS in found else None
        smi = validated(found[FACTS_SMI], f"{path}:{FACTS_SMI}") if FACTS_SMI in found else None
    except FactsError as exc:
        raise EvidenceError(str(exc)) from exc
    verdict = found.get(VERDICT) or {}
    notes = [
        f"bundle of {manifest.get('host')} made {manifest.get('created_at')} by gpuhealth "
        f"{manifest.get('gpuhealth')}, kernel {_kernel(found.get(UNAME)) or 'unknown'}; "
        f"node-check there said {verdict.get('verdict', 'nothing')}"
    ]
    if facts is None:
        failed = [
            e for e in manifest.get("not_collected", []) if e["command"].startswith("the probe (")
        ]
        reason = failed[0]["reason"] if failed else "the bundle holds no facts document"
        _, blank = facts_from_files([], host)
        probe = reporting.Outcome(
            "probe",
            "ERROR",
            host,
            None,
            f"the probe failed on the node: {reason}",
            host,
            Action.RERUN.value,
            "read the error; bundle again, and report it if it is a gpuhealth bug",
        )
        return Opened(host, blank, [probe], notes)
    return Opened(host, facts, paths_outcomes(host, facts, smi), notes)


# Not one of the registry's kinds (those read text): triage names it in its header.
KIND = Kind("gpuhealth bundle", is_bundle, lambda path: _opened_one(path).facts)


def _opened_one(path: Path) -> Opened:
    found = opened([path], None)
    if found is None:
        raise EvidenceError(f"{path}: not a gpuhealth bundle")
    return found
