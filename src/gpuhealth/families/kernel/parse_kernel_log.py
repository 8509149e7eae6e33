"""Kernel and fabric-manager logs -> the NVIDIA events in them.

Kernel logs reach us in many shapes: the probe reads `journalctl -k -o short-iso`,
`dmesg --time-format=iso`, plain `dmesg` or /dev/kmsg, and tickets carry `dmesg -T`,
`dmesg -H`, `dmesg -t`, `dmesg --decode`, `journalctl -k` (syslog-style, `-o short-precise`,
`-o short-full`, or with its time and host cut off: `kernel: NVRM: ...`), /var/log/kern.log
or `talosctl dmesg`. Every line is recognised by its prefix; lines indented under one continue
its record (dmesg prints a multi-line message so). The message is searched for:

- XIDs: `NVRM: Xid (PCI:0000:19:00): 48, pid=..., name=..., <text>`
- NVSwitch SXIDs: `nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, <text>` (the
  `Severity ...` and `Data {...}` lines that follow an SXID repeat it and are not counted)
- nvidia-peermem errors: `nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected ...`
- GPU faults without an Xid line (parse_kernel_faults: fallen off the bus, GSP heartbeat and
  RPC timeouts, RmInitAdapter failures...), with the GPU's bus id where the report names it

Everything else in a kernel log is someone else's business and yields nothing. Times become
canonical strings (`2024-11-15T12:02:03.470068Z`, or without the `Z` when the log gives no
time zone) and/or seconds since boot (`uptime_s`), whichever the format has.

Stdlib only: shipped to the nodes with the probe.
"""

import calendar
import re
import time
from typing import Any, Dict, List, Optional, Tuple

from gpuhealth.families.kernel import parse_kernel_faults as faults
from gpuhealth.parsing import ParseError

_SKEW_S = 86400  # a node's clock may run ahead of the controller's; more is not a real time
_MAX_UPTIME_S = 10 * 365 * 86400  # no node runs ten years without a reboot
_MONTHS = {
    name: number
    for number, name in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}

# Format names, as the command that prints them (evidence kinds and the probe use them).
DMESG = "dmesg"
DMESG_T = "dmesg -T"
DMESG_ISO = "dmesg --time-format=iso"
DMESG_DECODE_ISO = "dmesg --decode --time-format=iso"
KMSG = "/dev/kmsg"
DMESG_H = "dmesg -H"
DMESG_NO_TIME = "dmesg -t"
JOURNAL = "journalctl -k"
JOURNAL_ISO = "journalctl -k -o short-iso"
JOURNAL_CUT = "journalctl -k (time cut off)"
TALOS = "talosctl dmesg"
FORMATS = (
    DMESG,
    DMESG_T,
    DMESG_ISO,
    DMESG_DECODE_ISO,
    DMESG_H,
    KMSG,
    JOURNAL,
    JOURNAL_ISO,
    JOURNAL_CUT,
    TALOS,
    DMESG_NO_TIME,
)

