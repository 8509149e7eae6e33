"""A pytest plugin for bench/scale.py: each process of a run (the controller, every xdist
worker) appends its own CPU time (user + system, its children's not included) at its end to
the file $GPUHEALTH_BENCH_CPU, one line `<controller|gwN> <seconds>`: with `-n N` the controller
handles every test's reports alone, and its share per test bounds what more workers can
give."""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    path = os.environ.get("GPUHEALTH_BENCH_CPU")
    if not path:
        return
    times = os.times()
    who = getattr(config, "workerinput", {}).get("workerid", "controller")
    with open(path, "a") as out:
        out.write(f"{who} {times.user + times.system:.3f}\n")
