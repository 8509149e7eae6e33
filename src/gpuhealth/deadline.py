"""Calls that must not outlive their deadline: a hung SSH transport cannot hang the run.

The probe and the load tests are bounded on the node by `timeout`; this bounds them again on
the controller, where the connection itself may hang (a node that stops answering mid-call).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DeadlineExceeded(Exception):
    """The call did not return in time; it is left running on a daemon thread."""


def within(seconds: float, call: Callable[[], T]) -> T:
    """call() on a daemon thread; its result or exception, or DeadlineExceeded after `seconds`."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise DeadlineExceeded(f"no answer within {seconds:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