_KMSG_RE = re.compile(r"(\d{1,20}),(\d{1,20}),(\d{1,20}),[^;]*;(.*)")
_KMSG_DICT_RE = re.compile(r" [A-Z_]+=")  # /dev/kmsg continuation lines (SUBSYSTEM=pci ...)
_FACILITY_RE = re.compile(r"[a-z]+ *:[a-z]+ *: ?(.*)")  # dmesg --decode: "kern  :warn  : "
_UPTIME_RE = re.compile(r"\[ *(\d{1,12}\.\d{1,9})\] ?(.*)")
_CTIME_RE = re.compile(
    r"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (\w{3}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})\] ?(.*)"
)
_ISO_RE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?"
    r"(Z|[+-]\d{2}:?\d{2})? (.*)"
)
_SYSLOG_RE = re.compile(r"(\w{3}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))? (.*)")
# journalctl -o short-full: "Tue 2024-11-26 10:01:02 UTC host kernel: msg"
_FULL_RE = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})"
    r"(?:\.(\d{1,9}))? ([A-Z]{1,5}|[+-]\d{4}) (.*)"
)
# A journal line whose time (and host) were cut off: "kernel: NVRM: Xid ...".
_CUT_RE = re.compile(r"(?:[^\s:\[]{1,255} )?kernel: (?:\[ *(\d{1,12}\.\d{1,9})\] )?(.*)")
# dmesg -H: "[Nov26 10:01] msg" when the minute changes, "[  +0.000004] msg" (since the last).
_HUMAN_RE = re.compile(r"\[(\w{3}) ?(\d{1,2}) (\d{2}):(\d{2})(?::(\d{2}))?\] ?(.*)")
_DELTA_RE = re.compile(r"\[ *\+(\d{1,12}\.\d{1,9})\] ?(.*)")
# talosctl dmesg: "<node>: kern: warning: [2026-04-22T21:27:51.291213998Z]: msg"
_TALOS_RE = re.compile(
    r"[^\s:]{1,255}: [a-z]{1,10}: {1,8}[a-z]{1,10}: \[(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):"
    r"(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:?\d{2})\]: (.*)"
)
# dmesg -t: no timestamp, only "subsystem: msg" or "driver device: msg" lines.
_BARE_RE = re.compile(r"[A-Za-z_][\w.\-]{0,40}(?: [\w:.\-]{1,40})?: .*")
_NVIDIA_RE = re.compile(r"NVRM|nvidia", re.IGNORECASE)
# "host kernel: msg" after a journal/syslog timestamp; the kernel's own [uptime] may follow.
_IDENT_RE = re.compile(r"\S+ [^\s:\[]+(?:\[\d+\])?: (?:\[ *(\d{1,12}\.\d{1,9})\] )?(.*)")
_JOURNAL_META_RE = re.compile(r"-- .* --")  # "-- Boot 3f.. --", "-- No entries --"

_XID_RE = re.compile(
    r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f]+:[0-9A-Fa-f]+(?::[0-9A-Fa-f]+)?(?:\.[0-7])?)\): "
    r"(\d{1,18})(?!\d)"
    r"(?:, pid=([^,]*), name=([^,]*))?(?:, ?(.*))?"
)
# NVLink5 XIDs (Blackwell) carry their own severity word: "149, NETIR_LINK_EVT  Fatal ...".
_NVLINK5_XIDS = range(144, 151)
_SEVERITY_RE = re.compile(r"\b(Fatal|Non-?fatal)\b", re.IGNORECASE)
# XID 154: "GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)".
_RECOVERY_RE = re.compile(
    r"recovery action changed from (0x[0-9A-Fa-f]{1,8}) .{0,60}?to (0x[0-9A-Fa-f]{1,8})"
)
_SXID_RE = re.compile(
    r"(nvidia-nvswitch\d+): SXid \(PCI:([0-9A-Fa-f:.]+)\): (\d{1,18}), (Fatal|Non-fatal), ?(.*)"
)
# nvidia-peermem errors: the word ERROR after the module's name, searched once from the first
# mention (`nvidia-peermem\b.*\bERROR\b` rescans the line from every mention).
_ERROR_WORD_RE = re.compile(r"\bERROR\b")
_MENTIONS_XID_RE = re.compile(r"NVRM: Xid|SXid \(")
# The lines that follow an SXID and repeat it with its details (not a report of their own).
_SXID_DETAIL_RE = re.compile(r"SXid \(PCI:[0-9A-Fa-f:.]{1,40}\): \d{1,18}, (?:Severity \d|Data \{)")

_FM_RE = re.compile(
    r"\[(\w{3}) (\d{1,2}) (\d{4}) (\d{2}):(\d{2}):(\d{2})\] \[([A-Z]+)\] (?:\[tid \d+\] )?(.*)"
)
_FM_LEVELS = ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL", "FATAL")
_FM_CODE_RE = re.compile(r"error (\d{1,18})(?!\d)")
_FM_BUS_RE = re.compile(r"pci bus id ([0-9A-Fa-f:.]+)")


