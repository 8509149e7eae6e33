"""`gpuhealth history`: the morning answer (`regressions`), a node's values one line per metric,
the fleet's runs, trend plots, pruning, and `pin` (after a repair, a node's or GPU's drift
baselines restart from its next night).

It reads a store and never creates one: a path that names none is a usage error, and so is a
host the store has no night of or a subcommand it does not know (both named in the message).
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import json
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from gpuhealth.families.history import metrics
from gpuhealth.history import morning, plots
from gpuhealth.history.morning import COUNTER_RULES, DRIFT_RULES, Summary, number, stamp
from gpuhealth.history.run import DEFAULT_STORE, POLICIES, missing_store
from gpuhealth.history.store import Store, StoreError, describe, engine_url

SUBCOMMANDS = ("regressions", "prune", "pin")
EXIT_OK, EXIT_REGRESSED, EXIT_USAGE = 0, 1, 2
# Re-exported for the Allure report's trend attachment (sinks/allure.py).
trends_png = plots.trends_png
KEY_METRICS = plots.KEY_METRICS


class UsageError(Exception):
    """What the user asked for cannot be answered as asked; the message says why."""


def span_seconds(text: str) -> float:
    """`90d`, `12h`, `2w` as seconds (argparse's type for --keep)."""
    seconds = morning.span_seconds(text)
    if seconds is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a span like 90d, 12h or 2w")
    return seconds


def since_epoch(text: str) -> float:
    """argparse's type for --since: a span back from now or a UTC date or time."""
    try:
        return morning.parse_since(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# ------------------------------------------------------------------ tables


def tables(rows: list[dict[str, Any]], last: int | None) -> list[str]:
    """The detail view (`--last N`, `--all`): one table per node and GPU, a line per metric,
    a column per night (the last `last`, all with None)."""
    # A GPU's table is its serial's: a swapped GPU's values never share its predecessor's.
    groups: dict[tuple[str, int | None, str], dict[str, dict[float, float]]] = {}
    for row in rows:
        key = (row["host"], row["gpu"], row["gpu_key"] or "?")
        groups.setdefault(key, {}).setdefault(row["metric"], {})[row["started_at"]] = row["value"]
    lines: list[str] = []
    order = sorted(groups.items(), key=lambda kv: (kv[0][0], -1 if kv[0][1] is None else kv[0][1]))
    for (host, gpu, serial), by_metric in order:
        times = sorted({t for values in by_metric.values() for t in values})
        times = times if last is None else times[-last:]
        title = host if gpu is None else f"{host} gpu{gpu} ({serial})"
        width = max(len(m) for m in by_metric)
        header = "  ".join(f"{time.strftime('%m-%d %H:%M:%S', time.gmtime(t)):>14}" for t in times)
        lines += ["", title, f"{'metric':<{width}}  {header}"]
        for metric in sorted(by_metric):
            values = by_metric[metric]
            if morning.lookup(metric) is None:  # where a log reading ended: a time
                cells = [f"{_clock(values.get(t)):>14}" for t in times]
            else:
                cells = [f"{number(values[t]) if t in values else '-':>14}" for t in times]
            lines.append(f"{metric:<{width}}  " + "  ".join(cells))
    return lines


def _clock(epoch: float | None) -> str:
    return "-" if epoch is None else time.strftime("%m-%d %H:%M:%S", time.gmtime(epoch))


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return number(low) if low == high else f"{number(low)}..{number(high)}"


def _who(summary: Summary, pattern: str) -> str:
    """The subject: a GPU (index and serial), a port (`mlx5_0.1` of `ib.*.symbol_error`), or
    the node."""
    if summary.gpu is not None:
        return f"gpu{summary.gpu}" + (f" {summary.serial}" if summary.serial else "")
    if summary.metric != pattern:
        head, _, tail = pattern.partition("*")
        return summary.metric.removeprefix(head).removesuffix(tail)
    return "node"


def _badness(summary: Summary, rule: str) -> float:
    """How far a GPU's latest value is from its reference the rule's way (for `worst`)."""
    if rule in COUNTER_RULES:
        return summary.last or 0.0
    base = summary.reference if summary.reference is not None else summary.latest
    if rule == "drop":
        return (base - summary.latest) / base if base else 0.0
    if rule == "rise":
        return summary.latest - base
    return (summary.latest - base) / base if base else 0.0


def metric_lines(summaries: list[Summary]) -> list[str]:
    """One line per metric (the node's, or its GPUs' or ports' summarised with the worst one
    named), and the counters that grew nowhere in one line."""
    by_metric: dict[str, list[Summary]] = {}
    for summary in summaries:
        m = morning.lookup(summary.metric)
        by_metric.setdefault(m.name if m else summary.metric, []).append(summary)
    rows, still = [], []
    for name, found in sorted(by_metric.items()):
        m = morning.lookup(found[0].metric)
        rule = m.rule if m else "growth"
        if rule in COUNTER_RULES and not any(s.growth or s.last for s in found):
            still.append(name)
            continue
        bad = max(found, key=lambda s: _badness(s, rule))
        label = f"{name} [{m.unit}]" if m and m.unit else name
        kind = "GPUs" if bad.gpu is not None else "ports"
        who = "node" if _who(bad, name) == "node" else f"{len(found)} {kind}"
        latest = _span([s.latest for s in found])
        if rule in DRIFT_RULES:
            refs = [s.reference for s in found if s.reference is not None]
            rolls = [s.rolling for s in found if s.rolling is not None]
            detail = (
                f"reference {_span(refs) if refs else '-'}, "
                f"rolling {_span(rolls) if rolls else '-'}"
            )
            trend = "-"
            if bad.slope is not None:
                trend = f"{bad.slope:+.2f}{' ' + m.unit if m and m.unit else ''}/run"
            worst = (
                f"{_who(bad, name)}: {number(bad.latest)} (reference {number(bad.reference)}, "
                f"rolling {number(bad.rolling)}, trend {trend})"
            )
        else:
            last = "a day, last" if rule == "rate" else "last night"
            detail = f"+{number(bad.last)} {last}; +{number(bad.growth)} over the nights"
            worst = _who(bad, name)
        rows.append((label, who, latest, detail, worst))
    lines = []
    if rows:
        header = ("metric", "of", "latest", "baselines / growth", "worst")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
        for row in [header, *rows]:
            lines.append(
                "  ".join([*(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)), row[4]])
            )
    if still:
        lines.append(f"no growth over the nights shown: {', '.join(still)}")
    return lines


# ------------------------------------------------------------------ views


def _open(spec: str) -> Store:
    """The store `--history` names, which must exist: a SQLite file, or a database that holds
    gpuhealth's tables (opening a store migrates it, which would create them)."""
    missing = missing_store(spec, Path.cwd())
    if missing is not None:
        raise UsageError(
            f"--history {spec}: no run store at {missing} (reading never creates one; the "
            "suite's --history-create starts one)"
        )
    url = engine_url(spec, Path.cwd())
    if not url.startswith("sqlite:"):
        try:
            engine = sa.create_engine(url)
            try:
                with engine.connect() as conn:
                    found = sa.inspect(conn).has_table("runs")
            finally:
                engine.dispose()
        except SQLAlchemyError as exc:
            said = str(getattr(exc, "orig", None) or exc).strip().splitlines()
            raise StoreError(f"history store {describe(url)}: {said[0] if said else exc}") from None
        except ModuleNotFoundError as exc:
            raise StoreError(
                f"history store {describe(url)}: the driver is not installed ({exc.name}); "
                "for PostgreSQL: pip install 'gpuhealth[postgresql]'"
            ) from None
        if not found:
            raise UsageError(
                f"--history {describe(url)}: the database holds no run store (no gpuhealth "
                "tables; reading never creates them, the suite's first run does)"
            )
    return Store(spec)


def _known_host(store: Store, host: str) -> None:
    """A usage error naming the subcommands and the store's hosts (the closest first) when
    `host` has no night in the store."""
    known = morning.hosts(store)
    if host in known:
        return
    close = difflib.get_close_matches(host, known, n=5)
    listed = close or known[:10]
    more = f" (of {len(known)})" if len(listed) < len(known) else ""
    hosts = "the store has no host yet"
    if known:
        hosts = f"hosts{' like it' if close else ''}: {', '.join(listed)}{more}"
    raise UsageError(
        f"{host!r} is neither a subcommand ({', '.join(SUBCOMMANDS)}) nor a host in "
        f"{store.name}; {hosts}"
    )


def show_regressions(store: Store, args: argparse.Namespace) -> int:
    """The morning answer: every regression of the last run (or since a time), exit 1 when
    there are some under the fail policy."""
    scope = morning.scope_of(store, args.since)
    if scope is None:
        when = f"since {stamp(args.since)} UTC" if args.since is not None else "at all"
        raise UsageError(
            f"no complete run {when} in {store.name}: nothing was judged, so no answer"
        )
    found = morning.regressions(store, scope)
    regressed = len(found) > 0 and args.regressions == "fail"
    if args.json:
        print(json.dumps(morning.document(store, scope, found, args.regressions), indent=2))
        return EXIT_REGRESSED if regressed else EXIT_OK
    nodes = len({r.host for r in found})
    print(
        f"{len(found)} regressions on {nodes} of {scope.nodes} nodes judged in {scope.text} "
        f"({store.name})"
    )
    for line in morning.table(found) if found else []:
        print(line)
    return EXIT_REGRESSED if regressed else EXIT_OK


def show_host(store: Store, host: str, args: argparse.Namespace) -> int:
    """A node: its regressions first, then one line per metric; tables with --last/--all."""
    nights = morning.host_nights(store, host, args.since)
    recent = store.host_history(host, args.last or 8, node_id=store.machine_of(host))
    if not nights.points:
        print(f"{host}: no measurements in {store.name} for this selection")
    else:
        stamps = sorted({p.night for series in nights.points.values() for p in series})
        print(
            f"{host}: {len(stamps)} nights measured, {stamp(stamps[0])} .. {stamp(stamps[-1])} "
            f"UTC; profile {nights.profile or '?'}; {store.name}"
        )
    for name, until in store.other_names(host):  # the same machine under its earlier names
        print(f"{host} was {name} until {stamp(until)} UTC (gpuhealth history {name})")
    since = args.since if args.since is not None else (recent[-1]["at"] if recent else None)
    scope = morning.Scope("", 0, since=since or 0.0)
    found = [
        r
        for r in morning.regressions(store, scope, host=host)
        if args.gpu is None or r.gpu == args.gpu
    ]
    print(f"\nregressions since {stamp(since)} UTC: {len(found) or 'none'}")
    for line in morning.table(found) if found else []:
        print(f"  {line}")
    selected = _select(nights, args)
    if selected.points:
        print("")
        for line in metric_lines(morning.summarise(selected, morning.Limits().of(nights.profile))):
            print(line)
    print(f"\nits last {len(recent)} nights:")
    for night in recent:
        print(
            f"  {stamp(night['at'])}  run {night['run'][:8]}  {night['verdict']:<5}  "
            f"{night['regressions']} regressions"
        )
    if args.last or args.all:
        rows = store.series(host=host, gpu=args.gpu, metric=args.metric, since=args.since)
        for line in tables(rows, None if args.all else args.last):
            print(line)
    return EXIT_OK


def _select(nights: morning.HostNights, args: argparse.Namespace) -> morning.HostNights:
    """The subjects `--gpu` and `--metric` select."""
    kept = {
        subject: series
        for subject, series in nights.points.items()
        if (args.gpu is None or series[-1].gpu == args.gpu)
        and (args.metric is None or fnmatch.fnmatchcase(subject[0], args.metric))
    }
    return morning.HostNights(nights.host, nights.profile, kept, nights.node_pins, nights.gpu_pins)


def show_runs(store: Store, args: argparse.Namespace) -> int:
    """The fleet: its hosts and its last runs (run id, time to the second, group)."""
    runs = store.runs(args.since)
    shown = runs if args.all else runs[-(args.last or 8) :]
    print(
        f"{len(morning.hosts(store))} hosts, {len(runs)} runs in {store.name}; last {len(shown)}:"
    )
    for found in shown:
        verdicts: dict[str, int] = {}
        for verdict in found["nodes"].values():
            verdicts[verdict] = verdicts.get(verdict, 0) + 1
        counts = ", ".join(f"{n} {v}" for v, n in sorted(verdicts.items()))
        state = "" if found["complete"] else " (incomplete)"
        if found["rejudged"]:
            nights = sorted({stamp(at) for at in found["rejudged"].values()})
            state += f" (judged again: {len(found['rejudged'])} hosts of {', '.join(nights)})"
        group = f"  {found['inventory']}" if found["inventory"] else ""
        print(
            f"  {stamp(found['started_at'])}  run {found['uid'][:8]}  {found['level']:<8} "
            f"{counts}; {len(found['regressions'])} regressions{state}{group}"
        )
    print(
        "\ngpuhealth history regressions: what regressed in the last run; "
        "gpuhealth history HOST: one node"
    )
    return EXIT_OK


def draw(store: Store, host: str | None, args: argparse.Namespace) -> int:
    """--plot: the fleet's (or one host's) key metrics, or those --metric selects."""
    wanted = plots.names_like(store, args.metric) if args.metric else list(KEY_METRICS)
    rows = plots.values(store, wanted, args.since, host, args.gpu)
    names = [name for name in (KEY_METRICS if not args.metric else sorted(rows)) if rows.get(name)]
    if not names:
        raise UsageError("nothing to plot for this selection")
    if len(names) > 6:
        print(f"plotting the first 6 of {len(names)} metrics: {', '.join(names[6:])} left out")
        names = names[:6]
    regressed = plots.regressed_nights(store, args.since, host)
    made = plots.figure(rows, regressed, names, f"gpuhealth history ({host or store.name})")
    try:
        args.plot.write_bytes(plots.png(made))
    except OSError as exc:  # a typo'd folder is the user's, not a gpuhealth bug (exit 3)
        raise UsageError(f"--plot {args.plot}: cannot write it: {exc.strerror or exc}") from None
    print(f"plot written to {args.plot}")
    return EXIT_OK


def pin(store: Store, host: str, gpu: int | None, reason: str | None) -> int:
    """Record a pin of the host (or its GPU at index `gpu` in its latest night, followed by
    serial from then on): its reference baselines restart from its next night."""
    _known_host(store, host)
    key = None
    if gpu is not None:
        found = store.latest_gpus(host).get(gpu)
        key = metrics.gpu_key(found) if found else None
        if key is None:
            raise UsageError(
                f"pin: {host} had no gpu{gpu} with a serial or UUID in its latest night in "
                f"{store.name}"
            )
    store.pin(host, gpu, key, time.time(), reason or "")
    what = f"{host} gpu{gpu} ({key})" if key else f"{host} (the node and its GPUs)"
    print(f"pinned {what}: its reference baselines restart from its next night")
    return EXIT_OK


def _dispatch(store: Store, args: argparse.Namespace) -> int:
    target = args.target
    if target == "regressions":
        if args.last_run and args.since is not None:
            raise UsageError("regressions: --last-run or --since, not both")
        return show_regressions(store, args)
    if target == "prune":
        gone = store.prune(time.time() - args.keep)
        print(f"pruned {gone} runs older than {args.keep / 86400:g} days from {store.name}")
        return EXIT_OK
    if target == "pin":
        return pin(store, args.name, args.gpu, args.reason)
    host = args.host or target
    if host is not None:
        _known_host(store, host)
    if args.plot:
        return draw(store, host, args)
    return show_host(store, host, args) if host else show_runs(store, args)


def run(args: argparse.Namespace) -> int:
    """`gpuhealth history`: exit 0, 1 (regressions under the fail policy), 2 (usage)."""
    try:
        if args.target == "prune" and args.keep is None:
            raise UsageError("prune: --keep SPAN is required, e.g. 90d")
        if args.target == "pin" and not args.name:
            raise UsageError("pin: name the host, e.g. gpuhealth history pin node17 --gpu 3")
        if (args.json or args.last_run) and args.target != "regressions":
            raise UsageError("--json and --last-run go with `regressions`")
        if args.name and args.target != "pin":
            raise UsageError(f"unexpected {args.name!r}: only pin takes a second name")
        store = _open(args.history)
        try:
            return _dispatch(store, args)
        finally:
            store.close()
    except UsageError as exc:
        print(f"gpuhealth history: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StoreError as exc:
        print(f"gpuhealth history: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ModuleNotFoundError as exc:
        print(
            f"gpuhealth history: --plot needs {exc.name}: pip install 'gpuhealth[plot]'",
            file=sys.stderr,
        )
        return EXIT_USAGE


def _at_least(least: int) -> Any:
    """An argparse type: a whole number >= `least` (`--last -1` read every night but the
    newest through a negative slice, `--last 0` the default 8, `--gpu -1` no GPU)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= {least}")
        return value

    return parse


def add_parser(sub: Any) -> None:
    """The `history` subcommand of `gpuhealth`."""
    parser = sub.add_parser(
        "history",
        allow_abbrev=False,
        help="the run store: `regressions` (what regressed in the last run), a node's values, "
        "plots; `prune --keep 90d`; `pin HOST [--gpu N]` after a repair",
        description="With no HOST: the fleet's last runs. `regressions`: what regressed in the "
        "last run (or --since), one line each; exit 1 when there are some (--regressions "
        "fail). HOST: its regressions, then one line per metric (--last N, --all: per night).",
    )
    parser.add_argument(
        "target",
        nargs="?",
        metavar="regressions|HOST|prune|pin",
        help="what regressed, one host, prune, or pin",
    )
    parser.add_argument("name", nargs="?", metavar="HOST", help="pin: the host to pin")
    parser.add_argument("--host", help="one host (when it is named like a subcommand)")
    parser.add_argument("--reason", help="pin: why (kept in the store), e.g. 'fan replaced'")
    parser.add_argument("--gpu", type=_at_least(0), metavar="N", help="one GPU index")
    parser.add_argument("--metric", metavar="M", help="one metric (a * glob: 'ib.*')")
    parser.add_argument(
        "--since",
        type=since_epoch,
        metavar="TIME",
        help="nights since a span ago (36h, 7d, 2w) or a UTC date or time (2026-11-26T02:00); "
        "regressions: instead of the last night's runs",
    )
    parser.add_argument(
        "--last-run",
        action="store_true",
        help="regressions: the last night's runs, the newest and those that started up to 12 h "
        "before it (shards, CI groups); the default without --since",
    )
    parser.add_argument(
        "--regressions",
        choices=POLICIES,
        default="fail",
        help="regressions: exit 1 when there are some (fail, default) or 0 (warn), as the "
        "suite's --regressions",
    )
    parser.add_argument("--json", action="store_true", help="regressions: as JSON")
    parser.add_argument(
        "--last",
        type=_at_least(1),
        metavar="N",
        help="HOST: a table of its last N nights; no HOST: the last N runs (8)",
    )
    parser.add_argument("--all", action="store_true", help="HOST: a table of every night")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="write a plot instead")
    parser.add_argument(
        "--keep", type=span_seconds, metavar="SPAN", help="prune: keep this span (90d)"
    )
    parser.add_argument(
        "--history",
        default=DEFAULT_STORE,
        metavar="PATH|URL",
        help=f"the run store (default {DEFAULT_STORE}); never created by reading",
    )
    parser.set_defaults(func=run)
