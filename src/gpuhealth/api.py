"""Judge this node from inside a training script: `check`, `quick_check` and `Watcher`.

node-check and serve answer the programs outside a job (Slurm, node-problem-detector,
ft_launcher); a training script asks here, in its own process, before it joins the job and
while it trains. It is the same judgement (gpuhealth.local): the shipped probe as a child
process with a deadline, so a hung driver call is killed instead of hanging the script, then
the quick checks against this host's expectations. It imports neither pytest nor grpc.

A judgement never raises: a probe that fails or a bug while judging is an unhealthy verdict
(action RERUN), as nothing vouches for the node then. Only bad arguments raise (ValueError, or
gpuhealth's ConfigError, a ValueError, for a bad profile or inventory), when they are given.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from types import TracebackType

from gpuhealth import report as reporting
from gpuhealth.facts import AUTO, IDLE, IN_USE
from gpuhealth.families.gpu.scope import gpu_label
from gpuhealth.local import DEFAULT_TIMEOUT_S, LocalVerdict, Selection, judge_here
from gpuhealth.results import Action

__all__ = ["FailedCheck", "Verdict", "Watcher", "check", "quick_check"]

log = logging.getLogger(__name__)

NODE_STATES = (IDLE, IN_USE, AUTO)
# quick_check's probe deadline: a script's start should not wait node-check's 40 s for a hung
# driver; a healthy node's probe takes a few seconds, as it waits for nothing when in use.
QUICK_TIMEOUT_S = 20.0
DEFAULT_INTERVAL_S = 60.0  # serve's --ttl


@dataclass(frozen=True)
class FailedCheck:
    """One finding that makes the node unhealthy, as node-check --json lists it."""

    check: str
    gpu: int | None
    message: str
    action: str  # an action code: RESET_GPU, DRAIN, RMA, RERUN...


@dataclass(frozen=True)
class Verdict:
    """One judgement of this node (or one GPU of it). `bool(verdict)` is `healthy`: PASS and
    WARN are healthy; FAIL and NOT_CHECKED (nothing vouched for the node) are not. Immutable,
    as one verdict is shared by every caller of a Watcher."""

    healthy: bool
    verdict: str  # PASS, WARN, FAIL or NOT_CHECKED
    reasons: tuple[str, ...]  # one per distinct problem, most severe first
    actions: tuple[str, ...]  # action codes, most drastic first
    failed_checks: tuple[FailedCheck, ...]
    node_state: str | None  # idle or in-use (None: the probe failed before deciding)
    node_state_source: str | None  # why, in words
    checked_at: datetime  # when the judgement began (UTC)
    duration_s: float
    host: str
    gpu: int | None = None  # the GPU judged, or None for the whole node

    def __bool__(self) -> bool:
        return self.healthy

    @property
    def headline(self) -> str:
        """The verdict and its first reason on one line: what a log line or an exit says."""
        return reporting.headline(self.verdict, list(self.reasons))


class _Judge:
    """One validated request for a judgement: arguments checked and the host's expectations
    read when it is made, so a Watcher's thread never meets a usage error."""

    def __init__(
        self,
        gpu: int | None,
        node_state: str,
        profile: str | None,
        expected_gpus: int | None,
        inventory: str | None,
        host: str | None,
        timeout_s: float,
    ) -> None:
        if node_state not in NODE_STATES:
            raise ValueError(
                f"node_state must be one of {', '.join(NODE_STATES)}, not {node_state!r}"
            )
        if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0):
            raise ValueError(f"gpu must be a GPU index (an int >= 0) or None, not {gpu!r}")
        if expected_gpus is not None and expected_gpus < 0:
            raise ValueError(f"expected_gpus must be >= 0, not {expected_gpus!r}")
        if not 0 < timeout_s <= 3600:
            raise ValueError(f"timeout_s must be between 0 and 3600 seconds, not {timeout_s!r}")
        self.gpu = gpu
        self.selection = Selection(
            host=host,
            inventory=inventory,
            profile=profile,
            expected_gpus=expected_gpus,
            timeout_s=timeout_s,
            node_state=node_state,
        )
        self.target = self.selection.target()  # ConfigError: bad profile or inventory

    def __call__(self) -> Verdict:
        started, clock = datetime.now(timezone.utc), time.monotonic()
        try:
            local = judge_here(self.selection, self.target)
        except Exception as exc:  # a bug must neither vouch for the node nor kill a Watcher
            log.exception("gpuhealth could not judge %s", self.target.name)
            book = reporting.VerdictBook()
            book.error(self.target.name, "check", None, f"{type(exc).__name__}: {exc}")
            (failed,) = book.finish()
            return _verdict(failed, started, time.monotonic() - clock, self.gpu)
        return _of(local, self.gpu)


