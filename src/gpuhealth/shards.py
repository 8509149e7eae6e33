"""Split a fleet across CI jobs (`pytest --shard K/N`) and merge the jobs' reports back into
one (`gpuhealth merge OUT DIR...`).

One pytest process holds about 1 MB per node, so 10,000 nodes are judged as N jobs of a few
thousand each. A host's shard comes from a hash of its name, not from its place in the host
list: jobs that start at different times agree on every host even if the inventory changed
in between (a host added or removed moves no other host to another shard).

The merge is file-level: it reads what each shard wrote (verdicts.json, JUnit XML, Allure
results, saved facts), so shards may run on different machines and be merged anywhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from gpuhealth import report as reporting
from gpuhealth.allure_results import AllureResults
from gpuhealth.config import ConfigError
from gpuhealth.integrations.verdicts import VerdictsError
from gpuhealth.integrations.verdicts import load as load_verdicts
from gpuhealth.junit_results import attribute

T = TypeVar("T")
Hosts = dict[Path, set[str]]  # a shard's folder -> the hosts it judged

# What a shard's report folder holds, under these names (those of `reports/` by default);
# the merged report is written under the same names.
VERDICTS, JUNIT, ALLURE, FACTS = "verdicts.json", "junit.xml", "allure-results", "facts"
# Allure files that describe the whole run: written again for the merged fleet.
_ALLURE_RUN_FILES = ("categories.json", "environment.properties")


@dataclass(frozen=True)
class Shard:
    """Shard `index` (1-based) of `count`."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """`K/N` with 1 <= K <= N, else ConfigError."""
        index, slash, count = text.partition("/")
        try:
            shard = cls(int(index), int(count))
        except ValueError:
            shard = None
        if not slash or shard is None or not 1 <= shard.index <= shard.count:
            raise ConfigError(f"--shard {text}: give K/N with 1 <= K <= N (e.g. 2/8)")
        return shard

    def holds(self, host: str) -> bool:
        """Whether `host` is judged in this shard: every host is in exactly one of the N."""
        digest = hashlib.sha256(host.encode()).digest()
        return int.from_bytes(digest[:8], "big") % self.count == self.index - 1

    def select(self, items: Sequence[T], name_of: Callable[[T], str]) -> list[T]:
        """The items (targets) whose host name, `name_of(item)`, this shard holds."""
        return [item for item in items if self.holds(name_of(item))]


class MergeError(Exception):
    """The shards' reports cannot make one fleet's report (the message says which and why)."""


def _present(dirs: list[Path], name: str) -> bool:
    """Whether every shard has `name`; MergeError when only some do (the merged report would
    silently lack those shards' part)."""
    have = [d for d in dirs if (d / name).exists()]
    if have and len(have) < len(dirs):
        missing = ", ".join(str(d) for d in dirs if d not in have)
        raise MergeError(f"{name} is in some shards' folders but not in {missing}")
    return bool(have)


# ---------------------------------------------------------------- verdicts.json


def _node_verdict(path: Path, host: str, entry: dict[str, Any]) -> reporting.NodeVerdict:
    """A node's entry as the verdict it was written from: the same fields or MergeError (a
    shard written by another gpuhealth version would lose or invent fields)."""
    known = {f.name for f in fields(reporting.NodeVerdict)} - {"host"}
    if set(entry) != known:
        odd = ", ".join(sorted(set(entry) ^ known))
        raise MergeError(
            f"{path}: node {host!r} is not the entry this gpuhealth writes (fields {odd}): "
            "merge the shards with the gpuhealth version that ran them"
        )
    return reporting.NodeVerdict(host=host, **entry)


# The run-level fields of a verdicts.json the merge reads, and the types a run writes them as.
_RUN_FIELDS = {"shard": str, "source": str, "hosts": list, "history": dict}


def _run_fields(path: Path, doc: dict[str, Any]) -> None:
    """MergeError where a run-level field is not what a run writes (a hand-edited or foreign
    file): the merge would otherwise stop on it with a traceback."""
    for name, kind in _RUN_FIELDS.items():
        value = doc.get(name)
        if value is not None and not isinstance(value, kind):
            raise MergeError(f"{path}: {name!r} is not a {kind.__name__} ({value!r:.60})")
    if not all(isinstance(host, str) for host in doc.get("hosts") or []):
        raise MergeError(f"{path}: 'hosts' is not a list of host names")


def merge_verdicts(dirs: list[Path], out: Path) -> tuple[list[reporting.NodeVerdict], Hosts]:
    """One verdicts.json for the fleet: every shard's nodes (a host in two shards is an
    error), the worst verdict overall, complete only if every shard was. `history` names
    the store and each shard's run in it (each shard records its own run). Also each
    shard's hosts."""
    verdicts: list[reporting.NodeVerdict] = []
    seen: dict[str, Path] = {}
    hosts: Hosts = {}
    labels: dict[Path, str | None] = {}
    sources, stores, runs, complete = set(), set(), [], True
    for folder in dirs:
        path = folder / VERDICTS
        try:
            load_verdicts(path)  # validated as `gpuhealth act` validates it
            doc = json.loads(path.read_text())
        except VerdictsError as exc:
            raise MergeError(str(exc)) from None
        _run_fields(path, doc)
        for host, entry in doc["nodes"].items():
            if host in seen:
                raise MergeError(f"host {host} is in {seen[host]} and in {path}: shards overlap")
            seen[host] = path
            verdicts.append(_node_verdict(path, host, entry))
        hosts[folder] = set(doc.get("hosts") or []) | set(doc["nodes"])
        labels[folder] = doc.get("shard")
        sources.add(doc.get("source"))
        history = doc.get("history") or {}
        stores.add(history.get("store"))
        runs.append(history.get("run"))
        complete = complete and doc.get("complete") is True
    if len(sources) > 1:
        raise MergeError(f"the shards come from different sources: {sorted(map(str, sources))}")
    _all_shards(labels)
    verdicts.sort(key=lambda v: (-reporting.ORDER[v.verdict], v.host))
    extra = {
        "hosts": sorted(set().union(*hosts.values())),
        "source": sources.pop(),
        "complete": complete,
        "history": {
            "store": stores.pop() if len(stores) == 1 else sorted(map(str, stores)),
            "runs": runs,
        },
        "shards": [str(d) for d in dirs],
    }
    reporting.VerdictDocument(verdicts, run=extra).write(out / VERDICTS)
    return verdicts, hosts


def _all_shards(labels: dict[Path, str | None]) -> None:
    """Runs with `--shard K/N` say so in their verdicts.json: then each of the N must be
    there exactly once (a missing one would leave its hosts out of the fleet's report
    without a word). Folders of runs split another way (by inventory group) say nothing."""
    named = {folder: label for folder, label in labels.items() if label is not None}
    if not named:
        return
    if len(named) < len(labels):
        plain = ", ".join(str(f) for f in labels if f not in named)
        raise MergeError(f"{plain}: not a run with --shard, unlike the other folders")
    try:
        shards = {folder: Shard.parse(label) for folder, label in named.items()}
    except ConfigError as exc:
        raise MergeError(str(exc)) from None
    counts = {shard.count for shard in shards.values()}
    if len(counts) > 1:
        raise MergeError(f"the shards split the fleet in different numbers: {sorted(counts)}")
    count = counts.pop()
    for index in range(1, count + 1):
        given = [str(f) for f, shard in shards.items() if shard.index == index]
        if not given:
            raise MergeError(f"shard {index}/{count} is missing: give every shard's folder")
        if len(given) > 1:
            raise MergeError(f"shard {index}/{count} is given twice: {', '.join(given)}")


# ---------------------------------------------------------------- fleet-level tests

# pytest's id of a test parametrized over no hosts: a shard that holds none has one per test.
_NO_HOSTS = "[NOTSET]"


def _of_no_host(name: str, fleet_has_hosts: bool) -> bool:
    """Whether a test case is a shard's stand-in for a host-level test it had no hosts for:
    left out of the merge unless no shard had any (the unsharded run of the fleet has them
    then, and only then)."""
    return fleet_has_hosts and name.endswith(_NO_HOSTS)


def _of_a_host(param: str, hosts: set[str]) -> bool:
    """Whether a test id's parameters (`n17`, `n17-gpu3`) start with one of the hosts."""
    parts = param.split("-")
    return any("-".join(parts[: i + 1]) in hosts for i in range(len(parts)))


@dataclass
class _FleetLevel:
    """The tests that are no host's (multi-node NCCL over the run's hosts): every shard runs
    its own. A test every shard ended alike (one no shard ran) is kept once, as the unsharded
    run has it; where shards differ each shard's is kept, named after its folder."""

    copies: dict[str, list[tuple[Path, Any, Any]]] = field(default_factory=dict)

    def add(self, key: str, folder: Path, outcome: Any, item: Any) -> None:
        self.copies.setdefault(key, []).append((folder, outcome, item))

    def kept(self) -> Iterator[tuple[Any, str | None]]:
        """(item, the folder to name it after, or None)."""
        for found in self.copies.values():
            if len({repr(outcome) for _, outcome, _ in found}) == 1:
                yield found[0][2], None
            else:
                yield from ((item, str(folder)) for folder, _, item in found)


# ---------------------------------------------------------------- JUnit XML


def _suite_of(path: Path) -> dict[str, str]:
    """The attributes of the file's (one) testsuite, read without reading its test cases."""
    try:
        for _, element in ET.iterparse(path, events=("start",)):
            if element.tag == "testsuite":
                return dict(element.attrib)
    except ET.ParseError as exc:
        raise MergeError(f"{path}: not JUnit XML: {exc}") from None
    raise MergeError(f"{path}: no <testsuite> in it")


def _cases(path: Path) -> Iterator[ET.Element]:
    """The file's test cases one at a time, each freed once the next is read: a fleet's
    file holds hundreds of thousands."""
    parent: ET.Element | None = None
    try:
        for event, element in ET.iterparse(path, events=("start", "end")):
            if event == "start" and element.tag == "testsuite":
                parent = element
            elif event == "end" and element.tag == "testcase":
                element.tail = None
                yield element
                if parent is not None:
                    parent.remove(element)
    except ET.ParseError as exc:
        raise MergeError(f"{path}: not JUnit XML: {exc}") from None


_KINDS = {"failure": "failures", "error": "errors", "skipped": "skipped"}


def merge_junit(dirs: list[Path], out: Path, hosts: Hosts) -> None:
    """One JUnit XML with every shard's test cases in one testsuite: the earliest start, the
    longest shard's time (the shards run side by side), fleet-level tests as _FleetLevel
    says."""
    suites = [_suite_of(d / JUNIT) for d in dirs]
    names = {s.get("name", "") for s in suites}
    if len(names) > 1:
        raise MergeError(f"the shards' JUnit suites differ in name: {sorted(names)}")
    counts = {"errors": 0, "failures": 0, "skipped": 0, "tests": 0}
    fleet = _FleetLevel()
    with tempfile.TemporaryFile("w+b", dir=out) as spool:

        def put(case: ET.Element) -> None:
            counts["tests"] += 1
            for child in case:
                if child.tag in _KINDS:
                    counts[_KINDS[child.tag]] += 1
            spool.write(ET.tostring(case, encoding="utf-8"))

        fleet_has_hosts = any(hosts.values())
        for folder in dirs:
            for case in _cases(folder / JUNIT):
                name = case.get("name", "")
                if _of_no_host(name, fleet_has_hosts):
                    continue
                if _of_a_host(name.partition("[")[2].removesuffix("]"), hosts[folder]):
                    put(case)
                    continue
                outcome = [(c.tag, c.get("message"), c.text) for c in case]
                fleet.add(f"{case.get('classname')}::{name}", folder, outcome, case)
        for case, shard in fleet.kept():
            if shard is not None:
                case.set("name", f"{case.get('name')} ({shard})")
            put(case)
        hostnames = ",".join(sorted({s.get("hostname", "") for s in suites} - {""}))
        head = (
            '<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">'
            f'<testsuite name="{attribute(names.pop())}" '
            + " ".join(f'{k}="{v}"' for k, v in counts.items())
            + f' time="{max(float(s.get("time", 0)) for s in suites):.3f}"'
            f' timestamp="{min(s.get("timestamp", "") for s in suites)}"'
            f' hostname="{attribute(hostnames)}">'
        )
        target = out / JUNIT
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as handle:
            handle.write(head.encode())
            spool.seek(0)
            shutil.copyfileobj(spool, handle)
            handle.write(b"</testsuite></testsuites>\n")
        tmp.replace(target)


# ---------------------------------------------------------------- Allure results


def _place(source: Path, target: Path) -> None:
    """`source` at `target`: a hard link where both are on one filesystem, else a copy."""
    if target.exists():
        raise MergeError(f"{target.name} is in two shards' {target.parent.name}")
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _environment(path: Path) -> dict[str, str]:
    """The `key=value` lines of an environment.properties (keys as written, escapes kept)."""
    if not path.is_file():
        return {}
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """MergeError naming `path` where it is not what Allure writes (a shard's job cut off
    while writing it), instead of a traceback."""
    try:
        yield
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise MergeError(f"{path}: not what Allure writes ({type(exc).__name__}: {exc})") from None


# How a result of a host's test starts its host label (allure_results writes labels so).
_HOST_LABEL = b'{"name": "host", "value": '


def _copy_results(source: Path, target: Path, fleet: _FleetLevel, fleet_has_hosts: bool) -> None:
    """A shard's test results and attachments into `target`, but for the run's own files
    (categories, environment, globals and their pages), fleet-level results (`fleet`) and
    stand-ins of tests the shard had no hosts for (_of_no_host)."""
    skip = set(_ALLURE_RUN_FILES)
    for found in source.glob("*-globals.json"):
        skip.add(found.name)
        with _reading(found):
            skip.update(page["source"] for page in json.loads(found.read_text())["attachments"])
    for item in source.iterdir():
        if item.name in skip or not item.is_file():
            continue
        if item.name.endswith("-result.json"):
            body = item.read_bytes()
            if _HOST_LABEL not in body:
                with _reading(item):
                    result = json.loads(body)
                    if _of_no_host(result["name"], fleet_has_hosts):
                        continue
                    details = result.get("statusDetails", {})
                    outcome = (result["status"], details.get("message"))
                    fleet.add(result["historyId"], source.parent, outcome, result)
                continue
        _place(item, target / item.name)


def _trends(dirs: list[Path]) -> bytes | None:
    """The history trend plot of the last shard to finish (drawn from the store then, it
    holds every shard that had finished before it), or None."""
    latest: tuple[int, Path] | None = None
    for folder in dirs:
        for found in (folder / ALLURE).glob("*-globals.json"):
            with _reading(found):
                for page in json.loads(found.read_text())["attachments"]:
                    if page["type"] == "image/png" and (
                        latest is None or page["timestamp"] > latest[0]
                    ):
                        latest = (page["timestamp"], folder / ALLURE / page["source"])
    return latest[1].read_bytes() if latest else None


def merge_allure(dirs: list[Path], out: Path, verdicts: list[reporting.NodeVerdict]) -> None:
    """One Allure results folder: every shard's test results and attachments, fleet-level
    tests as _FleetLevel says, and the run's own files (categories, environment, fleet
    overview, trend plot) written again for the whole fleet."""
    target = out / ALLURE
    target.mkdir(parents=True, exist_ok=True)
    levels = {_environment(d / ALLURE / "environment.properties").get("level") for d in dirs}
    if len(levels) > 1:
        raise MergeError(f"the shards ran at different levels: {sorted(map(str, levels))}")
    fleet = _FleetLevel()
    for folder in dirs:
        _copy_results(folder / ALLURE, target, fleet, bool(verdicts))
    for result, shard in fleet.kept():
        if shard is not None:
            result["name"] = f"{result['name']} ({shard})"
            result["historyId"] = hashlib.md5(f"{result['historyId']}{shard}".encode()).hexdigest()
        (target / f"{result['uuid']}-result.json").write_text(json.dumps(result))
    results = AllureResults(target, clean=False, background=False)
    level = levels.pop()
    results.finish(
        [*reporting.FleetSummary.of(verdicts).metadata(), *([("level", level)] if level else [])],
        reporting.overview_html(verdicts, "gpuhealth fleet overview"),
        _trends(dirs),
    )
    problem = results.close()
    if problem:
        raise MergeError(f"Allure results not all written to {target}: {problem}")


# ---------------------------------------------------------------- facts and the command


def merge_facts(dirs: list[Path], out: Path) -> None:
    """Every shard's saved facts documents in one folder (one per host)."""
    target = out / FACTS
    target.mkdir(parents=True, exist_ok=True)
    for folder in dirs:
        for doc in sorted((folder / FACTS).glob("*.json")):
            _place(doc, target / doc.name)


def merge(out: Path, dirs: list[Path]) -> list[str]:
    """Merge the shards' report folders into `out`; what was merged, one line each."""
    for folder in dirs:
        if not (folder / VERDICTS).is_file():
            raise MergeError(f"{folder}: no {VERDICTS} (not a shard's report folder?)")
    if len(set(map(Path.resolve, dirs))) < len(dirs):
        raise MergeError("a shard's folder is named twice")
    if out.resolve() in map(Path.resolve, dirs):
        raise MergeError(f"{out} is one of the shards: merge into a new folder")
    if out.is_dir() and any(out.iterdir()):
        # an earlier merge's files would read as a second shard's ("in two shards' facts")
        raise MergeError(f"{out} is not empty (an earlier merge?): merge into a new folder")
    out.mkdir(parents=True, exist_ok=True)
    verdicts, hosts = merge_verdicts(dirs, out)
    done = [f"{VERDICTS}: {reporting.FleetSummary.of(verdicts).line}"]
    if _present(dirs, JUNIT):
        merge_junit(dirs, out, hosts)
        done.append(JUNIT)
    if _present(dirs, ALLURE):
        merge_allure(dirs, out, verdicts)
        done.append(ALLURE)
    if _present(dirs, FACTS):
        merge_facts(dirs, out)
        done.append(FACTS)
    return done


def _merge(args: argparse.Namespace) -> int:
    try:
        done = merge(Path(args.out), [Path(d) for d in args.dirs])
    except (MergeError, OSError) as exc:
        print(f"gpuhealth merge: {exc}", file=sys.stderr)
        return 2
    print(f"merged {len(args.dirs)} shards into {args.out}:")
    for line in done:
        print(f"  {line}")
    return 0


def add_parser(sub: Any) -> None:
    """`gpuhealth merge OUT DIR...`."""
    parser = sub.add_parser(
        "merge",
        help="merge the reports of a fleet's shards (pytest --shard K/N) into one",
        description="Merge the report folders of a fleet's shards (each with verdicts.json "
        f"and any of {JUNIT}, {ALLURE}/ and {FACTS}/) into OUT: one fleet's report.",
    )
    parser.add_argument("out", metavar="OUT", help="folder for the merged report")
    parser.add_argument("dirs", metavar="DIR", nargs="+", help="a shard's report folder")
    parser.set_defaults(func=_merge)