_BUS = re.compile(r"(?:([0-9A-Fa-f]{1,8}):)?([0-9A-Fa-f]{1,2}):([0-9A-Fa-f]{1,2})(?:\.([0-7]))?")


def bus_id(text: str) -> str:
    """A kernel-log PCI address ("0000:19:00", "19:00", "0000:3b:00.1") in NVML's form.

    NVML prints "00000000:19:00.0"; the driver's XID lines omit the function number. An
    address that is none of these is kept as printed: it matches no GPU, so its event is
    reported as one of an unknown GPU rather than dropped.
    """
    match = _BUS.fullmatch(text)
    if match is None:
        return text[:40]
    domain, bus, device, function = match.groups()
    return (
        f"{int(domain or '0', 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{function or '0'}"
    )


def stamp(seconds: float, utc: bool = True) -> str:
    """Seconds since the epoch as the canonical time string (naive when the zone is unknown)."""
    whole = int(seconds // 1)
    micros = int(round((seconds - whole) * 1e6))
    if micros == 1000000:
        whole, micros = whole + 1, 0
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
    if micros:
        text += f".{micros:06d}"
    return text + ("Z" if utc else "")


def epoch(text: str) -> float:
    """A canonical time string back to seconds since the epoch (a naive one read as UTC)."""
    match = re.fullmatch(
        r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,18}))?Z?", text
    )
    if not match:
        raise ValueError(f"not a canonical time: {text!r}")
    fields = [int(part) for part in match.groups()[:6]]
    fraction = float(f"0.{match.group(7)}") if match.group(7) else 0.0
    return calendar.timegm((*fields, 0, 0, 0)) + fraction


def _civil(
    year: int,
    month: int,
    day: int,
    hour: int,
    minute: int,
    second: int,
    fraction: Optional[str] = None,
    zone: Optional[str] = None,
) -> str:
    if not 1970 <= year <= 9000:  # before the epoch, or far enough ahead to overflow a stamp
        raise ValueError(f"year {year}")
    seconds: float = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if fraction:
        seconds += float(f"0.{fraction}")
    if zone and zone != "Z":
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return stamp(seconds, utc=zone is not None)


def _syslog_year(month: int, day: int, now: float) -> int:
    """Syslog-style lines carry no year: the latest one that does not put them in the future."""
    today = time.gmtime(now)
    later = (month, day) > (today.tm_mon, today.tm_mday + 1)
    return today.tm_year - 1 if later else today.tm_year


Split = Tuple[str, Optional[str], Optional[float], str]


def _split_line(line: str, now: float, clock: List[Optional[float]]) -> Optional[Split]:
    """(format, time, uptime_s, message) of one kernel log line, or None when unrecognised
    (a date that does not exist, such as month 13, is no timestamp). `clock` carries the time
    of the last `dmesg -H` line, which the next relative one adds to."""
    try:
        return _split(line, now, clock)
    except (ValueError, OverflowError):
        return None


def _split(line: str, now: float, clock: List[Optional[float]]) -> Optional[Split]:
    match = _KMSG_RE.fullmatch(line)
    if match:
        return KMSG, None, int(match.group(3)) / 1e6, match.group(4)
    decoded = _FACILITY_RE.fullmatch(line)
    body = decoded.group(1) if decoded else line
    match = _UPTIME_RE.fullmatch(body)
    if match:
        return DMESG, None, float(match.group(1)), match.group(2)
    match = _CTIME_RE.fullmatch(body)
    if match and match.group(1) in _MONTHS:
        month, day, hour, minute, second, year, message = match.groups()
        when = _civil(int(year), _MONTHS[month], int(day), int(hour), int(minute), int(second))
        return DMESG_T, when, None, message
    match = _ISO_RE.fullmatch(body)
    if match:
        year, month, day, hour, minute, second, fraction, zone, message = match.groups()
        numbers = (int(year), int(month), int(day), int(hour), int(minute), int(second))
        when = _civil(*numbers, fraction=fraction, zone=zone)
        # dmesg writes "05:39:15,491363"; journald and rsyslog use a dot or no fraction.
        dmesg = decoded or body[19] == ","
        ident = None if dmesg else _IDENT_RE.fullmatch(message)
        if ident:
            uptime = float(ident.group(1)) if ident.group(1) else None
            return JOURNAL_ISO, when, uptime, ident.group(2)
        return DMESG_DECODE_ISO if decoded else DMESG_ISO, when, None, message
    if decoded:
        return None
    return _split_other(body, now, clock)