def _of(local: LocalVerdict, gpu: int | None) -> Verdict:
    """The API's verdict of a judgement; for one GPU, from that GPU's findings and the
    node's own (driver, GPU count, host, fabric, kernel log: they concern every GPU)."""
    checked_at = datetime.fromtimestamp(local.checked_at, timezone.utc)
    if gpu is None:
        return _verdict(local.verdict, checked_at, local.duration_s, None)
    book = reporting.VerdictBook()
    if local.node_state is not None and local.node_state_source is not None:
        book.state(local.host, local.node_state, local.node_state_source)
    for note in local.verdict.notes:
        book.note(local.host, note)
    slots = local.verdict.gpu_slots
    if slots is not None and gpu >= slots:
        book.add(
            reporting.Outcome(
                "gpu_index",
                "FAIL",
                local.host,
                gpu,
                f"not on this node, which is judged on {slots} GPUs",
                gpu_label(local.host, gpu, None),
                Action.FIX_CONFIG.value,
                "pass the GPU's NVML index (nvidia-smi's), not a CUDA ordinal that "
                "CUDA_VISIBLE_DEVICES renumbered",
            )
        )
    for outcome in local.outcomes:
        if outcome.gpu in (None, gpu):
            book.add(outcome)
    (node,) = book.finish()
    return _verdict(node, checked_at, local.duration_s, gpu)


def _verdict(
    node: reporting.NodeVerdict, checked_at: datetime, duration_s: float, gpu: int | None
) -> Verdict:
    return Verdict(
        healthy=node.verdict in reporting.HEALTHY,
        verdict=node.verdict,
        reasons=tuple(node.reasons),
        actions=tuple(node.actions),
        failed_checks=tuple(
            FailedCheck(e["check"], e["gpu"], e["message"], e["action"]) for e in node.failed
        ),
        node_state=node.node_state,
        node_state_source=node.node_state_source,
        checked_at=checked_at,
        duration_s=round(duration_s, 3),
        host=node.host,
        gpu=gpu,
    )


