"""Storage sub-probe: can this node read (and write) the paths its jobs depend on?

A stale NFS mount or a dead Lustre server blocks stat/open/read in the kernel, often in an
uninterruptible sleep that no signal ends, and so does opening a FIFO nobody writes to. Every
item is therefore looked at in a forked child process that answers through a pipe: the parent
gives each child `storage_timeout_s`, then SIGKILLs it and moves on without waiting for it to
die (a child in D state cannot). Up to MAX_PARALLEL children run at once, so N hung items cost
about ceil(N / MAX_PARALLEL) timeouts, never more than N.

Forked, not spawned: the probe's modules exist only in memory on the node (transport.py), so a
fresh interpreter could not import this code. A child only makes system calls and writes JSON,
so locks that other threads of the probe (a hung NVML call) held at fork time do not matter.

Paths are looked up under `config["root"]` like /proc and /sys (a probe whose node filesystem
is mounted elsewhere), and reported as configured.
"""

import errno
import fnmatch
import json
import os
import secrets
import selectors
import signal
import socket
import stat
import time
from collections import deque
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from gpuhealth.facts import why
from gpuhealth.families.storage import parse_mounts, schema
from gpuhealth.parsing import ParseError
from gpuhealth.probe.node import read_text, under
from gpuhealth.schema import written

if TYPE_CHECKING:
    from gpuhealth.probe.main import Context

SECTIONS = written(schema.SECTIONS)
# Network filesystems whose mounts are always checked; storage_mount_types adds more.
DEFAULT_MOUNT_TYPES = ("lustre", "nfs", "nfs4")
MAX_PARALLEL = 8
READ_BYTES = 4096
# A directory proves readable with its first entries; listing millions on Lustre proves nothing.
LIST_LIMIT = 1000
# Lustre 2.12+ moved health_check from /proc to /sys; older clients still have the /proc one.
LUSTRE_HEALTH = ("/sys/fs/lustre/health_check", "/proc/fs/lustre/health_check")
# What a path record holds besides path/ok/error/elapsed_s; null where a step did not happen.
PATH_FIELDS: Dict[str, Any] = {
    "kind": None,
    "bytes_read": None,
    "entries": None,
    "free_gb": None,
    "wrote": None,
}

Task = Callable[[], Dict[str, Any]]


# ---------------------------------------------------------------- bounded child processes


class _Child:
    """A running check process: what it answers arrives in `data` through pipe `fd`."""

    def __init__(self, index: int, pid: int, fd: int, started: float) -> None:
        self.index = index
        self.pid = pid
        self.fd = fd
        self.started = started
        self.data = bytearray()


