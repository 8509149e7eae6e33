"""The history views on a fleet-sized run store: 1,000 nodes x 30 nights by default.

Writes a synthetic store through the real Store (a run per night, every node with 8 GPUs and
the values a healthy H100 node stores: about 140 a node a night, 4 million in all; a few
regressions a night: one GPU of ten nodes, or --warming N, warming up from night 20), then
times the commands people run in the morning:

    .venv/bin/python bench/history_fleet.py                 # build /tmp/gpuhealth-fleet.sqlite
    .venv/bin/python bench/history_fleet.py --nodes 100     # a smaller one
    .venv/bin/python bench/history_fleet.py --warming 1000  # every node regressed

Each command's wall time and exit status are printed; the store is kept for further looks
(`gpuhealth history ... --history /tmp/gpuhealth-fleet.sqlite`).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from gpuhealth.history.store import RunRecord, Store  # noqa: E402

DAY = 86400.0
T0 = 1_790_000_000.0
GPU_COUNTERS = (
    "ecc_uncorrected_aggregate",
    "ecc_corrected_aggregate",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "retired_pages",
    "pcie_replays",
    "nvlink_replay_errors",
    "nvlink_recovery_errors",
    "nvlink_crc_flit_errors",
    "nvlink_crc_data_errors",
    "nvlink_ecc_data_errors",
)
IB_COUNTERS = ("link_downed", "symbol_error", "port_rcv_errors", "link_error_recovery")


def night_record(night: int, nodes: int, warm: set[int], rng: random.Random) -> RunRecord:
    """One night's run: every node PASS but the warming ones past night 20 (a regression)."""
    at = T0 + night * DAY
    run = RunRecord(
        uid=f"{night:08d}-bench",
        started_at=at,
        finished_at=at + 900,
        complete=True,
        exit_status=0,
        level="standard",
        source="live",
        command="pytest --level standard",
        inventory="ansible://gpu_nodes",
        profiles="h100-sxm",
        controller="bench",
        version="bench",
    )
    for n in range(nodes):
        host = f"node{n:04d}"
        collected = at + n * 0.5
        hot = n in warm and night >= 20
        run.nodes.append(
            {
                "host": host,
                "verdict": "FAIL" if hot else "PASS",
                "profile": "h100-sxm",
                "driver": "570.86.15",
                "firmware": json.dumps({"mlx5_0": "28.41.1000"}),
                "collected_at": collected,
            }
        )
        node_rows = [("xid_fatal_events", 0.0), ("nccl_busbw_gbps", 476.5 + rng.uniform(-5, 5))]
        node_rows += [(f"ib.mlx5_{p}.1.{c}", float(night)) for p in range(8) for c in IB_COUNTERS]
        for name, value in node_rows:
            run.measurements.append(
                {"host": host, "gpu": None, "gpu_key": None, "metric": name, "value": value}
            )
        for gpu in range(8):
            serial = f"{n:04d}{gpu:02d}0000"
            run.gpus.append(
                {
                    "host": host,
                    "idx": gpu,
                    "uuid": f"GPU-{serial}",
                    "serial": serial,
                    "vbios": "96.00.99.00.01",
                    "name": "NVIDIA H100 80GB HBM3",
                }
            )
            temp = 30 + rng.uniform(-1, 1) + (15 if hot and gpu == 3 else 0)
            values = {c: float(night * (gpu == 1)) for c in GPU_COUNTERS}
            values |= {"idle_temperature_c": round(temp, 1), "idle_power_w": 70.0}
            for name, value in values.items():
                run.measurements.append(
                    {"host": host, "gpu": gpu, "gpu_key": serial, "metric": name, "value": value}
                )
            if hot and gpu == 3:
                run.regressions.append(
                    {
                        "host": host,
                        "gpu": gpu,
                        "check": "gpu_regression",
                        "metric": "idle_temperature_c",
                        "baseline": json.dumps(30.0),
                        "value": json.dumps(round(temp, 1)),
                        "message": f"{host} gpu{gpu}: idle temperature {temp:.1f} C is 15 C "
                        "above its baseline 30 C (median of 7 good runs); more than 10 C is "
                        "a regression",
                        "action": "INSPECT",
                    }
                )
    return run


def build(path: Path, nodes: int, nights: int, warming: int) -> None:
    rng = random.Random(23)
    warm = set(rng.sample(range(nodes), min(warming, nodes)))
    store = Store(str(path))
    started = time.monotonic()
    for night in range(nights):
        store.write_run(night_record(night, nodes, warm, rng))
    store.close()
    print(f"built {path}: {nodes} nodes x {nights} nights in {time.monotonic() - started:.0f} s")


def timed(*argv: str) -> None:
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    took = time.monotonic() - started
    lines = proc.stdout.count("\n")
    print(f"{took:6.2f} s  exit {proc.returncode}  {lines:5d} lines  {' '.join(argv[1:])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--store", type=Path, default=Path("/tmp/gpuhealth-fleet.sqlite"))
    parser.add_argument("--reuse", action="store_true", help="time an existing store")
    parser.add_argument(
        "--warming", type=int, default=10, help="nodes whose GPU 3 warms up from night 20 (10)"
    )
    args = parser.parse_args()
    if not args.reuse:
        args.store.unlink(missing_ok=True)
        build(args.store, args.nodes, args.nights, args.warming)
    cli = str(Path(sys.executable).parent / "gpuhealth")
    store = ("--history", str(args.store))
    since = time.strftime("%Y-%m-%d", time.gmtime(T0 + (args.nights - 7) * DAY))
    timed(cli, "history", "regressions", *store)
    timed(cli, "history", "regressions", "--json", *store)
    timed(cli, "history", "regressions", "--since", since, *store)
    timed(cli, "history", "node0001", *store)
    timed(cli, "history", *store)
    timed(cli, "history", "--plot", "/tmp/gpuhealth-fleet.png", *store)


if __name__ == "__main__":
    main()