def _split_other(body: str, now: float, clock: List[Optional[float]]) -> Optional[Split]:
    """The forms people paste besides dmesg's and journald's defaults (see the docstring)."""
    match = _SYSLOG_RE.fullmatch(body) or _FULL_RE.fullmatch(body)
    if match and match.re is _SYSLOG_RE and match.group(1) in _MONTHS:
        month, day, hour, minute, second, fraction, rest = match.groups()
        number, day_number = _MONTHS[month], int(day)
        year = _syslog_year(number, day_number, now)
        numbers = (year, number, day_number, int(hour), int(minute), int(second))
        return _journal(JOURNAL, _civil(*numbers, fraction=fraction), rest)
    if match and match.re is _FULL_RE:
        zone = match.group(8)
        utc = "Z" if zone in ("UTC", "GMT") else zone if zone[0] in "+-" else None
        return _journal(JOURNAL, _dated(match, utc), match.group(9))
    match = _TALOS_RE.fullmatch(body)
    if match:
        return TALOS, _dated(match, match.group(8)), None, match.group(9)
    match = _HUMAN_RE.fullmatch(body)
    if match and match.group(1) in _MONTHS:
        month, day, hour, minute, second, message = match.groups()
        number, day_number = _MONTHS[month], int(day)
        year = _syslog_year(number, day_number, now)
        when = _civil(year, number, day_number, int(hour), int(minute), int(second or 0))
        clock[0] = epoch(when)
        return DMESG_H, when, None, message
    match = _DELTA_RE.fullmatch(body)
    if match:
        if clock[0] is None:  # relative to a line that is not there: no time
            return DMESG_H, None, None, match.group(2)
        clock[0] += float(match.group(1))
        return DMESG_H, stamp(clock[0], utc=False), None, match.group(2)
    match = _CUT_RE.fullmatch(body)
    if match:
        return JOURNAL_CUT, None, float(match.group(1)) if match.group(1) else None, match.group(2)
    if _BARE_RE.fullmatch(body):
        return DMESG_NO_TIME, None, None, body
    return None


def _dated(match: Any, zone: Optional[str]) -> str:
    """The canonical time of a match whose groups 1-7 are year .. second and fraction."""
    year, month, day, hour, minute, second = (int(part) for part in match.groups()[:6])
    return _civil(year, month, day, hour, minute, second, match.group(7), zone)


def _journal(name: str, when: str, rest: str) -> Optional[Split]:
    """A journal/syslog line's parts, if "host ident: " follows its time."""
    ident = _IDENT_RE.fullmatch(rest)
    if ident is None:
        return None
    uptime = float(ident.group(1)) if ident.group(1) else None
    return name, when, uptime, ident.group(2)