def check(
    gpu: int | None = None,
    node_state: str = IN_USE,
    *,
    profile: str | None = None,
    expected_gpus: int | None = None,
    inventory: str | None = None,
    host: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Verdict:
    """Judge this node now, as `gpuhealth node-check` does, in `node_state`: in-use (default:
    a running job's processes and memory are expected, only faults count), idle (every rule:
    stray processes, idle memory, temperature, power) or auto (Slurm, the kubelet, else
    compute processes decide). With `gpu`, that GPU's findings (its NVML index, as
    nvidia-smi numbers it) and the node's own. The host's expectations come from `inventory`
    (this host's vars, `host` default the hostname), `profile` and `expected_gpus`, else the
    profile matching the GPUs found. The probe gets `timeout_s`; late, it is killed and the
    node is unhealthy."""
    return _Judge(gpu, node_state, profile, expected_gpus, inventory, host, timeout_s)()


def quick_check(
    *,
    profile: str | None = None,
    expected_gpus: int | None = None,
    inventory: str | None = None,
    host: str | None = None,
    timeout_s: float = QUICK_TIMEOUT_S,
) -> Verdict:
    """A training script's check at its start: the node's faults (driver, lost GPUs, ECC,
    row remapping, XIDs, recovery actions, NVLink, fabric, storage...) judged in use, with a
    20 s probe deadline. It skips the idle rules, since the job's other ranks may already hold
    the GPUs: stray processes, idle memory and its reclaim wait, idle temperature and power,
    P-state and PCIe speed. Load tests and run history are the suite's, never judged here."""
    return check(
        None,
        IN_USE,
        profile=profile,
        expected_gpus=expected_gpus,
        inventory=inventory,
        host=host,
        timeout_s=timeout_s,
    )


class _Flight:
    """A judgement in progress, which callers arriving meanwhile wait for instead of probing."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.verdict: Verdict | None = None


class Watcher:
    """Judges this node while a job runs: `check()` on demand and, once started, every
    `interval_s` seconds after the last judgement in a daemon thread. Thread-safe: callers
    that ask while a judgement is in flight share it (one probe, not one per caller).

    `on_failure(verdict)` is called once for every unhealthy verdict, in the thread that made
    the judgement (the watcher's own for the background ones); whatever it raises is logged and
    the watcher goes on. To end the training process from it call `os._exit`: `sys.exit` in a
    thread ends only that thread. The other arguments are `check`'s, validated here (the
    inventory is read once, here: make a new Watcher after changing it)."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        on_failure: Callable[[Verdict], object] | None = None,
        *,
        gpu: int | None = None,
        node_state: str = IN_USE,
        profile: str | None = None,
        expected_gpus: int | None = None,
        inventory: str | None = None,
        host: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, not {interval_s!r}")
        self.interval_s = interval_s
        self.on_failure = on_failure
        self._judge = _Judge(gpu, node_state, profile, expected_gpus, inventory, host, timeout_s)
        self._lock = threading.Lock()
        self._flight: _Flight | None = None
        self._latest: Verdict | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def latest(self) -> Verdict | None:
        """The last verdict (None before the first judgement ends)."""
        with self._lock:
            return self._latest

    def check(self) -> Verdict:
        """Judge the node now, or wait for the judgement already in flight, and return it."""
        with self._lock:
            flight = self._flight
            leading = flight is None
            if flight is None:
                flight = self._flight = _Flight()
        if not leading:
            flight.done.wait()
            # None: the judgement was interrupted (KeyboardInterrupt in its thread): judge anew.
            return flight.verdict if flight.verdict is not None else self.check()
        try:
            flight.verdict = self._judge()
        finally:
            with self._lock:
                self._flight = None
                if flight.verdict is not None:  # not `or`: an unhealthy Verdict is falsy
                    self._latest = flight.verdict
            flight.done.set()
        if not flight.verdict.healthy and self.on_failure is not None:
            _notify(self.on_failure, flight.verdict)
        return flight.verdict

    def start(self) -> Watcher:
        """Judge in the background from now on (nothing if already started)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stopping = stopping = threading.Event()
            self._thread = threading.Thread(
                target=self._run, args=(stopping,), name="gpuhealth-watcher", daemon=True
            )
            self._thread.start()
        return self

    def _run(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            self.check()
            stopping.wait(self.interval_s)

    def stop(self, timeout_s: float | None = None) -> None:
        """End the background judgements: at once between two, else when the one in flight
        ends (bounded by the probe's deadline), or after `timeout_s` without waiting longer."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stopping.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)

    def __enter__(self) -> Watcher:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


def _notify(on_failure: Callable[[Verdict], object], verdict: Verdict) -> None:
    """Call a Watcher's on_failure; what it raises is logged, never passed on."""
    try:
        on_failure(verdict)
    except SystemExit:
        log.error("on_failure called sys.exit(), which ends no process here: use os._exit")
    except Exception:
        log.exception("on_failure raised; the watcher goes on")
