"""`gpuhealth history`: the run store as tables and trend plots, its pruning, and `pin`
(after a repair, a node's or GPU's drift baselines restart from its next night).

It reads a store and never creates one: a path that names none is an error.

matplotlib draws the plots (the Agg backend: a PNG, no display), imported only when a plot is
asked for; it comes with `pip install 'gpuhealth[plot]'`.
"""

from __future__ import annotations

import argparse
import io
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gpuhealth.families.history.metrics import gpu_key
from gpuhealth.history.run import DEFAULT_STORE, missing_store
from gpuhealth.history.store import Store, StoreError

# What a nightly report plots when the store has it: the trends people ask about first.
KEY_METRICS = (
    "nccl_busbw_gbps",
    "ecc_corrected_aggregate",
    "remapped_rows_correctable",
    "idle_temperature_c",
)
_SPAN = re.compile(r"^(\d+)([hdw])$")


def span_seconds(text: str) -> float:
    """`30d`, `12h`, `2w` as seconds (argparse's type for --since and --keep)."""
    found = _SPAN.match(text.strip())
    if not found:
        raise argparse.ArgumentTypeError(f"{text!r} is not a span like 30d, 12h or 2w")
    return int(found.group(1)) * {"h": 3600, "d": 86400, "w": 604800}[found.group(2)]


def _when(epoch: float) -> str:
    return time.strftime("%m-%d %H:%M", time.gmtime(epoch))


def _value(value: float) -> str:
    return f"{value:g}" if value == int(value) else f"{value:.1f}"


def tables(rows: list[dict[str, Any]], last: int) -> list[str]:
    """One table per node and GPU: a line per metric, its values in the last `last` runs."""
    groups: dict[tuple[str, int | None], dict[str, dict[float, float]]] = {}
    serials: dict[tuple[str, int | None], str] = {}
    for row in rows:
        key = (row["host"], row["gpu"])
        groups.setdefault(key, {}).setdefault(row["metric"], {})[row["started_at"]] = row["value"]
        if row["gpu_key"]:
            serials[key] = row["gpu_key"]
    lines: list[str] = []
    for (host, gpu), by_metric in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or -1)):
        times = sorted({t for values in by_metric.values() for t in values})[-last:]
        title = host if gpu is None else f"{host} gpu{gpu} ({serials.get((host, gpu), '?')})"
        width = max(len(m) for m in by_metric)
        lines += ["", title, f"{'metric':<{width}}  " + "  ".join(f"{_when(t):>11}" for t in times)]
        for metric in sorted(by_metric):
            values = by_metric[metric]
            cells = [f"{_value(values[t]) if t in values else '-':>11}" for t in times]
            lines.append(f"{metric:<{width}}  " + "  ".join(cells))
    return lines


