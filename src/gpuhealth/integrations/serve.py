"""`gpuhealth serve`: the node health service NVIDIA's ft_launcher asks before every rendezvous.

ft_launcher (nvidia-resiliency-ext, `--ft-node-health-check-endpoint`) calls
`nvhcd.HealthCheckService/RunHealthCheck` over gRPC on a Unix socket (nvhcd.proto beside this
file); `--http` serves the same verdict as plain HTTP on loopback for launchers and load
balancers that do not speak gRPC.

The client gives up after 60 s and takes a late answer, like any RPC error, as "healthy
(skipped)": a service that probed the node per request would vouch for exactly the nodes whose
driver hangs. So the node is judged in a background thread (gpuhealth.local.judge_here: the
shipped probe as a child with a deadline, then the quick checks), at start and again --ttl
seconds after each judgement ends, and every request is answered from the latest verdict in
milliseconds. It fails closed: a request that comes before the first verdict waits at most
--startup-wait seconds for it (and never past the client's deadline) and is then answered
unhealthy, and so is one whose verdict is older than a refresh can take (refreshing is stuck,
e.g. in a driver call no signal ends), and one the service fails to answer.

The node state (--node-state): ft_launcher asks for a job that runs or restarts here, so the
default is in-use (fault rules only). With auto, every request reads the state where that needs
no NVML (the kubelet's pods, Slurm's view of this node) and never serves a verdict judged in
another state as current: a node a job took since its idle verdict gets that verdict's facts
judged again under in-use rules (a subset: no probe needed); a node that became idle since its
in-use verdict is judged again at once, within the client's deadline, and answered unhealthy
when that cannot finish in time.

The socket (mode 0666 by default: the job's user must reach it, and all it gives is this node's
verdict) stays where it is when the service stops: ft_launcher resolves the endpoint once, when
it starts, and skips the check for its whole life if the socket is missing then. A restarted
service binds anew and renames its socket over the old one, so the path never goes missing.

A request's args are logged, not obeyed. They are the command line of NVIDIA's own health check
script: `--no-slurm` asks it not to act on Slurm, which serve never does, and `--group prolog
epilog logs gpu` narrows which of its checks run; an answer from fewer checks than the cached
verdict would vouch for a node the quick checks fail, so every client gets the whole verdict.
The expectations (inventory, profile) are read once at start: restart the service after
changing them.
"""

from __future__ import annotations

import argparse
import grp
import ipaddress
import json
import os
import pwd
import shlex
import signal
import socket
import stat
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpuhealth import report as reporting
from gpuhealth.config import ConfigError, ProfileSet, resolve_limits
from gpuhealth.facts import AUTO, IDLE, IN_USE
from gpuhealth.integrations import kubelet, nodecheck
from gpuhealth.local import LocalVerdict, Selection, judge_here, rejudged
from gpuhealth.probe import command, state
from gpuhealth.report import VerdictDocument
from gpuhealth.results import Action
from gpuhealth.targets import Target

DEFAULT_SOCKET = Path("/var/run/nvhcd.sock")  # where NVIDIA's documentation puts nvhcd's
# Any local user may connect: the job that asks runs as its own user, and a launcher that cannot
# connect counts the node as healthy. The service only reads, and tells nothing but the node's
# verdict (no facts, no inventory).
DEFAULT_SOCKET_MODE = "0666"
DEFAULT_TTL_S = 60.0
DEFAULT_STARTUP_WAIT_S = 20.0
# The client waits 60 s for an answer; the first one must come well before that.
MAX_STARTUP_WAIT_S = 45.0
# What one judgement may take beyond the probe's --timeout: local.run_local_probe waits 5 s more
# before it kills the probe, then the quick checks run; the rest is room for a loaded machine.
REFRESH_SLACK_S = 30.0
# A Unix socket's path, in bytes, without the NUL that ends it in sun_path (108 on Linux).
SUN_PATH_MAX = 107
# What an answer needs to reach a client before its deadline: a request that waits for the
# first verdict stops waiting this long before the client would give up (and count it healthy).
DEADLINE_MARGIN_S = 2.0
# How long ft_launcher waits for an answer: the deadline of a request that names none (HTTP).
CLIENT_DEADLINE_S = 60.0
# Slurm's view of this node, read at request time with --node-state auto, gives up after this.
STATE_TIMEOUT_S = 2.0
# What a state reader says when nothing answers without NVML (then the cached verdict's stands).
NO_CHEAP_STATE = "neither the kubelet nor Slurm says: the verdict's own node state stands"
# An HTTP connection that sends no complete request in this long is closed: an idle client
# must not hold one of the server's threads for good.
HTTP_IDLE_TIMEOUT_S = 10.0