def _event(message: str) -> Optional[Dict[str, Any]]:
    """The NVIDIA event a kernel message reports, if any."""
    match = _XID_RE.search(message)
    if match:
        bus, code, pid, name, text = match.groups()
        pid = (pid or "").strip("'")
        name = (name or "").strip()
        event = {
            "kind": "xid",
            "bus_id": bus_id(bus),
            "code": int(code),
            "pid": int(pid) if re.fullmatch(r"[0-9]{1,10}", pid) else None,
            "process": name if name and name != "<unknown>" else None,
            "text": (text or "").strip(),
        }  # type: Dict[str, Any]
        if event["code"] in _NVLINK5_XIDS:
            word = _SEVERITY_RE.search(event["text"])
            # Without its word the line is judged as fatal: unknown is never harmless.
            event["fatal"] = word is None or word.group(1).lower() == "fatal"
        elif event["code"] == 154:
            change = _RECOVERY_RE.search(event["text"])
            if change:
                event["recovery"] = {
                    "from": int(change.group(1), 16),
                    "to": int(change.group(2), 16),
                }
        return event
    match = _SXID_RE.search(message)
    if match:
        device, bus, code, severity, text = match.groups()
        return {
            "kind": "sxid",
            "bus_id": bus_id(bus),
            "code": int(code),
            "fatal": severity == "Fatal",
            "device": device,
            "text": text.strip(),
        }
    fault = faults.find(message)
    if fault is not None:
        bus = faults.bus_in(message)
        return {
            "kind": "fault",
            "fault": fault,
            "bus_id": bus_id(bus) if bus else None,
            "gpu": faults.label_in(message),
            "code": None,
            "text": message.strip()[:300],
        }
    peermem = message.find("nvidia-peermem")
    if peermem >= 0 and _ERROR_WORD_RE.search(message, peermem):
        return {"kind": "peermem", "text": message.strip()}
    if _MENTIONS_XID_RE.search(message) and not _SXID_DETAIL_RE.search(message):
        # An XID or SXID report that cannot be read is still one: never skipped as noise.
        return {"kind": "unreadable", "text": message.strip()[:300]}
    return None


def _lines(text: str) -> List[str]:
    return [line.rstrip("\r") for line in text.splitlines() if line.strip()]


def detect(text: str) -> Optional[str]:
    """The kernel log format of a text (by its first lines), or None if it is not one."""
    head = _lines(text[:65536])[:50]
    seen: Dict[str, int] = {}
    clock: List[Optional[float]] = [None]
    for line in head:
        if _JOURNAL_META_RE.fullmatch(line) or _KMSG_DICT_RE.match(line):
            continue
        if line[0] in " \t" and seen:  # continues the record above
            continue
        found = _split_line(line, time.time(), clock)
        if found:
            seen[found[0]] = seen.get(found[0], 0) + 1
    if not seen or sum(seen.values()) * 2 < len(head):
        return None
    if set(seen) == {DMESG_NO_TIME} and not _NVIDIA_RE.search(text):
        return None  # without timestamps, only the NVIDIA driver's lines say "kernel log"
    return max(seen, key=lambda name: seen[name])


