"""The run store: SQLAlchemy Core tables, migrated by Alembic, on SQLite or PostgreSQL.

SQLAlchemy Core (not the ORM) because the store is a handful of append-only tables read in
bulk; Alembic because a store written by this version must open with the next one: every
schema change is a migration in `migrations/versions`, applied when a store is opened.

A host's history is dated by its facts (`nodes.collected_at`, the facts' collection time;
the run's start where the facts had none), not by the controller's clock: facts judged again
(`pytest --facts` on an older night) are a re-judgement of that night (`nodes.rejudges`), never
a new night, and a host's history before a given night holds only what came before it.

A host's history is its machine's (`nodes.node_id`, resolve_machine): the identities its facts
give and the names it had are `aliases` of the machine, so a renamed or re-imaged host keeps
its history; a host whose facts name no machine is its name (`host:<name>`). A GPU's values
carry its serial (`gpu_key`) wherever it sat (gpu_elsewhere).

Writing is one transaction per run, at the end of the run (a run cut short by SIGKILL leaves
nothing, a run cut short by ^C is kept but marked incomplete and never used as a baseline).
Readers (xdist workers loading one host's history) never block a writer on SQLite, whose file
is kept in WAL mode; two controllers writing at once take turns (SQLite's write lock, taken at
the start of the transaction; PostgreSQL's transactions).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

METADATA = sa.MetaData()
_HOST = sa.String(255)
_NODE_ID = sa.String(320)  # "host:" and a host name, or an identity's kind and value


def _run_id(**options: Any) -> sa.Column[int]:
    """The column that ties a row to its run (deleted with it)."""
    return sa.Column("run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), **options)


RUNS = sa.Table(
    "runs",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("uid", sa.String(36), nullable=False, unique=True),
    sa.Column("started_at", sa.Float, nullable=False),  # seconds since the epoch, UTC
    sa.Column("finished_at", sa.Float, nullable=False),
    sa.Column("complete", sa.Boolean, nullable=False),
    sa.Column("exit_status", sa.Integer),
    sa.Column("level", sa.String(16), nullable=False),
    sa.Column("source", sa.String(16), nullable=False),  # live | facts
    sa.Column("command", sa.Text, nullable=False),
    sa.Column("inventory", sa.Text),
    sa.Column("profiles", sa.Text, nullable=False),
    sa.Column("controller", sa.String(255), nullable=False),
    sa.Column("version", sa.String(32), nullable=False),
    sa.Index("ix_runs_started_at", "started_at"),
)
NODES = sa.Table(
    "nodes",
    METADATA,
    _run_id(primary_key=True),
    sa.Column("host", _HOST, primary_key=True),
    sa.Column("verdict", sa.String(16), nullable=False),
    sa.Column("profile", sa.String(64)),
    sa.Column("driver", sa.String(64)),
    sa.Column("firmware", sa.Text),  # JSON: {"mlx5_0": "28.41.1000", ...}
    sa.Column("collected_at", sa.Float),  # the facts' collection time (null: the run's start)
    sa.Column("rejudges", sa.Integer),  # the run whose facts of this host were judged again
    sa.Column("node_id", _NODE_ID, nullable=False),  # the machine (resolve_machine)
    sa.Column("ids", sa.Text),  # JSON: the machine's identities in the facts (metrics.node_ids)
    sa.Index("ix_nodes_host", "host"),
    sa.Index("ix_nodes_host_collected_at", "host", "collected_at"),
    sa.Index("ix_nodes_node_id_collected_at", "node_id", "collected_at"),
)
GPUS = sa.Table(
    "gpus",
    METADATA,
    _run_id(primary_key=True),
    sa.Column("host", _HOST, primary_key=True),
    sa.Column("idx", sa.Integer, primary_key=True),
    sa.Column("uuid", sa.String(64)),
    sa.Column("serial", sa.String(64)),
    sa.Column("vbios", sa.String(64)),
    sa.Column("name", sa.String(128)),
    sa.Index("ix_gpus_serial", "serial"),
    sa.Index("ix_gpus_uuid", "uuid"),
)


def _per_run_rows() -> tuple[sa.Column[Any], ...]:
    """The columns every per-host row of a run starts with: its id, run, host and GPU (the
    index in that run: it moves when GPUs are swapped; null for the node)."""
    return (
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        _run_id(nullable=False),
        sa.Column("host", _HOST, nullable=False),
        sa.Column("gpu", sa.Integer),
    )


FINDINGS = sa.Table(
    "findings",
    METADATA,
    *_per_run_rows(),
    sa.Column("check", sa.String(64), nullable=False),
    sa.Column("status", sa.String(8), nullable=False),
    sa.Column("action", sa.String(16), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Index("ix_findings_run_host", "run_id", "host"),
)
REGRESSIONS = sa.Table(
    "regressions",
    METADATA,
    *_per_run_rows(),
    sa.Column("check", sa.String(64), nullable=False),
    sa.Column("metric", sa.String(128), nullable=False),
    sa.Column("baseline", sa.Text),  # JSON scalars: a number, or a verdict for new failures
    sa.Column("value", sa.Text),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("action", sa.String(16), nullable=False),
    sa.Index("ix_regressions_run_host", "run_id", "host"),
)
MEASUREMENTS = sa.Table(
    "measurements",
    METADATA,
    *_per_run_rows(),
    sa.Column("gpu_key", sa.String(64)),  # serial, else UUID: what stays with the GPU
    sa.Column("metric", sa.String(128), nullable=False),
    sa.Column("value", sa.Float, nullable=False),
    sa.Index("ix_measurements_host_run", "host", "run_id"),
    sa.Index("ix_measurements_run", "run_id"),
)
PINS = sa.Table(
    "pins",
    METADATA,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("host", _HOST, nullable=False),
    sa.Column("gpu", sa.Integer),  # the index it was pinned by, for messages
    sa.Column("gpu_key", sa.String(64)),  # serial, else UUID; null: the whole node
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("reason", sa.Text),
    sa.Column("node_id", _NODE_ID, nullable=False),
    sa.Index("ix_pins_host", "host"),
    sa.Index("ix_pins_node_id", "node_id"),
)
# Every machine identity and host name seen, with the machine it names now (resolve_machine).
ALIASES = sa.Table(
    "aliases",
    METADATA,
    sa.Column("kind", sa.String(32), primary_key=True),  # metrics.NODE_ID_KINDS, or "host"
    sa.Column("value", _HOST, primary_key=True),
    sa.Column("node_id", _NODE_ID, nullable=False),
    sa.Column("host", _HOST, nullable=False),  # the host name it was last seen under
    sa.Column("last_at", sa.Float, nullable=False),  # the night it was last seen
    sa.Column("shared", sa.Boolean, nullable=False),  # two hosts gave it in one run: ignored
    sa.Index("ix_aliases_node_id", "node_id"),
)
# When a host's night was: its facts' collection time, else its run's start.
NIGHT = sa.func.coalesce(NODES.c.collected_at, RUNS.c.started_at)
_MIGRATIONS = Path(__file__).resolve().parent / "migrations"
_PG_LOCK = 0x67707568  # "gpuh": the advisory lock two controllers take to migrate in turn


# Machine identities strongest first (gpuhealth.families.history.metrics.NODE_ID_KINDS; the
# store does not import the families): the first three are the hardware's.
ID_KINDS = ("product_serial", "product_uuid", "board_serial", "machine_id")
HOST = "host"
# One night's runs (shards, CI groups: each its own run) start within this of each other. A
# machine id under a name other than the one its machine was seen under this close is an
# image's clone on another node, not a rename: two runs cannot mark it shared as one run does.
ONE_NIGHT_S = 12 * 3600.0


def host_node_id(host: str) -> str:
    """The machine id of a host whose facts name no machine: its name."""
    return f"{HOST}:{host}"


Aliases = dict[str, dict[str, dict[str, Any]]]  # node_id -> kind -> value -> its alias row


def _rank(
    ids: dict[str, str], host: str, known: dict[str, dict[str, Any]], at: float | None
) -> int | None:
    """How strongly a machine with these aliases is the one these identities and host name
    describe (lower is stronger), or None when it is another machine: the strongest hardware
    identity both have decides; without one, the same machine id (a renamed host, unless its
    machine was seen under another name within ONE_NIGHT_S of `at`: a clone), else the host
    name it was last seen under (older facts, or a re-imaged host whose hardware cannot be
    read)."""
    for rank, kind in enumerate(ID_KINDS[:3]):
        if kind in ids and kind in known:
            return rank if ids[kind] in known[kind] else None
    if ids.get("machine_id") in known.get("machine_id", {}):
        return None if _cloned(ids, known, host, at) else 3
    current = _current_name(known)
    return 4 if current is not None and current["value"] == host else None


def _current_name(known: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The host-name alias a machine was last seen under (None: it has none)."""
    return max((known.get(HOST) or {}).values(), key=lambda row: row["last_at"], default=None)


