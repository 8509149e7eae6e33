"""Sub-probes `kernel_log` and `fabric_manager`: the NVIDIA events of the node's logs.

Only the window the checks judge is read (`xid_window_h` hours, 0 = since boot, never before
the current boot: a reboot is the remedy most XIDs ask for, and NVML's counters keep the
hardware's history), and only events are kept, never raw logs. Sources, in order:
`journalctl -k` (has the whole boot even when the ring buffer wrapped), `dmesg
--time-format=iso`, plain `dmesg` (times from /proc/uptime) and /dev/kmsg read without
blocking. Each command runs with a timeout; each failed source is noted in the section, and
the probe records an error only when none could be read.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import Any

from gpuhealth.parsers import ParseError
from gpuhealth.parsers import kernel_log as parser
from gpuhealth.probe import command, system

DEFAULT_WINDOW_H = 24
DEFAULT_TIMEOUT_S = 15.0
FABRIC_MANAGER_LOG = "/var/log/fabricmanager.log"
_MAX_LOG_BYTES = 32 * 1024 * 1024  # the tail of a fabric manager log that is read
_MAX_KMSG_S = 5.0  # /dev/kmsg never blocks, but bound the loop anyway


class _Window:
    """The time span to read: [since, now], on the wall clock and on the boot clock."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        expect = cfg.get("expect") or {}
        window = expect.get("xid_window_h")
        self.hours = DEFAULT_WINDOW_H if window is None else window
        self.now = time.time()
        text = system.read_text(cfg["root"], "/proc/uptime") or ""
        try:
            self.uptime: float | None = float(text.split()[0])
        except (IndexError, ValueError):
            self.uptime = None
        self.boot = None if self.uptime is None else self.now - self.uptime
        since = self.now - self.hours * 3600 if self.hours else None
        if self.boot is not None:
            since = self.boot if since is None else max(since, self.boot)
        self.since = since

    def place(self, event: dict[str, Any]) -> dict[str, Any]:
        """Give an event from the boot clock its wall-clock time."""
        if event["time"] is None and event["uptime_s"] is not None and self.boot is not None:
            return {**event, "time": parser.stamp(self.boot + event["uptime_s"])}
        return event

    def holds(self, event: dict[str, Any]) -> bool:
        if event["time"] is not None:
            return self.since is None or parser.epoch(event["time"]) >= self.since
        if event["uptime_s"] is not None and self.hours and self.uptime is not None:
            return event["uptime_s"] >= self.uptime - self.hours * 3600
        return True

    def section(self) -> dict[str, Any]:
        return {
            "window_h": self.hours,
            "since": None if self.since is None else parser.stamp(self.since),
            "until": parser.stamp(self.now),
            "until_uptime_s": self.uptime,
            "anchored_at": "collection",
        }


def _run(argv: list[str], timeout_s: float) -> command.CommandResult:
    """A command that ran and exited 0, else ValueError with a one-line reason."""
    result = command.run(argv, timeout_s)
    if result.error:
        raise ValueError(result.error)
    if result.rc != 0:
        detail = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[0]
        raise ValueError(f"exit {result.rc}: {detail}")
    return result


def _journal(window: _Window, timeout_s: float) -> str:
    argv = ["journalctl", "-k", "-b", "-o", "short-iso", "--no-pager"]
    if window.since is not None:
        argv += ["--since", f"@{int(window.since)}"]
    result = _run(argv, timeout_s)
    # journalctl exits 0 when it can show nothing useful: say why instead of "no XIDs".
    if "No journal files were found" in result.stderr:
        raise ValueError("no journal files (journald keeps no log here)")
    if "not seeing messages from other users and the system" in result.stderr:
        raise ValueError("not permitted to read the system journal")
    return result.stdout


def _dmesg_iso(window: _Window, timeout_s: float) -> str:
    return _run(["dmesg", "--time-format=iso"], timeout_s).stdout


def _dmesg(window: _Window, timeout_s: float) -> str:
    return _run(["dmesg"], timeout_s).stdout