def parse(text: str, now: Optional[float] = None) -> Dict[str, Any]:
    """Every NVIDIA event of a kernel log, in log order, plus where the log ends.

    Returns {"format", "events", "newest", "newest_uptime_s", "future_lines"}. Lines of other
    subsystems are skipped; a non-empty text in which no line has a kernel-log timestamp is a
    ParseError. `now` (default: the clock) places year-less syslog timestamps in a year.

    The log ends at its last line, not at its largest timestamp: a kernel log is written in
    order, so one absurd stamp (a later year) cannot move a saved log's window past every real
    event. A time after `now` (plus a day of clock skew), or an uptime of more than ten years,
    cannot be the end either; such lines are counted in `future_lines` and their events kept,
    as are the events of lines whose timestamp cannot be read (with no time).
    """
    now = time.time() if now is None else now
    events: List[Dict[str, Any]] = []
    formats: Dict[str, int] = {}
    newest: Optional[str] = None
    newest_uptime: Optional[float] = None
    future = 0
    first_unknown = None
    clock: List[Optional[float]] = [None]
    previous: Optional[Split] = None
    opened: Tuple[Optional[str], int] = (None, 0)  # "The NVIDIA GPU <bus>" and its line
    labels: Dict[str, str] = {}  # the driver's "GPU6" -> the bus id a line gave it
    for number, line in enumerate(_lines(text), 1):
        if _JOURNAL_META_RE.fullmatch(line) or _KMSG_DICT_RE.match(line):
            continue
        if line[0] in " \t" and previous is not None:
            # dmesg and journalctl indent the further lines of a multi-line record
            found: Optional[Split] = ("", previous[1], previous[2], line.strip())
        else:
            found = _split_line(line, now, clock)
        if found is None:
            first_unknown = first_unknown or (number, line)
            # A report whose timestamp is garbled is still a report: kept with no time.
            found = ("", None, None, line)
        else:
            previous = found
        name, when, uptime, message = found
        if name:
            formats[name] = formats.get(name, 0) + 1
        if when is not None:
            if epoch(when) > now + _SKEW_S:
                future += 1
            else:
                newest = when
        if uptime is not None:
            if uptime > _MAX_UPTIME_S:
                future += 1
            else:
                newest_uptime = uptime
        event = _event(message)
        if "NVRM" in message:
            opened = _note_gpu(message, number, opened, labels)
        if event is not None:
            if event["kind"] == "fault" and event["bus_id"] is None and number - opened[1] <= 2:
                event["bus_id"] = opened[0]  # the report's first line named the GPU
            events.append({**event, "time": when, "uptime_s": uptime})
    if not formats and first_unknown is not None:
        number, line = first_unknown
        raise ParseError(f"line {number}: not a kernel log line: {line[:120]!r}")
    if set(formats) == {DMESG_NO_TIME} and not _NVIDIA_RE.search(text):
        raise ParseError(
            "no line has a timestamp and none is the NVIDIA driver's: not taken for a kernel log"
        )
    faults.attribute(events, labels)
    return {
        "format": max(formats, key=lambda name: formats[name]) if formats else None,
        "events": events,
        "newest": newest,
        "newest_uptime_s": newest_uptime,
        "future_lines": future,
    }


def _note_gpu(
    message: str, number: int, opened: Tuple[Optional[str], int], labels: Dict[str, str]
) -> Tuple[Optional[str], int]:
    """Learn from an NVRM message which GPU later lines mean: the bus id a multi-line report
    opens with, and the bus id of a driver GPU number ("GPU4") a line names both of."""
    start = faults.opener(message)
    if start is not None:
        return bus_id(start), number
    bus, label = faults.bus_in(message), faults.label_in(message)
    if bus is not None and label is not None:
        labels.setdefault(label, bus_id(bus))
    return opened


def detect_fabric_manager(text: str) -> bool:
    """Whether a text is an nvidia-fabricmanager log (its first line is an FM log line)."""
    head = _lines(text[:4096])
    return bool(head) and _FM_RE.fullmatch(head[0]) is not None


def parse_fabric_manager(text: str) -> Dict[str, Any]:
    """The ERROR/FATAL entries of an nvidia-fabricmanager log, plus its newest timestamp.

    FM logs local time without a zone, so times are naive. "detected NVSwitch fatal error"
    and FATAL entries are `fatal`; "non-fatal" ones and other errors are not. Continuation
    lines (message payloads) are skipped; a non-empty log without one FM line is a ParseError.
    """
    events: List[Dict[str, Any]] = []
    newest: Optional[str] = None
    first = None
    entries = 0
    for number, line in enumerate(_lines(text), 1):
        match = _FM_RE.fullmatch(line)
        if match is None:
            first = first or (number, line)
            continue
        entries += 1
        month, day, year, hour, minute, second, level, message = match.groups()
        try:
            number_of = _MONTHS[month]
            when: Optional[str] = _civil(
                int(year), number_of, int(day), int(hour), int(minute), int(second)
            )
        except (KeyError, ValueError, OverflowError):  # a garbled date: the entry still counts
            when = None
        if when is not None and epoch(when) <= time.time() + _SKEW_S:
            newest = when  # the log's last line ends it (see parse)
        if level not in _FM_LEVELS:  # a garbled level may hide an error
            events.append(
                {"kind": "unreadable", "time": when, "uptime_s": None, "text": line[:300]}
            )
            continue
        if level not in ("ERROR", "FATAL", "CRITICAL"):
            continue
        lowered = message.lower()
        code = _FM_CODE_RE.search(message)
        bus = _FM_BUS_RE.search(message)
        events.append(
            {
                "kind": "fabric_manager",
                "time": when,
                "uptime_s": None,
                "code": int(code.group(1)) if code else None,
                "bus_id": bus_id(bus.group(1)) if bus else None,
                "fatal": level in ("FATAL", "CRITICAL")
                or ("fatal error" in lowered and "non-fatal" not in lowered),
                "text": message.strip(),
            }
        )
    if not entries and first is not None:
        raise ParseError(f"line {first[0]}: not a fabric manager log line: {first[1][:120]!r}")
    return {"format": "nvidia-fabricmanager log", "events": events, "newest": newest}