def _cloned(
    ids: dict[str, str], known: dict[str, dict[str, Any]], host: str, at: float | None
) -> bool:
    """Whether the machine with these aliases was seen under another name than `host`
    within ONE_NIGHT_S of `at`, with no hardware identity of both to decide: its machine id,
    given by `host` too, is an image's clone."""
    current = _current_name(known)
    return (
        at is not None
        and not any(kind in ids and kind in known for kind in ID_KINDS[:3])
        and current is not None
        and current["value"] != host
        and abs(at - current["last_at"]) < ONE_NIGHT_S
    )


def _alias_rows(conn: Connection, pairs: Iterable[tuple[str, str]]) -> list[sa.Row[Any]]:
    """The aliases of these (kind, value) pairs, shared or not (bounded IN lists: a fleet's
    run asks for all its hosts at once)."""
    by_kind: dict[str, set[str]] = {}
    for kind, value in pairs:
        by_kind.setdefault(kind, set()).add(value)
    found: list[sa.Row[Any]] = []
    for kind, values in by_kind.items():
        wanted = sorted(values)
        for start in range(0, len(wanted), 500):
            chunk = wanted[start : start + 500]
            found += conn.execute(
                sa.select(ALIASES).where(ALIASES.c.kind == kind, ALIASES.c.value.in_(chunk))
            ).all()
    return found


def _aliases_for(conn: Connection, pairs: Iterable[tuple[str, str]]) -> Aliases:
    """Every machine that one of these (kind, value) pairs names, with all its aliases that
    are not shared."""
    candidates = {row.node_id for row in _alias_rows(conn, pairs) if not row.shared}
    known: Aliases = {}
    machines = sorted(candidates)
    for start in range(0, len(machines), 500):
        for row in conn.execute(
            sa.select(ALIASES).where(
                ALIASES.c.node_id.in_(machines[start : start + 500]), sa.not_(ALIASES.c.shared)
            )
        ):
            known.setdefault(row.node_id, {}).setdefault(row.kind, {})[row.value] = dict(
                row._mapping
            )
    return known