_LOG_LOCK = threading.Lock()


def _log(message: str) -> None:
    """One line on stderr (the journal under systemd); threads never interleave lines."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    with _LOG_LOCK:
        sys.stderr.write(f"{stamp} gpuhealth serve: {message}\n")
        sys.stderr.flush()


def _printable(text: str) -> str:
    """What a client sent, fit for one log line: control characters escaped (a newline in a
    request's args must not forge a log line, an escape sequence not drive the terminal)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _notify(state: str) -> None:
    """Tell systemd how the service stands (Type=notify); nothing without NOTIFY_SOCKET."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(state.encode(), address)
    except OSError as exc:
        _log(f"cannot notify systemd at {address!r}: {exc}")


@dataclass(frozen=True)
class Answer:
    """What a client is told: healthy or not, the JSON document, and why not."""

    healthy: bool
    verdict: str
    document: dict[str, Any]
    error: str

    @property
    def exit_code(self) -> int:
        """As `gpuhealth node-check`'s: 0 healthy, 1 not."""
        return nodecheck.EXIT_OK if self.healthy else nodecheck.EXIT_FAIL

    def output(self) -> str:
        """The document as the response's `output`."""
        return json.dumps(self.document)


def _unhealthy(document: VerdictDocument, message: str, action: Action) -> Answer:
    """`document` with one more failed check saying why nothing vouches for the node now: a
    client that reads only `fail_count` must not take it for healthy either."""
    closed = document.refused("serve", message, action)
    return Answer(False, closed.overall, closed.node_json(), message)


# (state, why) of this node now, or (None, why) where nothing tells without NVML.
StateReader = Callable[[], tuple[str | None, str]]


def node_state_reader(selection: Selection, target: Target) -> StateReader:
    """How serve reads this node's state at request time. A fixed --node-state is the state of
    every judgement; auto reads what answers without NVML (a driver call may hang): the
    kubelet's pods, else Slurm's view of this node, each bounded."""
    resolved = resolve_limits(target.expectations, ProfileSet(selection.profile_dir), None)
    requested = str(resolved.values["node_state"])  # --node-state, else the inventory's
    if requested != AUTO:
        return lambda: (requested, "requested")
    slurm_node = selection.slurm_node or target.host_vars.get("slurm_node_name")

    def scontrol(argv: list[str], _timeout_s: float) -> command.CommandResult:
        return command.run(argv, STATE_TIMEOUT_S)  # a request cannot wait the probe's 5 s

    def now() -> tuple[str | None, str]:
        hint = kubelet.node_state_hint(selection.kubelet_socket)
        # Only a pod holding GPUs settles it: "no GPU pod" leaves jobs the kubelet does not see
        # to Slurm, else to the verdict's own state (the probe saw the GPUs' processes).
        if isinstance(hint, dict) and hint.get("state") == IN_USE:
            return IN_USE, str(hint.get("source"))
        found = state.slurm_view(str(slurm_node) if slurm_node else None, scontrol)
        return found if found is not None else (None, NO_CHEAP_STATE)

    return now


class Verdicts:
    """The latest judgement of this node, refreshed by one background thread. Requests read it
    and never wait for a probe, except (bounded) for the very first and, with a state reader
    (--node-state auto), for the judgement of a node that became idle since its verdict."""

    def __init__(
        self,
        host: str,
        judge: Callable[[], LocalVerdict],
        ttl_s: float,
        max_age_s: float,
        clock: Callable[[], float] = time.monotonic,
        state_now: StateReader | None = None,
    ) -> None:
        self.host = host
        self.ttl_s = ttl_s
        self.max_age_s = max_age_s
        self._judge = judge
        self._clock = clock
        self._state_now = state_now
        self._changed = threading.Condition()
        self._wake = threading.Event()  # judge again now, not after --ttl
        self._started_at = clock()
        self._latest: LocalVerdict | None = None
        self._failure: str | None = None  # the latest judgement raised: why
        self._done_at: float | None = None  # clock() when the latest judgement ended
        self._begun = 0  # judgements begun, and the number of the latest one published
        self._published = 0
        self._said = ""  # the latest verdict as logged
        self._closed = False

    def refresh(self) -> None:
        """Judge the node once and publish the result. An exception is published as the
        verdict's failure (the node is then served unhealthy) instead of ending the refresher."""
        with self._changed:
            self._begun += 1
            number = self._begun
        try:
            latest, failure = self._judge(), None
        except Exception as exc:  # a gpuhealth bug: the service must outlive it and say so
            latest, failure = None, f"judging this node failed: {type(exc).__name__}: {exc}"
            _log(f"{failure}\n{traceback.format_exc().rstrip()}")
            self._said = ""
        with self._changed:
            self._latest, self._failure, self._done_at = latest, failure, self._clock()
            self._published = number
            self._changed.notify_all()
        if latest is not None:
            said = latest.headline()
            if latest.node_state:
                said += f" [{latest.node_state}]"
            if said != self._said:  # a line per change, not per refresh
                _log(f"verdict {said} (judged in {latest.duration_s:.1f} s)")
                self._said = said
            _notify(f"STATUS=verdict {said}"[:200])

    def refresh_forever(self, stop: threading.Event) -> None:
        """Judge, then wait --ttl seconds (or until a request needs a new judgement), until
        `stop` is set."""
        while not stop.is_set():
            self.refresh()
            self._wake.wait(self.ttl_s)
            self._wake.clear()

    def close(self) -> None:
        """Stopping: requests still waiting for a verdict are answered now."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._wake.set()

    def fresh(self) -> tuple[bool, str]:
        """Whether the service can vouch for its answer (a verdict, recent enough), and how it
        stands in words: what /healthz reports."""
        with self._changed:
            latest, failure, done_at = self._latest, self._failure, self._done_at
        now = self._clock()
        if done_at is None:
            return False, f"no verdict yet (judging for {now - self._started_at:.0f} s)"
        if failure is not None:
            return False, failure
        assert latest is not None
        age = now - done_at
        if age > self.max_age_s:
            return False, f"verdict {latest.verdict.verdict} is stale ({age:.0f} s old)"
        return True, f"verdict {latest.verdict.verdict}, {age:.0f} s old"

    def answer(self, wait_s: float, budget_s: float = 0.0) -> Answer:
        """The answer to a request now: from the latest verdict, waiting at most `wait_s` for
        the first one; unhealthy when there is none, or it failed, or it is stale. With a
        state reader, never a verdict of another node state: `budget_s` (from the call) bounds
        the wait for the judgement of a node that became idle since its verdict."""
        began = time.monotonic()
        with self._changed:
            self._changed.wait_for(
                lambda: self._done_at is not None or self._closed, timeout=wait_s
            )
            latest, failure, done_at = self._latest, self._failure, self._done_at
        current, why = self._state_now() if self._state_now else (None, None)
        empty = VerdictDocument.unjudged(self.host, current, why)
        if done_at is None:
            return _unhealthy(
                empty,
                f"no verdict yet: the first check of this node has been running for "
                f"{self._clock() - self._started_at:.0f} s; ask again",
                Action.RERUN,
            )
        if current is not None and why is not None and latest is not None:
            if latest.node_state not in (None, current) and current == IN_USE:
                latest = self._in_use(latest, why)
            elif latest.node_state not in (None, current):
                found = self._judged_again(current, began + budget_s)
                if found is None:
                    return _unhealthy(
                        empty,
                        f"node state changed to {current} since the last verdict ({why}); "
                        "judging again",
                        Action.RERUN,
                    )
                latest, failure, done_at = found
        if failure is not None:
            return _unhealthy(empty, failure, Action.RERUN)
        assert latest is not None
        document = latest.verdict_document()
        age = self._clock() - done_at
        if age > self.max_age_s:
            return _unhealthy(
                document,
                f"the latest verdict is {age:.0f} s old, older than the {self.max_age_s:g} s "
                "a refresh may take: refreshing is stuck (a driver call that never returns?)",
                Action.INSPECT,
            )
        verdict = latest.verdict.verdict
        if verdict in reporting.HEALTHY:
            return Answer(True, verdict, document.node_json(), "")
        if not document.failures:  # NOT_CHECKED: nothing passed, nothing failed
            return _unhealthy(document, latest.headline(), Action.INSPECT)
        return Answer(False, verdict, document.node_json(), latest.headline())

    def _in_use(self, idle: LocalVerdict, why: str) -> LocalVerdict:
        """The idle verdict's facts judged under in-use rules, kept as the latest verdict (with
        its time: the facts are no newer) unless a refresh published another meanwhile."""
        busy = rejudged(idle, IN_USE, why)
        with self._changed:
            if self._latest is idle:
                self._latest = busy
        _log(f"node state now {IN_USE} ({why}): the {IDLE} verdict's facts judged again")
        return busy

    def _judged_again(
        self, current: str, deadline: float
    ) -> tuple[LocalVerdict | None, str | None, float] | None:
        """Wake the refresher and wait until `deadline` (time.monotonic()) for a judgement
        in the `current` state or one begun after this request: (verdict, failure, done_at),
        or None when none came in time."""
        with self._changed:
            needed = self._begun + 1

            def judged() -> bool:
                return (
                    self._closed
                    or self._published >= needed
                    or (self._latest is not None and self._latest.node_state == current)
                )

            self._wake.set()
            _log(f"node state now {current}: judging again")
            if not self._changed.wait_for(judged, timeout=max(0.0, deadline - time.monotonic())):
                return None
            if self._closed or self._done_at is None:
                return None
            return self._latest, self._failure, self._done_at


def answer_now(verdicts: Verdicts, wait_s: float, remaining_s: float | None = None) -> Answer:
    """The answer to one request, gRPC's or HTTP's: the cached verdict, waiting for a first
    one at most `wait_s`, and for a judgement the node's new state needs at most until the
    client's deadline (`remaining_s` from now, ft_launcher's 60 s when the client names
    none), less DEADLINE_MARGIN_S: a request queued behind others still answers in time. A
    failure to answer is an unhealthy answer, never an error: the launcher counts errors as
    healthy."""
    deadline_s = CLIENT_DEADLINE_S if remaining_s is None else remaining_s
    budget_s = max(0.0, deadline_s - DEADLINE_MARGIN_S)
    try:
        return verdicts.answer(min(wait_s, budget_s), budget_s)
    except Exception as exc:
        message = f"gpuhealth serve failed to answer: {type(exc).__name__}: {exc}"
        _log(f"{message}\n{traceback.format_exc().rstrip()}")
        return _unhealthy(
            VerdictDocument.unjudged(verdicts.host, None, None), message, Action.RERUN
        )


@dataclass(frozen=True)
class Options:
    """The service's own options, validated."""

    socket: Path
    mode: int
    owner: tuple[int, int]  # uid, gid; -1 keeps one as it is
    http: tuple[str, int] | None
    ttl_s: float
    startup_wait_s: float