def _detach(keep_fd: int) -> None:
    """In a fresh child: let go of the probe's stdout/stderr (the pipe back to the controller,
    which a hung child must not hold open) and of every other inherited descriptor."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = list(range(3, 1024))
    for fd in fds:
        if fd > 2 and fd != keep_fd:
            try:
                os.close(fd)
            except OSError:
                pass


def _answer(task: Task) -> Dict[str, Any]:
    try:
        return task()
    except Exception as exc:  # a bug must still answer, or it would look like a hang
        return {"ok": False, "error": f"probe error: {type(exc).__name__}: {exc}"}


def _start(index: int, task: Task) -> _Child:
    read_fd, write_fd = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        raise
    if pid == 0:
        code = 1
        try:
            _detach(write_fd)
            data = json.dumps(_answer(task)).encode()
            while data:
                data = data[os.write(write_fd, data) :]
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    return _Child(index, pid, read_fd, time.monotonic())


def _reap_killed(pids: List[int]) -> None:
    """Reap killed children that are gone within a moment; one in D state is left to init."""
    until = time.monotonic() + 0.2
    while pids and time.monotonic() < until:
        for pid in list(pids):
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            except ChildProcessError:
                pass
            pids.remove(pid)
        time.sleep(0.01)


def _finished(child: _Child) -> Dict[str, Any]:
    try:
        result = json.loads(bytes(child.data))
    except ValueError:
        result = {"ok": False, "error": "check process died without an answer"}
    result["elapsed_s"] = round(time.monotonic() - child.started, 3)
    return result


def run_bounded(
    tasks: List[Task], timeout_s: float, parallel: int = MAX_PARALLEL
) -> List[Dict[str, Any]]:
    """Run each task in its own child process, at most `parallel` at a time.

    A task's result is its dict plus `elapsed_s`; a task that does not answer within
    `timeout_s` is killed and gets {"ok": False, "error": "timed out after N s"}.
    """
    results: List[Dict[str, Any]] = [{} for _ in tasks]
    queue = deque(enumerate(tasks))
    running: Dict[int, _Child] = {}
    killed: List[int] = []
    with selectors.DefaultSelector() as selector:
        while queue or running:
            while queue and len(running) < parallel:
                index, task = queue.popleft()
                try:
                    child = _start(index, task)
                except OSError as exc:
                    results[index] = {"ok": False, "error": f"cannot start a check: {exc}"}
                    continue
                running[child.fd] = child
                selector.register(child.fd, selectors.EVENT_READ)
            if not running:
                continue
            deadline = min(c.started for c in running.values()) + timeout_s
            for key, _ in selector.select(max(0.0, deadline - time.monotonic())):
                child = running[key.fd]
                chunk = os.read(key.fd, 65536)
                if chunk:
                    child.data += chunk
                    continue
                selector.unregister(key.fd)
                os.close(key.fd)
                del running[key.fd]
                results[child.index] = _finished(child)
                try:
                    os.waitpid(child.pid, 0)  # it closed its pipe by exiting: no real wait
                except ChildProcessError:  # reaped already (SIGCHLD ignored by an embedder)
                    pass
            now = time.monotonic()
            for fd, child in list(running.items()):
                if now - child.started < timeout_s:
                    continue
                try:
                    os.kill(child.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                selector.unregister(fd)
                os.close(fd)
                del running[fd]
                results[child.index] = {
                    "ok": False,
                    "error": f"timed out after {timeout_s:g} s",
                    "timed_out": True,
                    "elapsed_s": round(now - child.started, 3),
                }
                killed.append(child.pid)
    _reap_killed(killed)
    return results


# ---------------------------------------------------------------- what a child does


def _os_error(op: str, exc: OSError) -> str:
    reason = (exc.strerror or str(exc)).lower()
    return f"{op}: {reason}"


def _stat_error(full: str, exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        if os.path.islink(full):
            return f"dangling symlink to {os.readlink(full)}"
        return "does not exist"
    if exc.errno == errno.ENOTDIR:
        return "does not exist: a parent component is a file, not a directory"
    return _os_error("stat", exc)


def _write_test(directory: str) -> Optional[str]:
    """Create, fsync, read back and delete a uniquely named file; the first failure or None."""
    name = os.path.join(
        directory,
        f".gpuhealth-write-test-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}",
    )
    payload = secrets.token_bytes(64)
    op = "write"
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, payload)
            op = "fsync"
            os.fsync(fd)
        finally:
            os.close(fd)
        op = "read back"
        with open(name, "rb") as f:
            same = f.read() == payload
        op = "delete"
        os.unlink(name)
    except OSError as exc:
        if op != "delete" and os.path.lexists(name):
            try:
                os.unlink(name)
            except OSError:
                pass
        return _os_error(op, exc)
    return None if same else "read back: the file did not hold what was written"


def check_path(root: str, entry: Dict[str, Any]) -> Dict[str, Any]:
    """Everything about one configured path, run inside a child (any step may hang)."""
    full = under(root, entry["path"])
    record = dict(PATH_FIELDS)

    def done(error: Optional[str]) -> Dict[str, Any]:
        return {**record, "ok": error is None, "error": error}

    try:
        mode = os.stat(full).st_mode
    except OSError as exc:
        return done(_stat_error(full, exc))
    record["kind"] = "dir" if stat.S_ISDIR(mode) else "file" if stat.S_ISREG(mode) else "other"
    if stat.S_ISDIR(mode):
        try:
            with os.scandir(full) as listing:
                record["entries"] = sum(1 for _ in islice(listing, LIST_LIMIT))
        except OSError as exc:
            return done(_os_error("list", exc))
    elif not stat.S_ISSOCK(mode):  # a socket cannot be opened; its stat is all there is
        # FIFOs and devices are read like files: that is what a job would do with the path.
        try:
            with open(full, "rb", buffering=0) as f:
                record["bytes_read"] = len(f.read(READ_BYTES))
        except OSError as exc:
            return done(_os_error("read", exc))
    try:
        fs = os.statvfs(full)
    except OSError as exc:
        return done(_os_error("statvfs", exc))
    record["free_gb"] = round(fs.f_bavail * fs.f_frsize / 2**30, 3)  # GiB, as `df -h` shows
    if entry.get("writable"):
        if record["kind"] != "dir":
            return done("write: not a directory (a writable path must be a directory)")
        error = _write_test(full)
        record["wrote"] = error is None
        return done(error)
    return done(None)


def check_mount(root: str, mountpoint: str) -> Dict[str, Any]:
    """stat and statfs a mount point: statfs always asks the NFS/Lustre servers, stat may not."""
    full = under(root, mountpoint)
    for op, call in (("stat", os.stat), ("statfs", os.statvfs)):
        try:
            call(full)
        except OSError as exc:
            return {"ok": False, "error": _os_error(op, exc)}
    return {"ok": True, "error": None}


def read_lustre_health(root: str) -> Dict[str, Any]:
    """The Lustre client's own verdict (`healthy`, `NOT HEALTHY`, `LBUG`), if Lustre is loaded."""
    for path in LUSTRE_HEALTH:
        text = read_text(root, path)
        if text is not None:
            return {"ok": True, "error": None, "content": text.strip()}
    return {"ok": True, "error": None, "content": None}