def _choose(
    host: str, ids: dict[str, str], known: Aliases, at: float | None
) -> dict[str, Any] | None:
    """The known machine these identities and host name are (resolve_machine), or None."""
    ranked = []
    for node_id, aliases in known.items():
        rank = _rank(ids, host, aliases, at)
        if rank is not None:
            newest = max(a["last_at"] for kind in aliases.values() for a in kind.values())
            ranked.append((rank, -newest, node_id))
    if not ranked:
        return None
    rank, _, node_id = min(ranked)
    aliases = known[node_id]
    last = max((aliases.get(HOST) or {}).values(), key=lambda a: a["last_at"])
    machine = max(
        (aliases.get("machine_id") or {}).values(), key=lambda a: a["last_at"], default=None
    )
    return {
        "id": node_id,
        "by": (*ID_KINDS, HOST)[rank],
        "host": last["value"],
        "last": last["last_at"],
        "machine_id": machine["value"] if machine else None,
    }


def _pairs(host: str, ids: dict[str, str]) -> list[tuple[str, str]]:
    """What finds a host's machine: its identities and its name."""
    return [*((k, v) for k, v in ids.items() if k in ID_KINDS), (HOST, host)]


def _new_id(conn: Connection, host: str, ids: dict[str, str]) -> dict[str, Any]:
    """A machine not seen before, named by its strongest identity (else its host name)."""
    kind = next((k for k in ID_KINDS if k in ids), None)
    base = f"{kind}:{ids[kind]}" if kind else host_node_id(host)
    return {"id": _unused(conn, base), "by": "new"}


def resolve_machine(
    conn: Connection, host: str, ids: dict[str, str], at: float | None = None
) -> dict[str, Any]:
    """The machine a host's night (collected at `at`) belongs to: `{"id", "by"}` (`by`: the
    identity kind that found it, `host` for its name, `new` for a machine not seen before)
    and, for a known one, `host` and `last`: the name it was last seen under and when, and
    `machine_id`: its latest machine id (a re-image changes it). Identities two hosts gave in
    one run are ignored, and a machine id another name gave the same night (_rank)."""
    known = _aliases_for(conn, _pairs(host, ids))
    return _choose(host, ids, known, at) or _new_id(conn, host, ids)


def _unused(conn: Connection, base: str) -> str:
    """`base`, or `base#2`, `base#3`... where a machine already has it (a host name that a
    renamed machine had, given to one whose facts name no machine)."""
    taken: set[str] = set()
    for table in (NODES, ALIASES):  # aliases outlive the nights prune deletes
        column = table.c.node_id
        taken.update(
            conn.execute(
                sa.select(column).where(
                    sa.or_(column == base, column.startswith(base + "#", autoescape=True))
                )
            ).scalars()
        )
    found, n = base, 1
    while found in taken:
        n += 1
        found = f"{base}#{n}"
    return found


def _share(conn: Connection, kind: str, value: str, host: str) -> None:
    """Mark an identity shared (two hosts gave it in one run): never used to find a machine."""
    where = sa.and_(ALIASES.c.kind == kind, ALIASES.c.value == value)
    if not conn.execute(ALIASES.update().where(where).values(shared=True)).rowcount:
        row = {"node_id": "", "host": host, "last_at": 0.0, "shared": True}
        conn.execute(ALIASES.insert().values(kind=kind, value=value, **row))


def _storable_row(row: dict[str, Any], run_id: int) -> dict[str, Any]:
    """A row for the run `run_id`, its texts without NUL characters (U+FFFD in their place):
    PostgreSQL refuses NUL in text, and one GPU serial or kernel message of saved facts that
    holds one would cost the store the whole run. SQLite keeps the same text."""
    found = {
        key: value.replace("\x00", "\ufffd") if type(value) is str and "\x00" in value else value
        for key, value in row.items()
    }
    found["run_id"] = run_id
    return found


class StoreError(RuntimeError):
    """The store cannot be opened, read or written; the message names it."""


@dataclass
class RunRecord:
    """One suite run as the store keeps it (rows are plain dicts of the tables' columns)."""

    uid: str
    started_at: float
    finished_at: float
    complete: bool
    exit_status: int | None
    level: str
    source: str
    command: str
    inventory: str | None
    profiles: str
    controller: str
    version: str
    nodes: list[dict[str, Any]] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    regressions: list[dict[str, Any]] = field(default_factory=list)
    measurements: list[dict[str, Any]] = field(default_factory=list)


def engine_url(spec: str, base: Path) -> str:
    """`--history` as an SQLAlchemy URL: a PostgreSQL URL (driven by psycopg 3), an
    SQLAlchemy URL as given, else a file path (relative to `base`) for SQLite."""
    if spec.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + spec.partition("://")[2]
    if "://" in spec:
        return spec
    path = Path(spec).expanduser()
    return f"sqlite:///{path if path.is_absolute() else base / path}"


def describe(url: str) -> str:
    """A store's URL for messages and reports: the password hidden."""
    try:
        return sa.make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return url