def _socket_path(path: Path) -> Path:
    path = path.absolute()
    # The socket is bound in a private directory beside it first (_publish): that path is
    # longer than the final one by the directory's name.
    longest = len(os.fsencode(path.parent / ".gh-xxxxxxxx" / "s"))
    if len(os.fsencode(path)) > SUN_PATH_MAX or longest > SUN_PATH_MAX:
        raise ConfigError(
            f"--socket {path}: too long for a Unix socket (at most {SUN_PATH_MAX - 13} bytes "
            "for its folder)"
        )
    if not path.parent.is_dir():
        raise ConfigError(f"--socket {path}: folder {path.parent} does not exist")
    return path


def _mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        raise ConfigError(f"--socket-mode {text}: not an octal mode such as 0660") from None
    if not 0 <= mode <= 0o777:
        raise ConfigError(f"--socket-mode {text}: permissions go from 0000 to 0777")
    return mode


def _owner(spec: str | None) -> tuple[int, int]:
    """USER[:GROUP] or :GROUP, names or numbers, as chown(1) reads them."""
    if not spec:
        return -1, -1
    user, _, group = spec.partition(":")
    uid = gid = -1
    try:
        if user:
            uid = int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid
        if group:
            gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError(f"--socket-owner {spec}: no such user or group on this host") from None
    return uid, gid