def plot(rows: list[dict[str, Any]], metrics: list[str], title: str) -> bytes:
    """A PNG: one panel per metric, a line per node (and GPU) over time."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.dates import DateFormatter

    figure, axes = pyplot.subplots(len(metrics), 1, figsize=(10, 3.2 * len(metrics)), squeeze=False)
    for axis, metric in zip(axes[:, 0], metrics, strict=True):
        series: dict[str, list[tuple[float, float]]] = {}
        for row in rows:
            if row["metric"] == metric:
                name = row["host"] if row["gpu"] is None else f"{row['host']} gpu{row['gpu']}"
                series.setdefault(name, []).append((row["started_at"], row["value"]))
        for name, points in sorted(series.items())[:40]:  # a legend people can still read
            when = [datetime.fromtimestamp(t, timezone.utc) for t, _ in points]
            axis.plot(when, [v for _, v in points], marker=".", label=name)
        axis.set_title(metric)
        axis.xaxis.set_major_formatter(DateFormatter("%m-%d %H:%M"))
        if series:
            axis.legend(fontsize="x-small", ncol=4)
    figure.suptitle(title)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    pyplot.close(figure)
    return buffer.getvalue()


def trends_png(store: Store, since: float) -> bytes | None:
    """The nightly report's trend plot of the key metrics the store has (None: none yet, or
    matplotlib is not installed)."""
    rows = store.series(since=since, among=KEY_METRICS)
    found = [m for m in KEY_METRICS if any(r["metric"] == m for r in rows)]
    if not found or len({r["started_at"] for r in rows}) < 2:
        return None
    try:
        return plot(rows, found, f"gpuhealth trends ({store.name})")
    except ModuleNotFoundError:
        return None


def pin(store: Store, host: str, gpu: int | None, reason: str | None) -> int:
    """Record a pin of the host (or its GPU at index `gpu` in its latest night, followed by
    serial from then on): its reference baselines restart from its next night."""
    key = None
    if gpu is not None:
        found = store.latest_gpus(host).get(gpu)
        key = gpu_key(found) if found else None
        if key is None:
            print(
                f"gpuhealth history pin: {host} had no gpu{gpu} with a serial or UUID in its "
                f"latest night in {store.name}"
            )
            return 2
    elif not store.host_history(host, 1):
        print(f"gpuhealth history pin: {host} has no night in {store.name}")
        return 2
    store.pin(host, gpu, key, time.time(), reason or "")
    what = f"{host} gpu{gpu} ({key})" if key else f"{host} (the node and its GPUs)"
    print(f"pinned {what}: its reference baselines restart from its next night")
    return 0


def run(args: argparse.Namespace) -> int:
    """`gpuhealth history`: a table (or --plot) of measured values, `prune --keep`, or `pin`."""
    pruning = args.target == "prune" and not args.host
    pinning = args.target == "pin" and not args.host
    if pruning and args.keep is None:
        print("gpuhealth history prune: --keep SPAN is required, e.g. 90d")
        return 2
    if pinning and not args.name:
        print("gpuhealth history pin: name the host, e.g. gpuhealth history pin node17 --gpu 3")
        return 2
    missing = missing_store(args.history, Path.cwd())
    if missing is not None:
        print(f"gpuhealth history: no run store at {missing} (--history names the store)")
        return 2
    host = args.host or (None if pruning else args.target)
    try:
        store = Store(args.history)
        if pinning:
            return pin(store, args.name, args.gpu, args.reason)
        if pruning:
            gone = store.prune(time.time() - args.keep)
            print(f"pruned {gone} runs older than {args.keep / 86400:g} days from {store.name}")
            return 0
        since = time.time() - args.since if args.since else None
        rows = store.series(host=host, gpu=args.gpu, metric=args.metric, since=since)
        if args.plot:
            metrics = (
                sorted({r["metric"] for r in rows})
                if args.metric
                else [m for m in KEY_METRICS if any(r["metric"] == m for r in rows)]
            )
            if not metrics:
                print("gpuhealth history: nothing to plot", flush=True)
                return 1
            args.plot.write_bytes(plot(rows, metrics[:6], f"gpuhealth history ({store.name})"))
            print(f"plot written to {args.plot}")
            return 0
        runs = store.runs(since)
    except StoreError as exc:
        print(f"gpuhealth history: {exc}")
        return 2
    except ModuleNotFoundError as exc:
        print(f"gpuhealth history: --plot needs {exc.name}: pip install 'gpuhealth[plot]'")
        return 2
    if not rows:
        print(f"no measurements in {store.name} for this selection")
    for line in tables(rows, args.last):
        print(line)
    print(f"\n{len(runs)} runs in {store.name}:")
    for found in runs[-args.last :]:
        verdicts: dict[str, int] = {}
        for verdict in found["nodes"].values():
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
        counts = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
        state = "" if found["complete"] else " (incomplete)"
        if found["rejudged"]:
            nights = sorted({_when(at) for at in found["rejudged"].values()})
            state += f" (judged again: {len(found['rejudged'])} hosts of {', '.join(nights)})"
        print(
            f"  {_when(found['started_at'])}  {found['level']:<8} {counts}; "
            f"{len(found['regressions'])} regressions{state}"
        )
        for entry in found["regressions"]:
            print(f"    {entry['message']}")
    return 0


def add_parser(sub: Any) -> None:
    """The `history` subcommand of `gpuhealth`."""
    parser = sub.add_parser(
        "history",
        help="measured values over time from the run store; `prune --keep 90d`; "
        "`pin HOST [--gpu N]` after a repair",
    )
    parser.add_argument(
        "target", nargs="?", metavar="HOST|prune|pin", help="one host, prune, or pin"
    )
    parser.add_argument("name", nargs="?", metavar="HOST", help="pin: the host to pin")
    parser.add_argument("--host", help="one host (when it is named `prune` or `pin`)")
    parser.add_argument("--reason", help="pin: why (kept in the store), e.g. 'fan replaced'")
    parser.add_argument("--gpu", type=int, metavar="N", help="one GPU index")
    parser.add_argument("--metric", metavar="M", help="one metric (a * glob: 'ib.*')")
    parser.add_argument("--since", type=span_seconds, metavar="SPAN", help="e.g. 30d, 12h, 2w")
    parser.add_argument("--last", type=int, default=8, help="runs per table (default 8)")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="write a plot instead")
    parser.add_argument("--keep", type=span_seconds, metavar="SPAN", help="prune: keep this span")
    parser.add_argument(
        "--history",
        default=DEFAULT_STORE,
        metavar="PATH|URL",
        help=f"the run store (default {DEFAULT_STORE})",
    )
    parser.set_defaults(func=run)