def _kmsg(root: str) -> Callable[[_Window, float], str]:
    def read(window: _Window, timeout_s: float) -> str:
        path = os.path.join(root, "dev/kmsg")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise ValueError(exc.strerror) from None
        chunks: list[bytes] = []
        deadline = time.monotonic() + min(timeout_s, _MAX_KMSG_S)
        try:
            while time.monotonic() < deadline:
                try:
                    chunk = os.read(fd, 8192)  # one record per read on the real device
                except BlockingIOError:
                    break  # no more records
                except OSError as exc:
                    if exc.errno == errno.EPIPE:  # records overwritten while reading: go on
                        continue
                    raise ValueError(exc.strerror) from None
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks).decode(errors="replace")

    return read


def collect(cfg: dict[str, Any], errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The `kernel_log` section: NVIDIA events of the kernel log within the window."""
    window = _Window(cfg)
    timeout_s = float(cfg.get("kernel_log_timeout_s", DEFAULT_TIMEOUT_S))
    sources = (
        (parser.JOURNAL_ISO, _journal),
        (parser.DMESG_ISO, _dmesg_iso),
        (parser.DMESG, _dmesg),
        (parser.KMSG, _kmsg(cfg["root"])),
    )
    notes: list[str] = []
    for name, read in sources:
        try:
            parsed = parser.parse(read(window, timeout_s), now=window.now)
        except (ValueError, ParseError) as exc:
            notes.append(f"{name}: {exc}")
            continue
        events = [window.place(e) for e in parsed["events"]]
        return {
            "source": name,
            **window.section(),
            "notes": notes,
            **parser.summarise([e for e in events if window.holds(e)]),
            "unavailable": {},
        }
    detail = "; ".join(notes)
    errors.append({"probe": "kernel_log", "error": f"no kernel log could be read: {detail}"})
    why = {"kind": "error", "detail": detail}
    return {
        "source": None,
        **window.section(),
        "notes": notes,
        "counts": None,
        "events": None,
        "dropped": 0,
        "unavailable": {"counts": why, "events": why},
    }


def _tail(path: str) -> str:
    with open(path, "rb") as log:
        size = log.seek(0, os.SEEK_END)
        log.seek(max(size - _MAX_LOG_BYTES, 0))
        data = log.read()
    if size > _MAX_LOG_BYTES:
        data = data.partition(b"\n")[2]  # drop the partial first line
    return data.decode(errors="replace")


def _local_to_utc(event: dict[str, Any]) -> dict[str, Any]:
    """Fabric manager logs local time without a zone; the node's zone is the probe's."""
    local = time.mktime(time.strptime(event["time"][:19], "%Y-%m-%dT%H:%M:%S"))
    return {**event, "time": parser.stamp(local)}


def collect_fabric_manager(cfg: dict[str, Any], errors: list[dict[str, Any]]) -> dict[str, Any]:
    """The `fabric_manager` section: ERROR/FATAL entries of nvidia-fabricmanager's log."""
    window = _Window(cfg)
    log = cfg.get("fabric_manager_log", FABRIC_MANAGER_LOG)
    path = os.path.join(cfg["root"], log.lstrip("/"))
    section: dict[str, Any] = {"log": log, "present": os.path.exists(path), **window.section()}
    if not section["present"]:
        return {**section, "counts": [], "events": [], "dropped": 0, "unavailable": {}}
    try:
        parsed = parser.parse_fabric_manager(_tail(path))
    except (OSError, ParseError) as exc:
        detail = f"{log}: {getattr(exc, 'strerror', None) or exc}"
        errors.append({"probe": "fabric_manager", "error": detail})
        why = {"kind": "error", "detail": detail}
        return {
            **section,
            "counts": None,
            "events": None,
            "dropped": 0,
            "unavailable": {"counts": why, "events": why},
        }
    events = [_local_to_utc(e) for e in parsed["events"]]
    return {
        **section,
        **parser.summarise([e for e in events if window.holds(e)]),
        "unavailable": {},
    }