def _http_address(text: str) -> tuple[str, int]:
    """HOST:PORT ([::1]:PORT for IPv6) on loopback: the endpoint has no authentication."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--http {text}: not HOST:PORT, e.g. 127.0.0.1:9411")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(
            f"--http {text}: {host!r} is not an IP address; give 127.0.0.1 or [::1]"
        ) from None
    if not address.is_loopback:
        raise ConfigError(
            f"--http {text}: {host} is not a loopback address; the HTTP endpoint has no "
            "authentication, so it listens on loopback only (127.0.0.1, [::1])"
        )
    return str(address), int(port)


def options(args: argparse.Namespace) -> Options:
    """The Options the command line gives (ConfigError on a bad value)."""
    if not 1 <= args.ttl <= 86400:
        raise ConfigError("--ttl must be between 1 and 86400 seconds")
    if not 0 <= args.startup_wait <= MAX_STARTUP_WAIT_S:
        raise ConfigError(
            f"--startup-wait must be between 0 and {MAX_STARTUP_WAIT_S:g} seconds (ft_launcher "
            "gives up after 60 s and then counts the node as healthy)"
        )
    return Options(
        socket=_socket_path(args.socket),
        mode=_mode(args.socket_mode),
        owner=_owner(args.socket_owner),
        http=_http_address(args.http) if args.http else None,
        ttl_s=args.ttl,
        startup_wait_s=args.startup_wait,
    )


def _check_stale(path: Path) -> None:
    """Make sure the socket at `path`, if any, is one a stopped server left (the new one is
    renamed over it: the path never goes missing); refuse to replace anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ConfigError(f"--socket {path}: exists and is not a socket; not replacing it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            _log(f"replacing the socket {path} a stopped server left (nothing answers on it)")
            return
        except OSError as exc:
            raise ConfigError(
                f"--socket {path}: cannot tell whether a server answers on it ({exc}); "
                "not replacing it"
            ) from None
    raise ConfigError(
        f"--socket {path}: another server answers on it; stop it or give another --socket"
    )


def _publish(bind: Callable[[str], None], path: Path, mode: int, owner: tuple[int, int]) -> None:
    """Bind the socket in a private directory beside `path`, give it its mode and owner there,
    then rename it into place (over a stopped server's, in one step): no client ever sees it
    with other permissions or finds the path missing, and no process-wide umask changes while
    other threads run."""
    try:
        private = Path(tempfile.mkdtemp(prefix=".gh-", dir=path.parent))  # mode 0700
    except OSError as exc:
        raise ConfigError(f"--socket {path}: cannot create it: {exc.strerror}") from None
    staged = private / "s"
    try:
        try:
            bind(str(staged))
        except RuntimeError as exc:  # what grpc raises when it cannot bind
            raise ConfigError(f"--socket {path}: {exc}") from None
        os.chmod(staged, mode)
        if owner != (-1, -1):
            os.chown(staged, *owner)
        os.rename(staged, path)
    except OSError as exc:
        raise ConfigError(f"--socket {path}: cannot set it up: {exc.strerror}") from None
    finally:
        staged.unlink(missing_ok=True)
        private.rmdir()


def _grpc_server(verdicts: Verdicts, wait_s: float) -> Any:
    """The gRPC server answering RunHealthCheck from `verdicts` (not yet bound). grpc is
    imported here: `gpuhealth node-check`, run by Slurm every few minutes, never loads it."""
    try:
        import grpc

        from gpuhealth.integrations import nvhcd_pb2, nvhcd_pb2_grpc
    except Exception as exc:  # not installed, or versions the generated code refuses
        raise ConfigError(
            f"cannot load gRPC ({type(exc).__name__}: {exc}); install gpuhealth's dependencies "
            "(grpcio and protobuf at the versions its pyproject.toml names)"
        ) from None

    class HealthCheckService(nvhcd_pb2_grpc.HealthCheckServiceServicer):
        def RunHealthCheck(self, request: Any, context: Any) -> Any:  # the proto's name
            started = time.perf_counter()
            answer = answer_now(verdicts, wait_s, context.time_remaining())
            _log(
                f"rpc peer={context.peer()} args={_printable(shlex.join(request.args)) or '-'} "
                f"verdict={answer.verdict} success={answer.healthy} "
                f"node_state={answer.document.get('node_state') or '-'} "
                f"{(time.perf_counter() - started) * 1000:.1f} ms"
            )
            return nvhcd_pb2.HealthCheckResponse(
                success=answer.healthy,
                exit_code=answer.exit_code,
                output=answer.output(),
                error=answer.error,
            )

    server = grpc.server(ThreadPoolExecutor(max_workers=4, thread_name_prefix="rpc"))
    nvhcd_pb2_grpc.add_HealthCheckServiceServicer_to_server(HealthCheckService(), server)
    return server


def _http_server(address: tuple[str, int], verdicts: Verdicts, wait_s: float) -> Any:
    """GET /healthz (200 while the service has a fresh verdict, else 503) and GET /v1/verdict
    (the RPC's JSON document; 200 healthy, 503 not); anything else is 404."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "gpuhealth-serve"
        timeout = HTTP_IDLE_TIMEOUT_S

        def do_GET(self) -> None:  # http.server's name
            path = urlsplit(self.path).path
            if path == "/healthz":
                fresh, state = verdicts.fresh()
                self._send(200 if fresh else 503, "text/plain", f"{state}\n")
            elif path == "/v1/verdict":
                answer = answer_now(verdicts, wait_s)
                self._send(200 if answer.healthy else 503, "application/json", answer.output())
            else:
                self._send(404, "text/plain", "not found: GET /healthz or /v1/verdict\n")

        def _send(self, code: int, kind: str, body: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            _log(f"http {self.client_address[0]} {_printable(format % args)}")

    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        daemon_threads = True

    try:
        return Server(address, Handler)
    except OSError as exc:
        raise ConfigError(f"--http {address[0]}:{address[1]}: {exc.strerror}") from None


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`gpuhealth serve` and its options."""
    parser = sub.add_parser(
        "serve",
        help="node health service for ft_launcher (gRPC on a Unix socket) and loopback HTTP",
        description=__doc__.splitlines()[0],
    )
    # ft_launcher asks on behalf of a job that runs or restarts here: fault rules only.
    nodecheck.add_selection(parser, IN_USE)
    parser.add_argument(
        "--socket",
        type=Path,
        default=DEFAULT_SOCKET,
        help=f"the Unix socket ft_launcher connects to (default {DEFAULT_SOCKET})",
    )
    parser.add_argument(
        "--socket-mode",
        default=DEFAULT_SOCKET_MODE,
        help=f"the socket's permissions, octal (default {DEFAULT_SOCKET_MODE}: any local user "
        "may connect; the service only reads and answers with the node's verdict, no facts). "
        "The job's user must be able to connect, or ft_launcher skips the check and counts "
        "the node as healthy: with 0660, give the jobs' group with --socket-owner",
    )
    parser.add_argument(
        "--socket-owner", metavar="USER[:GROUP]", help="the socket's owner and group"
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="also serve GET /healthz and /v1/verdict on this loopback address (port 0: a "
        "free port, logged)",
    )
    parser.add_argument(
        "--ttl",
        type=float,
        default=DEFAULT_TTL_S,
        help=f"seconds from one judgement's end to the next one's start (default "
        f"{DEFAULT_TTL_S:g})",
    )
    parser.add_argument(
        "--startup-wait",
        type=float,
        default=DEFAULT_STARTUP_WAIT_S,
        help=f"how long a request before the first verdict waits for it, then is answered "
        f"unhealthy (default {DEFAULT_STARTUP_WAIT_S:g})",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT; 0 after a clean stop, 2 when it cannot start."""
    http = None
    try:
        chosen = nodecheck.selection(args)
        opts = options(args)
        target = chosen.target()
        max_age_s = opts.ttl_s + chosen.timeout_s + REFRESH_SLACK_S
        verdicts = Verdicts(
            target.name,
            lambda: judge_here(chosen, target),
            opts.ttl_s,
            max_age_s,
            state_now=node_state_reader(chosen, target),
        )
        server = _grpc_server(verdicts, opts.startup_wait_s)
        _check_stale(opts.socket)
        if opts.http is not None:
            http = _http_server(opts.http, verdicts, opts.startup_wait_s)
        _publish(
            lambda staged: server.add_insecure_port(f"unix:{staged}"),
            opts.socket,
            opts.mode,
            opts.owner,
        )
    except ConfigError as exc:
        print(f"gpuhealth serve: {exc}", file=sys.stderr)
        if http is not None:
            http.server_close()
        return nodecheck.EXIT_USAGE
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    threading.Thread(
        target=verdicts.refresh_forever, args=(stop,), name="refresh", daemon=True
    ).start()
    if http is not None:
        threading.Thread(target=http.serve_forever, name="http", daemon=True).start()
        host, port = http.server_address[:2]
        _log(f"http on http://{f'[{host}]' if ':' in host else host}:{port}")
    # The endpoint as ft_launcher's --ft-node-health-check-endpoint takes it (unix:///path).
    _log(
        f"serving {target.name} at unix://{opts.socket} (mode {opts.mode:04o}, node state "
        f"{chosen.node_state}, every {opts.ttl_s:g} s, stale after {max_age_s:g} s)"
    )
    _notify("READY=1")
    try:
        stop.wait()
    finally:
        _log("stopping")
        _notify("STOPPING=1")
        verdicts.close()
        server.stop(grace=2).wait()
        if http is not None:
            http.shutdown()
            http.server_close()
        # The socket stays: a launcher that starts before the next server binds finds the path.
    return nodecheck.EXIT_OK
