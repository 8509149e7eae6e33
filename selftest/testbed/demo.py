"""`bed demo`: the health suite against a GPU fleet made of fakes, for people without GPUs.

Brings up the scenario fleet of fleet.py (n1 healthy, n2 ECC errors, a GPU reset pending and a
hung storage path, dgx-gpu3 an old driver, a missing GPU and no EFA where the inventory expects it,
n4 unreachable), runs the suite over SSH exactly as against real nodes, and renders the HTML
report with `make report`. Needs the venv (pytest, gpuhealth).
"""

from __future__ import annotations

import time
from pathlib import Path

from selftest.suite import run_suite

from . import bedlib, fleet, htmlreport


def run(reports: Path, keep: bool) -> int:
    """The demo from a clean slate; the bed is torn down afterwards unless `keep`."""
    bedlib.become_subreaper()
    started = time.monotonic()
    with bedlib.exclusive():
        return _run(reports, keep, started)


def _run(reports: Path, keep: bool, started: float) -> int:
    try:
        print(
            "bringing up 4 nodes (n1, n2, dgx-gpu3, n4) and installing the stand-in GPU stack ...",
            flush=True,
        )
        bed = fleet.up()
        fleet.provision(bed)
        hosts = f"ansible://all?ansible_inventory={bed.inventory}"
        print(f"running: pytest --hosts='{hosts}' -n 3", flush=True)
        suite = run_suite(reports, f"--hosts={hosts}", "-n", "3", env=bed.ansible_env())
        table = suite.output[suite.output.rfind("gpuhealth verdicts") :]
        print("=" * 20 + " " + table[: table.find("verdicts written to")].rstrip(), flush=True)
        index = htmlreport.make_report(reports)
    finally:
        if not keep:
            bedlib.down()
    print(f"\nsuite exit status {suite.rc} (1: faults found, as the scenarios intend)")
    print(f"JUnit:       {reports / 'junit.xml'}\nverdicts:    {reports / 'verdicts.json'}")
    print(f"HTML report: {index}  (one file: open it in a browser)")
    if keep:
        print(f"bed kept: {bed.inventory}; `selftest/testbed/bed ssh n2`, then `bed down`")
    print(f"done in {time.monotonic() - started:.0f}s")
    return 0
