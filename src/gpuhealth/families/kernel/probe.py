"""Sub-probes `kernel_log` and `fabric_manager`: the NVIDIA events of the node's logs.

Only the window the checks judge is read (`xid_window_h` hours, 0 = since boot, never before
the current boot: a reboot is the remedy most XIDs ask for, and NVML's counters keep the
hardware's history), and only events are kept, never raw logs. Sources, in order:
`journalctl -k` (has the whole boot even when the ring buffer wrapped), `dmesg
--time-format=iso`, plain `dmesg` (times from /proc/uptime) and /dev/kmsg read without
blocking. Each command runs with a timeout; each failed source is noted in the section, and
the probe records an error only when none could be read.
"""

import errno
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from gpuhealth.facts import why
from gpuhealth.families.kernel import parse_kernel_log as parser
from gpuhealth.families.kernel import schema
from gpuhealth.parsing import ParseError
from gpuhealth.probe import command, node
from gpuhealth.schema import written

if TYPE_CHECKING:
    from gpuhealth.probe.main import Context

SECTIONS = written(schema.SECTIONS)
FABRIC_MANAGER_LOG = "/var/log/fabricmanager.log"
_MAX_LOG_BYTES = 32 * 1024 * 1024  # the tail of a fabric manager log that is read
_MAX_KMSG_S = 5.0  # /dev/kmsg never blocks, but bound the loop anyway


class _Window:
    """The time span to read: [since, now], on the wall clock and on the boot clock."""

    def __init__(self, root: str, hours: float) -> None:
        self.hours = hours
        self.now = time.time()
        text = node.read_text(root, "/proc/uptime") or ""
        try:
            self.uptime: Optional[float] = float(text.split()[0])
        except (IndexError, ValueError):
            self.uptime = None
        self.boot = None if self.uptime is None else self.now - self.uptime
        since = self.now - self.hours * 3600 if self.hours else None
        if self.boot is not None:
            since = self.boot if since is None else max(since, self.boot)
        self.since = since

    def place(self, event: Dict[str, Any]) -> Dict[str, Any]:
        """Give an event from the boot clock its wall-clock time."""
        if event["time"] is None and event["uptime_s"] is not None and self.boot is not None:
            return dict(event, time=parser.stamp(self.boot + event["uptime_s"]))
        return event

    def holds(self, event: Dict[str, Any]) -> bool:
        if event["time"] is not None:
            return self.since is None or parser.epoch(event["time"]) >= self.since
        if event["uptime_s"] is not None and self.hours and self.uptime is not None:
            return event["uptime_s"] >= self.uptime - self.hours * 3600
        return True

    def section(self) -> Dict[str, Any]:
        return {
            "window_h": self.hours,
            "since": None if self.since is None else parser.stamp(self.since),
            "until": parser.stamp(self.now),
            "until_uptime_s": self.uptime,
            "anchored_at": "collection",
        }


def _run(argv: List[str], timeout_s: float) -> command.CommandResult:
    """A command that ran and exited 0, else ValueError with a one-line reason."""
    result = command.run(argv, timeout_s)
    failure = result.failure()
    if failure:
        raise ValueError(failure)
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
        path = node.under(root, "/dev/kmsg")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            raise ValueError(exc.strerror) from None
        chunks: List[bytes] = []
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


def _kernel_log(root: str, window: _Window, timeout_s: float, ctx: Any) -> Dict[str, Any]:
    """The `kernel_log` section: NVIDIA events of the kernel log within the window."""
    sources = (
        (parser.JOURNAL_ISO, _journal),
        (parser.DMESG_ISO, _dmesg_iso),
        (parser.DMESG, _dmesg),
        (parser.KMSG, _kmsg(root)),
    )
    notes: List[str] = []
    for name, read in sources:
        try:
            parsed = parser.parse(read(window, timeout_s), now=window.now)
        except (ValueError, ParseError) as exc:
            notes.append(f"{name}: {exc}")
            continue
        events = [window.place(e) for e in parsed["events"]]
        section = dict(window.section(), source=name, notes=notes, unavailable={})
        section.update(parser.summarise([e for e in events if window.holds(e)]))
        return section
    detail = "; ".join(notes)
    ctx.error("kernel_log", f"no kernel log could be read: {detail}")
    reason = why("error", detail)
    return dict(
        window.section(),
        source=None,
        notes=notes,
        counts=None,
        events=None,
        dropped=0,
        unavailable={"counts": reason, "events": reason},
    )


def _tail(path: str) -> str:
    with open(path, "rb") as log:
        size = log.seek(0, os.SEEK_END)
        log.seek(max(size - _MAX_LOG_BYTES, 0))
        data = log.read()
    if size > _MAX_LOG_BYTES:
        data = data.partition(b"\n")[2]  # drop the partial first line
    return data.decode(errors="replace")


def _local_to_utc(event: Dict[str, Any]) -> Dict[str, Any]:
    """Fabric manager logs local time without a zone; the node's zone is the probe's."""
    local = time.mktime(time.strptime(event["time"][:19], "%Y-%m-%dT%H:%M:%S"))
    return dict(event, time=parser.stamp(local))


def _fabric_manager(root: str, window: _Window, ctx: Any) -> Dict[str, Any]:
    """The `fabric_manager` section: ERROR/FATAL entries of nvidia-fabricmanager's log."""
    path = node.under(root, FABRIC_MANAGER_LOG)
    section = dict(window.section(), log=FABRIC_MANAGER_LOG, present=os.path.exists(path))
    if not section["present"]:
        return dict(section, counts=[], events=[], dropped=0, unavailable={})
    try:
        parsed = parser.parse_fabric_manager(_tail(path))
    except (OSError, ParseError) as exc:
        detail = "{}: {}".format(FABRIC_MANAGER_LOG, getattr(exc, "strerror", None) or exc)
        ctx.error("fabric_manager", detail)
        reason = why("error", detail)
        return dict(
            section,
            counts=None,
            events=None,
            dropped=0,
            unavailable={"counts": reason, "events": reason},
        )
    events = [_local_to_utc(e) for e in parsed["events"]]
    section.update(parser.summarise([e for e in events if window.holds(e)]), unavailable={})
    return section


def collect(ctx: "Context") -> Dict[str, Any]:
    """The `kernel_log` and `fabric_manager` sections, over the profile's xid_window_h."""
    window = _Window(ctx.root, float(ctx.setting("xid_window_h")))
    timeout_s = float(ctx.setting("kernel_log_timeout_s"))
    return {
        "kernel_log": _kernel_log(ctx.root, window, timeout_s, ctx),
        "fabric_manager": _fabric_manager(ctx.root, window, ctx),
    }
