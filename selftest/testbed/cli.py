"""Command line of the test bed: ``bed up [--nodes N] | down | status | ssh NODE [CMD] | demo``."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import bedlib

REPO = Path(__file__).resolve().parent.parent.parent
VENV_PYTHON = REPO / ".venv" / "bin" / "python"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bed", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="(re)create the bed, cleaning up any earlier run first")
    p_up.add_argument("--nodes", type=int, default=3)
    sub.add_parser("down", help="remove every node, link, namespace, mount and the run dir")
    sub.add_parser("status", help="show nodes and whether each answers ssh")
    p_ssh = sub.add_parser("ssh", help="ssh to a node through the bed's ssh_config")
    p_ssh.add_argument("node")
    p_ssh.add_argument("command", nargs=argparse.REMAINDER)
    p_pub = sub.add_parser("publish", help="add .deb files to the running bed's mirror")
    p_pub.add_argument("debs", nargs="+")
    p_demo = sub.add_parser(
        "demo", help="a fleet of fake GPU nodes: run the health suite on it, render the report"
    )
    p_demo.add_argument("--reports", type=Path, default=REPO / "reports" / "demo")
    p_demo.add_argument("--keep", action="store_true", help="leave the bed up afterwards")
    args = parser.parse_args(argv)

    if args.cmd == "demo":
        return demo(args.reports.resolve(), args.keep)
    try:
        if args.cmd == "up":
            start = time.monotonic()
            bed = bedlib.up(args.nodes)
            print(f"bed up: {len(bed.nodes)} nodes in {time.monotonic() - start:.2f}s")
            return status(bed)
        if args.cmd == "down":
            start = time.monotonic()
            bedlib.down()
            print(f"bed down in {time.monotonic() - start:.2f}s")
            return 0
        bed = bedlib.Bed.load()
        if bed is None:
            left = bedlib.leftovers()
            print("bed is down" + (" (leftovers: " + "; ".join(left) + ")" if left else ""))
            return 1
        if args.cmd == "status":
            return status(bed)
        if args.cmd == "publish":
            bed.publish(args.debs)
            return 0
        ssh = ["ssh", "-F", str(bed.ssh_config), args.node, *args.command]
        os.execvp("ssh", ssh)
    except bedlib.BedError as exc:
        print(f"bed: {exc}", file=sys.stderr)
        return 2
    return 0


def demo(reports: Path, keep: bool) -> int:
    """Run the demo in the project's venv (it runs pytest and imports gpuhealth)."""
    if Path(sys.prefix).resolve() != VENV_PYTHON.parent.parent.resolve():
        if not VENV_PYTHON.exists():
            print("bed demo needs the venv: run `make venv` first", file=sys.stderr)
            return 2
        script = Path(__file__).with_name("bed")
        argv = [str(VENV_PYTHON), str(script), "demo", "--reports", str(reports)]
        os.execv(argv[0], argv + (["--keep"] if keep else []))
    from . import demo as demo_module  # needs the venv

    try:
        return demo_module.run(reports, keep)
    except bedlib.BedError as exc:
        print(f"bed: {exc}", file=sys.stderr)
        return 2


def status(bed: bedlib.Bed) -> int:
    print(f"run dir:    {bed.run_dir}  (state: {bed.run_dir / 'state.json'})")
    print(
        f"ssh_config: {bed.ssh_config}\ninventory:  {bed.inventory}\nmirror:     {bed.mirror_url}"
    )
    ok = True
    for node in bed.nodes:
        alive = bedlib.ssh_ok(bed, node.name)
        ok &= alive
        print(f"  {node.name:4} {node.address:15} {node.netns:10} ssh {'ok' if alive else 'FAIL'}")
    return 0 if ok else 1