def _moment(event: Dict[str, Any]) -> Optional[float]:
    """An event's place in time: its wall-clock time, else its uptime, else None."""
    return epoch(event["time"]) if event["time"] is not None else event["uptime_s"]


def group_key(event: Dict[str, Any]) -> tuple:
    """What an event is counted with: its kind, bus id and code (XIDs, SXIDs) or fault name
    and the driver's GPU number (kernel faults); a group carries the same fields."""
    return (
        event["kind"],
        event.get("bus_id") or "",
        event.get("code") or 0,
        event.get("fault") or "",
        event.get("gpu") or "",
    )


def summarise(
    events: List[Dict[str, Any]], keep_per_group: int = 10, keep_total: int = 1000
) -> Dict[str, Any]:
    """Exact counts per group_key and a capped sample of the events themselves.

    A log with 600 application XIDs must not drown one XID 79 nor bloat the facts: each group
    keeps its first and last `keep_per_group // 2` events (at most `keep_total` in all, in log
    order), while its count, first/last time, first text and fatal flag stay exact.
    """
    groups: Dict[tuple, Dict[str, Any]] = {}
    members: Dict[tuple, List[int]] = {}
    spans: Dict[tuple, List[Optional[float]]] = {}
    for position, event in enumerate(events):
        key = group_key(event)
        group = groups.get(key)
        if group is None:
            group = groups[key] = {
                "kind": event["kind"],
                "bus_id": event.get("bus_id"),
                "code": event.get("code"),
                "count": 0,
                "first": event["time"],
                "first_uptime_s": event["uptime_s"],
                "sample": event["text"],
                "processes": [],
            }
            if event["kind"] == "fault":
                group.update(fault=event["fault"], gpu=event["gpu"])
            members[key] = []
        group["count"] += 1
        # First and last in time, not in log order: an older copy of a line after a newer one
        # must not move the group out of the window. Events without a time follow log order.
        moment = _moment(event)
        first, last = spans.setdefault(key, [moment, moment])
        if group["count"] == 1 or last is None or (moment is not None and moment >= last):
            group["last"], group["last_uptime_s"] = event["time"], event["uptime_s"]
            spans[key][1] = moment
            if event["kind"] == "xid" and event.get("code") == 154:
                # the action the latest change left pending (None: that line was unreadable)
                group["recovery"] = (event.get("recovery") or {}).get("to")
        if moment is not None and first is not None and moment < first:
            group["first"], group["first_uptime_s"] = event["time"], event["uptime_s"]
            group["sample"] = event["text"]
            spans[key][0] = moment
        if "fatal" in event:
            group["fatal"] = bool(group.get("fatal")) or event["fatal"]
        process = event.get("process")
        if process and len(group["processes"]) < 5:
            label = f"{process}[{event['pid']}]" if event.get("pid") is not None else process
            if label not in group["processes"]:
                group["processes"].append(label)
        members[key].append(position)
    half = max(keep_per_group // 2, 1)
    kept: List[int] = []
    for positions in members.values():
        kept += positions if len(positions) <= 2 * half else positions[:half] + positions[-half:]
    kept = sorted(kept)[:keep_total]
    return {
        "counts": list(groups.values()),
        "events": [events[position] for position in kept],
        "dropped": len(events) - len(kept),
    }