def _alembic(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The schema revision this gpuhealth writes."""
    head = ScriptDirectory.from_config(_alembic()).get_current_head()
    assert head is not None
    return head


def _sqlite_engine(url: str) -> Engine:
    path = Path(sa.make_url(url).database or "")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the folder of {path}: {exc}") from None
    engine = sa.create_engine(url, connect_args={"timeout": 60})

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi: Any, _record: Any) -> None:
        # Transactions are ours (see _begin), not the sqlite3 module's implicit ones.
        dbapi.isolation_level = None
        cursor = dbapi.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")  # readers never wait for the writer
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=60000")  # a second writer waits its turn
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        # A writer takes the write lock up front: two writers that both started reading
        # first could each wait for the other (SQLITE_BUSY without the busy handler).
        write = conn.get_execution_options().get("gpuhealth_write")
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


class Store:
    """An open run store (migrated to this version's schema when opened)."""

    def __init__(self, spec: str, base: Path | None = None) -> None:
        self.url = engine_url(spec, base or Path.cwd())
        self.name = describe(self.url)
        try:
            if self.url.startswith("sqlite:"):
                self.engine = _sqlite_engine(self.url)
            else:
                self.engine = sa.create_engine(self.url, pool_pre_ping=True)
            self._migrate()
        except SQLAlchemyError as exc:
            raise StoreError(f"history store {self.name}: {_first_line(exc)}") from None
        except ModuleNotFoundError as exc:
            raise StoreError(
                f"history store {self.name}: the driver is not installed ({exc.name}); "
                "for PostgreSQL: pip install 'gpuhealth[postgresql]'"
            ) from None

    @property
    def postgresql(self) -> bool:
        """Whether the store is a PostgreSQL database (else SQLite)."""
        return self.engine.dialect.name == "postgresql"

    def _migrate(self) -> None:
        """Bring the schema to this version's head, once, whoever else opens the store now."""
        head = head_revision()
        with self.engine.connect() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
        if current == head:
            return
        scripts = ScriptDirectory.from_config(_alembic())
        if current is not None and current not in {s.revision for s in scripts.walk_revisions()}:
            raise StoreError(
                f"history store {self.name} has schema revision {current}, which this "
                "gpuhealth does not know: it was written by a newer gpuhealth; upgrade"
            )
        with self._writing() as conn:
            command.upgrade(_alembic(conn), "head")

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        """One write transaction, holding the store's write lock from its start."""
        engine = self.engine.execution_options(gpuhealth_write=True)
        with engine.begin() as conn:
            if self.postgresql:
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK})
            yield conn

    def close(self) -> None:
        """Release the store's connections."""
        self.engine.dispose()

    # ------------------------------------------------------------ writing

    def write_run(self, run: RunRecord) -> int:
        """Append a run with everything it found, in one transaction; its id."""
        try:
            with self._writing() as conn:
                values = {k: v for k, v in vars(run).items() if k in RUNS.c}
                key = conn.execute(RUNS.insert().values(**values)).inserted_primary_key
                run_id = int(key[0]) if key else 0
                nodes = self._rejudged(conn, self._machines(conn, run.nodes, run.started_at))
                again = {row["host"] for row in nodes if row["rejudges"] is not None}
                # A night judged again adds no measurements: they are its night's already.
                measurements = [row for row in run.measurements if row["host"] not in again]
                for table, rows in (
                    (NODES, nodes),
                    (GPUS, run.gpus),
                    (FINDINGS, run.findings),
                    (REGRESSIONS, run.regressions),
                    (MEASUREMENTS, measurements),
                ):
                    if rows:
                        conn.execute(table.insert(), [_storable_row(row, run_id) for row in rows])
                return run_id
        except SQLAlchemyError as exc:
            raise StoreError(f"history store {self.name}: {_first_line(exc)}") from None

    @staticmethod
    def _machines(
        conn: Connection, nodes: list[dict[str, Any]], started: float
    ) -> list[dict[str, Any]]:
        """The run's node rows each with its machine (resolve_machine), and the aliases that
        name it moved to it (a re-judged older night moves none back). An identity two hosts
        of the run gave is marked shared (a cloned machine id, a vendor's placeholder), never
        used again to find a machine."""
        given: dict[tuple[str, str], set[str]] = {}
        for row in nodes:
            for pair in (json.loads(row["ids"]) if row.get("ids") else {}).items():
                given.setdefault(pair, set()).add(row["host"])
        # Hosts of one run share no alias (names are unique in a run, shared identities are
        # left out), so every machine is looked up at once and the aliases written after.
        mine = {
            row["host"]: {
                k: v
                for k, v in (json.loads(row["ids"]) if row.get("ids") else {}).items()
                if len(given[(k, v)]) == 1
            }
            for row in nodes
        }
        pairs = [pair for host, ids in mine.items() for pair in _pairs(host, ids)]
        known = _aliases_for(conn, pairs)
        named = {
            (kind, value): node_id
            for node_id, aliases in known.items()
            for kind, rows in aliases.items()
            for value in rows
        }
        seen = {(alias.kind, alias.value): alias.last_at for alias in _alias_rows(conn, pairs)}
        kept, moved, added, clones = [], [], [], []
        for row in nodes:
            host, at = row["host"], row.get("collected_at") or started
            clone = ("machine_id", mine[host].get("machine_id"))
            if clone in named and _cloned(mine[host], known[named[clone]], host, at):
                # another run of the night gave it under another name: shared from now on
                clones.append((*clone, host))
                mine[host] = {k: v for k, v in mine[host].items() if k != "machine_id"}
            mine_known = {named[p]: known[named[p]] for p in _pairs(host, mine[host]) if p in named}
            machine = _choose(host, mine[host], mine_known, at) or _new_id(conn, host, mine[host])
            kept.append({**row, "node_id": machine["id"]})
            for pair in _pairs(host, mine[host]):
                values = {"node_id": machine["id"], "host": host, "last_at": at}
                if pair not in seen:
                    added.append({"kind": pair[0], "value": pair[1], "shared": False, **values})
                elif seen[pair] <= at:  # a re-judged older night moves no alias back
                    moved.append({"k": pair[0], "v": pair[1], **values})
        shared = sorted(pair for pair, hosts in given.items() if len(hosts) > 1)
        for kind, value in shared:
            _share(conn, kind, value, min(given[(kind, value)]))
        for kind, value, host in clones:
            _share(conn, kind, value, host)
        if moved:
            conn.execute(
                ALIASES.update()
                .where(ALIASES.c.kind == sa.bindparam("k"), ALIASES.c.value == sa.bindparam("v"))
                .values(
                    node_id=sa.bindparam("node_id"),
                    host=sa.bindparam("host"),
                    last_at=sa.bindparam("last_at"),
                ),
                moved,
            )
        if added:
            conn.execute(ALIASES.insert(), added)
        return kept

    @staticmethod
    def _rejudged(conn: Connection, nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The run's node rows, each naming the complete run that already judged the same
        facts of its host (same host, same collection time), if one did."""
        found: dict[tuple[str, float | None], int] = {}
        dated = [row for row in nodes if row.get("collected_at") is not None]
        for start in range(0, len(dated), 500):  # bounded IN lists
            chunk = dated[start : start + 500]
            query = (
                sa.select(NODES.c.host, NODES.c.collected_at, sa.func.min(NODES.c.run_id))
                .join(RUNS, NODES.c.run_id == RUNS.c.id)
                .where(
                    NODES.c.host.in_({row["host"] for row in chunk}),
                    NODES.c.collected_at.in_({row["collected_at"] for row in chunk}),
                    NODES.c.rejudges.is_(None),
                    RUNS.c.complete,
                )
                .group_by(NODES.c.host, NODES.c.collected_at)
            )
            found.update({(host, at): first for host, at, first in conn.execute(query)})
        return [
            {**row, "rejudges": found.get((row["host"], row.get("collected_at")))} for row in nodes
        ]

    def machine_of(self, host: str) -> str | None:
        """The machine a host name last belonged to (None: a name the store has not seen)."""
        rows = self._read(
            sa.select(ALIASES.c.node_id).where(ALIASES.c.kind == HOST, ALIASES.c.value == host)
        )
        return rows[0].node_id if rows else None

    def other_names(self, host: str) -> list[tuple[str, float]]:
        """The other host names of the machine a host name belongs to (a renamed host's
        earlier ones), with the night each was last seen, oldest first."""
        node_id = self.machine_of(host)
        if node_id is None:
            return []
        rows = self._read(
            sa.select(ALIASES.c.value, ALIASES.c.last_at)
            .where(ALIASES.c.kind == HOST, ALIASES.c.node_id == node_id, ALIASES.c.value != host)
            .order_by(ALIASES.c.last_at)
        )
        return [(row.value, row.last_at) for row in rows]

    def pin(self, host: str, gpu: int | None, gpu_key: str | None, at: float, reason: str) -> None:
        """Record that the node's (or one GPU's) drift baselines restart after `at`: the
        machine the host name last belonged to."""
        try:
            node_id = self.machine_of(host) or host_node_id(host)
            with self._writing() as conn:
                conn.execute(
                    PINS.insert().values(
                        host=host, gpu=gpu, gpu_key=gpu_key, at=at, reason=reason, node_id=node_id
                    )
                )
        except SQLAlchemyError as exc:
            raise StoreError(f"history store {self.name}: {_first_line(exc)}") from None

    def prune(self, before: float) -> int:
        """Delete the runs that started before `before` (epoch seconds); how many."""
        try:
            with self._writing() as conn:
                old = sa.select(RUNS.c.id).where(RUNS.c.started_at < before)
                for table in (MEASUREMENTS, REGRESSIONS, FINDINGS, GPUS, NODES):
                    conn.execute(table.delete().where(table.c.run_id.in_(old)))
                return int(conn.execute(RUNS.delete().where(RUNS.c.started_at < before)).rowcount)
        except SQLAlchemyError as exc:
            raise StoreError(f"history store {self.name}: {_first_line(exc)}") from None

    # ------------------------------------------------------------ reading

    def _read(self, query: Any, params: dict[str, Any] | None = None) -> list[sa.Row[Any]]:
        try:
            with self.engine.connect() as conn:
                return list(conn.execute(query, params or {}))
        except SQLAlchemyError as exc:
            raise StoreError(f"history store {self.name}: {_first_line(exc)}") from None

    def machine(self, host: str, ids: dict[str, str], at: float | None = None) -> dict[str, Any]:
        """The machine a host's facts (collected at `at`) belong to (resolve_machine), as the
        store knows now."""
        try:
            with self.engine.connect() as conn:
                return resolve_machine(conn, host, ids, at)
        except SQLAlchemyError as exc:
            raise StoreError(f"history store {self.name}: {_first_line(exc)}") from None

    def _own_nights(self, host: str, before: float | None, node_id: str | None = None) -> Any:
        """The host's (with `node_id`: the machine's, under any name) own nights (not
        re-judgements) of complete runs, before a time."""
        mine = NODES.c.host == host if node_id is None else NODES.c.node_id == node_id
        own = sa.and_(mine, NODES.c.rejudges.is_(None), RUNS.c.complete)
        return own if before is None else sa.and_(own, NIGHT < before)

    def host_history(
        self,
        host: str,
        limit: int,
        before: float | None = None,
        starts: Iterable[float] = (),
        first: int = 0,
        node_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """The host's (with `node_id`: the machine's) last `limit` complete nights before
        `before`, and the `first` nights after each time in `starts` (where a baseline began:
        a reference formed long ago is still there), newest first, each as one sample: its
        night, the node's verdict, driver and firmware, the regressions reported for it, its
        GPUs' identities and every measured value."""
        query = self._nights_query().where(self._own_nights(host, before, node_id))
        rows = self._read(query.order_by(NIGHT.desc(), RUNS.c.id.desc()).limit(limit))
        for start in sorted(set(starts)):
            rows += self._read(query.where(NIGHT > start).order_by(NIGHT, RUNS.c.id).limit(first))
        return self._samples(rows)

    def gpu_elsewhere(
        self, keys: Iterable[str], node_id: str, before: float, limit: int
    ) -> dict[str, list[dict[str, Any]]]:
        """Per GPU (serial, else UUID), its last `limit` complete nights before `before` in
        other machines than `node_id` (a GPU moved between nodes keeps its counters' past),
        newest first, as host_history's samples (with `host` and `node_id`). A key two hosts
        gave in one run (stand-in GPUs, a firmware that reports no real serial) names no one
        GPU: it is followed on this machine only."""
        wanted = sorted(set(keys))
        if not wanted:
            return {}
        # One query for the usual answer: none of these GPUs was ever in another machine.
        seen = self._read(
            sa.select(GPUS.c.serial, GPUS.c.uuid)
            .join(NODES, sa.and_(NODES.c.run_id == GPUS.c.run_id, NODES.c.host == GPUS.c.host))
            .where(
                sa.or_(GPUS.c.serial.in_(wanted), GPUS.c.uuid.in_(wanted)),
                NODES.c.node_id != node_id,
            )
            .distinct()
        )
        moved = sorted({key for row in seen for key in row if key in wanted})
        found: dict[str, list[dict[str, Any]]] = {}
        for key in moved:
            this = sa.or_(GPUS.c.serial == key, GPUS.c.uuid == key)
            shared = self._read(
                sa.select(GPUS.c.run_id)
                .where(this)
                .group_by(GPUS.c.run_id)
                .having(sa.func.count(sa.distinct(GPUS.c.host)) > 1)
                .limit(1)
            )
            if shared:
                continue
            where = sa.and_(
                this,
                NODES.c.node_id != node_id,
                NODES.c.rejudges.is_(None),
                RUNS.c.complete,
                NIGHT < before,
            )
            query = (
                self._nights_query()
                .join(GPUS, sa.and_(GPUS.c.run_id == NODES.c.run_id, GPUS.c.host == NODES.c.host))
                .where(where)
            )
            rows = self._read(query.order_by(NIGHT.desc(), RUNS.c.id.desc()).limit(limit))
            if rows:
                found[key] = self._samples(rows)
        return found

    @staticmethod
    def _nights_query() -> Any:
        """Nodes' nights with their runs: what a sample starts from."""
        return sa.select(
            RUNS.c.id,
            RUNS.c.uid,
            NODES.c.host,
            NODES.c.node_id,
            NIGHT.label("night"),
            NODES.c.verdict,
            NODES.c.driver,
            NODES.c.firmware,
        ).join(NODES, NODES.c.run_id == RUNS.c.id)

    def _samples(self, rows: list[sa.Row[Any]]) -> list[dict[str, Any]]:
        """Nights (rows of _nights_query) as samples, newest first: with the count of
        regressions reported for each (by its run and any re-judgement), the GPUs' identities
        and every measured value."""
        samples: dict[tuple[int, str], dict[str, Any]] = {}
        for row in sorted(rows, key=lambda r: (r.night, r.id), reverse=True):
            samples[(row.id, row.host)] = {
                "run": row.uid,
                "at": row.night,
                "host": row.host,
                "node_id": row.node_id,
                "verdict": row.verdict,
                "driver": row.driver,
                "firmware": json.loads(row.firmware) if row.firmware else {},
                "regressions": 0,
                "gpus": {},
                "node": {},
                "gpu": {},
            }
        if not samples:
            return []
        ids = sorted({run for run, _ in samples})
        hosts = sorted({host for _, host in samples})
        by_night = {(s["node_id"], s["at"]): s for s in samples.values()}
        for row in self._read(
            sa.select(
                NODES.c.node_id,
                NIGHT.label("night"),
                sa.func.count(REGRESSIONS.c.id).label("found"),
            )
            .select_from(_regressions_of_nights())
            .where(
                NODES.c.node_id.in_(sorted({s["node_id"] for s in samples.values()})),
                NIGHT.in_(sorted({s["at"] for s in samples.values()})),
            )
            .group_by(NODES.c.node_id, NIGHT)
        ):
            if (row.node_id, row.night) in by_night:
                by_night[(row.node_id, row.night)]["regressions"] = int(row.found)
        for row in self._read(
            sa.select(GPUS).where(GPUS.c.host.in_(hosts), GPUS.c.run_id.in_(ids))
        ):
            if (row.run_id, row.host) in samples:
                samples[(row.run_id, row.host)]["gpus"][str(row.idx)] = {
                    "uuid": row.uuid,
                    "serial": row.serial,
                    "vbios": row.vbios,
                }
        for row in self._read(
            sa.select(
                MEASUREMENTS.c.run_id,
                MEASUREMENTS.c.host,
                MEASUREMENTS.c.gpu,
                MEASUREMENTS.c.metric,
                MEASUREMENTS.c.value,
            ).where(MEASUREMENTS.c.host.in_(hosts), MEASUREMENTS.c.run_id.in_(ids))
        ):
            sample = samples.get((row.run_id, row.host))
            if sample is None:
                continue
            if row.gpu is None:
                sample["node"][row.metric] = row.value
            else:
                sample["gpu"].setdefault(str(row.gpu), {})[row.metric] = row.value
        return list(samples.values())

    def identities(
        self, node_id: str, before: float | None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """When each identity of the machine was last seen before a time: its driver and
        firmware (JSON, as stored), and each GPU's serial, UUID and VBIOS (`first`, `last`)."""
        own = self._own_nights("", before, node_id)
        nodes = self._read(
            sa.select(NODES.c.driver, NODES.c.firmware, sa.func.max(NIGHT).label("last"))
            .join(RUNS, NODES.c.run_id == RUNS.c.id)
            .where(own)
            .group_by(NODES.c.driver, NODES.c.firmware)
        )
        gpus = self._read(
            sa.select(
                GPUS.c.serial,
                GPUS.c.uuid,
                GPUS.c.vbios,
                sa.func.min(NIGHT).label("first"),
                sa.func.max(NIGHT).label("last"),
            )
            .select_from(
                GPUS.join(
                    NODES, sa.and_(NODES.c.run_id == GPUS.c.run_id, NODES.c.host == GPUS.c.host)
                ).join(RUNS, NODES.c.run_id == RUNS.c.id)
            )
            .where(own)
            .group_by(GPUS.c.serial, GPUS.c.uuid, GPUS.c.vbios)
        )
        return [dict(row._mapping) for row in nodes], [dict(row._mapping) for row in gpus]

    def pins(
        self, host: str, before: float | None = None, node_id: str | None = None
    ) -> list[dict[str, Any]]:
        """The host's (with `node_id`: the machine's) pins (made before a time), oldest
        first."""
        mine = PINS.c.host == host if node_id is None else PINS.c.node_id == node_id
        query = sa.select(PINS).where(mine).order_by(PINS.c.at, PINS.c.id)
        if before is not None:
            query = query.where(PINS.c.at < before)
        return [dict(row._mapping) for row in self._read(query)]

    def night(self, host: str, at: float, node_id: str | None = None) -> dict[str, Any] | None:
        """The host's (with `node_id`: the machine's) night at `at` if a complete run judged it
        already: that run and the regressions reported for the night by it and by every
        re-judgement since."""
        first = self._read(
            sa.select(RUNS.c.uid)
            .join(NODES, NODES.c.run_id == RUNS.c.id)
            .where(self._own_nights(host, None, node_id), NODES.c.collected_at == at)
            .order_by(RUNS.c.id)
            .limit(1)
        )
        if not first:
            return None
        reported = self._read(
            sa.select(REGRESSIONS.c.check, REGRESSIONS.c.gpu, REGRESSIONS.c.metric)
            .select_from(_regressions_of_nights())
            .where(
                REGRESSIONS.c.host == host if node_id is None else NODES.c.node_id == node_id,
                NODES.c.collected_at == at,
                RUNS.c.complete,
            )
        )
        return {"run": first[0].uid, "reported": [dict(row._mapping) for row in reported]}

    def latest_gpus(self, host: str) -> dict[int, dict[str, Any]]:
        """The host's GPUs in its latest night, by index: UUID and serial."""
        latest = self._read(
            sa.select(RUNS.c.id)
            .join(NODES, NODES.c.run_id == RUNS.c.id)
            .where(self._own_nights(host, None))
            .order_by(NIGHT.desc(), RUNS.c.id.desc())
            .limit(1)
        )
        if not latest:
            return {}
        rows = self._read(sa.select(GPUS).where(GPUS.c.run_id == latest[0].id, GPUS.c.host == host))
        return {row.idx: {"uuid": row.uuid, "serial": row.serial} for row in rows}

    def last_states(
        self, hosts: Iterable[str], machines: dict[str, str] | None = None
    ) -> dict[str, dict[str, Any]]:
        """Per host, its latest night of a complete run: when, its verdict and what failed. A
        host found in `machines` (host -> node_id) is looked up by its machine, so a renamed
        host's last night under its earlier name counts."""
        machines = machines or {}
        # A host with no machine of tonight (unreachable, no facts): the one its name last had.
        by_node = {
            machines.get(host) or self.machine_of(host) or host_node_id(host): host
            for host in set(hosts)
        }
        wanted = sorted(by_node)
        found: dict[str, dict[str, Any]] = {}
        named: dict[str, str] = {}  # host -> the name its last night was recorded under
        for start in range(0, len(wanted), 500):  # bounded IN lists
            chunk = wanted[start : start + 500]
            own = sa.and_(NODES.c.rejudges.is_(None), RUNS.c.complete)
            latest = (
                sa.select(NODES.c.node_id, sa.func.max(NIGHT).label("at"))
                .join(RUNS, NODES.c.run_id == RUNS.c.id)
                .where(NODES.c.node_id.in_(chunk), own)
                .group_by(NODES.c.node_id)
                .subquery()
            )
            rows = self._read(
                sa.select(
                    NODES.c.node_id, NODES.c.host, NODES.c.verdict, RUNS.c.id, NIGHT.label("night")
                )
                .join(RUNS, NODES.c.run_id == RUNS.c.id)
                .join(latest, sa.and_(latest.c.node_id == NODES.c.node_id, latest.c.at == NIGHT))
                .where(own)
            )
            for row in rows:
                host = by_node[row.node_id]
                named[host] = row.host
                found[host] = {
                    "run_id": row.id,
                    "at": row.night,
                    "verdict": row.verdict,
                    "failed": set(),
                }
        by_run: dict[int, dict[str, str]] = {}
        for host, state in found.items():
            by_run.setdefault(state["run_id"], {})[named[host]] = host
        for run_id, run_hosts in by_run.items():
            for row in self._read(
                sa.select(FINDINGS.c.host, FINDINGS.c.check, FINDINGS.c.gpu).where(
                    FINDINGS.c.run_id == run_id,
                    FINDINGS.c.host.in_(list(run_hosts)),
                    FINDINGS.c.status.in_(("FAIL", "ERROR")),
                )
            ):
                found[run_hosts[row.host]]["failed"].add((row.check, row.gpu))
        return found

    def series(
        self,
        host: str | None = None,
        gpu: int | None = None,
        metric: str | None = None,
        since: float | None = None,
        among: Iterable[str] | None = None,
        node_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Measured values over time, oldest first: the night (`started_at`: its facts'
        collection time), run, host, machine (`node_id`: a renamed host's rows share it), GPU
        (index, and `gpu_key`: serial, else UUID), metric and value, filtered by any
        of host, machine (`node_id`: every name a host had, machine_of), GPU index, metric (a
        `*` glob, or `among` these names) and time."""
        query = (
            sa.select(
                NIGHT.label("started_at"),
                RUNS.c.uid,
                MEASUREMENTS.c.host,
                NODES.c.node_id,
                MEASUREMENTS.c.gpu,
                MEASUREMENTS.c.gpu_key,
                MEASUREMENTS.c.metric,
                MEASUREMENTS.c.value,
            )
            .join(RUNS, MEASUREMENTS.c.run_id == RUNS.c.id)
            .join(
                NODES,
                sa.and_(NODES.c.run_id == RUNS.c.id, NODES.c.host == MEASUREMENTS.c.host),
            )
            .where(RUNS.c.complete)
        )
        if host is not None:
            query = query.where(MEASUREMENTS.c.host == host)
        if node_id is not None:
            query = query.where(NODES.c.node_id == node_id)
        if gpu is not None:
            query = query.where(MEASUREMENTS.c.gpu == gpu)
        if metric is not None:
            pattern = metric.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            query = query.where(MEASUREMENTS.c.metric.like(pattern.replace("*", "%"), escape="\\"))
        if since is not None:
            query = query.where(NIGHT >= since)
        if among is not None:
            query = query.where(MEASUREMENTS.c.metric.in_(list(among)))
        query = query.order_by(
            NIGHT, MEASUREMENTS.c.host, MEASUREMENTS.c.gpu, MEASUREMENTS.c.metric
        )
        return [dict(row._mapping) for row in self._read(query)]

    def runs(self, since: float | None = None) -> list[dict[str, Any]]:
        """Every run (complete or not) since a time, oldest first, with its node verdicts,
        regressions and the nights it judged again (host -> night)."""
        query = sa.select(RUNS).order_by(RUNS.c.started_at)
        if since is not None:
            query = query.where(RUNS.c.started_at >= since)
        found = {
            row.id: {**row._mapping, "nodes": {}, "regressions": [], "rejudged": {}}
            for row in self._read(query)
        }
        if not found:
            return []
        ids = list(found)
        for row in self._read(sa.select(NODES).where(NODES.c.run_id.in_(ids))):
            found[row.run_id]["nodes"][row.host] = row.verdict
            if row.rejudges is not None:
                found[row.run_id]["rejudged"][row.host] = row.collected_at
        for row in self._read(sa.select(REGRESSIONS).where(REGRESSIONS.c.run_id.in_(ids))):
            entry = dict(row._mapping)
            for key in ("baseline", "value"):
                entry[key] = json.loads(entry[key]) if entry[key] is not None else None
            found[row.run_id]["regressions"].append(entry)
        return list(found.values())

    def read(self, query: Any) -> list[sa.Row[Any]]:
        """The rows of a read-only query on the store's tables: the history views' own
        queries (gpuhealth.history.morning, plots); a database error is a StoreError."""
        return self._read(query)


def _regressions_of_nights() -> Any:
    """Regressions joined with their host's row of their run (its night) and the run."""
    return REGRESSIONS.join(
        NODES, sa.and_(NODES.c.run_id == REGRESSIONS.c.run_id, NODES.c.host == REGRESSIONS.c.host)
    ).join(RUNS, RUNS.c.id == NODES.c.run_id)


def _first_line(exc: BaseException) -> str:
    """A database error as one line (SQLAlchemy appends the statement and a link)."""
    original = getattr(exc, "orig", None) or exc
    text = str(original).strip().splitlines()
    return text[0] if text else type(original).__name__