# ---------------------------------------------------------------- the sub-probe


def _network_mounts(
    root: str, types: List[str], section: Dict[str, Any], ctx: Any
) -> List[Dict[str, Any]]:
    text = read_text(root, "/proc/mounts")
    if text is None:
        detail = "cannot read /proc/mounts"
    else:
        try:
            table = parse_mounts.parse(text)
        except ParseError as exc:
            detail = f"/proc/mounts: {exc}"
        else:
            # The last mount on a mount point hides the ones below it: only it can be reached.
            visible = {m["mountpoint"]: m for m in table}
            return [
                {k: m[k] for k in ("device", "mountpoint", "fstype")}
                for m in visible.values()
                if any(fnmatch.fnmatchcase(m["fstype"], t) for t in types)
            ]
    section["unavailable"]["mounts"] = why("error", detail)
    ctx.error("storage", detail)
    return []


def _entry(item: Any) -> Dict[str, Any]:
    """A storage_paths entry as the controller validated it (a bare path by hand)."""
    return {"path": item, "writable": False} if isinstance(item, str) else dict(item)


def collect(ctx: "Context") -> Dict[str, Any]:
    """The `storage` section: configured paths, network mounts and Lustre's health_check."""
    root = ctx.root
    timeout_s = float(ctx.setting("storage_timeout_s"))
    types = list(DEFAULT_MOUNT_TYPES) + list(ctx.setting("storage_mount_types") or [])
    paths = [_entry(item) for item in ctx.setting("storage_paths") or []]
    section: Dict[str, Any] = {
        "timeout_s": timeout_s,
        "mount_types": types,
        "paths": [],
        "mounts": None,
        "lustre_health_check": None,
        "unavailable": {},
    }
    network = _network_mounts(root, types, section, ctx)
    tasks: List[Task] = [partial(check_path, root, p) for p in paths]
    tasks += [partial(check_mount, root, m["mountpoint"]) for m in network]
    tasks.append(partial(read_lustre_health, root))
    results = run_bounded(tasks, timeout_s)
    health = results.pop()
    section["paths"] = [dict(PATH_FIELDS, path=p["path"], **r) for p, r in zip(paths, results)]
    if "mounts" not in section["unavailable"]:
        found = results[len(paths) :]
        section["mounts"] = [dict(m, **r) for m, r in zip(network, found)]
    if health.get("content") is not None:
        section["lustre_health_check"] = health["content"]
    elif health.get("error"):
        kind = "timeout" if health.get("timed_out") else "error"
        section["unavailable"]["lustre_health_check"] = why(kind, health["error"])
    else:
        section["unavailable"]["lustre_health_check"] = why(
            "absent", f"no {LUSTRE_HEALTH[0]}: Lustre client not loaded"
        )
    return {"storage": section}
