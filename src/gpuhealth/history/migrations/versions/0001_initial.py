"""The first schema: runs, and per run the nodes, GPUs, findings, regressions, measurements.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _run_fk() -> sa.Column:
    return sa.Column(
        "run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False
    )


def upgrade() -> None:
    """Create the tables (written out here, not imported: later models must not change it)."""
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("uid", sa.String(36), nullable=False, unique=True),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("finished_at", sa.Float, nullable=False),
        sa.Column("complete", sa.Boolean, nullable=False),
        sa.Column("exit_status", sa.Integer),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("command", sa.Text, nullable=False),
        sa.Column("inventory", sa.Text),
        sa.Column("profiles", sa.Text, nullable=False),
        sa.Column("controller", sa.String(255), nullable=False),
        sa.Column("version", sa.String(32), nullable=False),
    )
    op.create_index("ix_runs_started_at", "runs", ["started_at"])
    op.create_table(
        "nodes",
        sa.Column(
            "run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("host", sa.String(255), primary_key=True),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("profile", sa.String(64)),
        sa.Column("driver", sa.String(64)),
        sa.Column("firmware", sa.Text),
    )
    op.create_index("ix_nodes_host", "nodes", ["host"])
    op.create_table(
        "gpus",
        sa.Column(
            "run_id", sa.Integer, sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True
        ),
        sa.Column("host", sa.String(255), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("uuid", sa.String(64)),
        sa.Column("serial", sa.String(64)),
        sa.Column("vbios", sa.String(64)),
        sa.Column("name", sa.String(128)),
    )
    op.create_table(
        "findings",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        _run_fk(),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("gpu", sa.Integer),
        sa.Column("check", sa.String(64), nullable=False),
        sa.Column("status", sa.String(8), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
    )
    op.create_index("ix_findings_run_host", "findings", ["run_id", "host"])
    op.create_table(
        "regressions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        _run_fk(),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("gpu", sa.Integer),
        sa.Column("check", sa.String(64), nullable=False),
        sa.Column("metric", sa.String(128), nullable=False),
        sa.Column("baseline", sa.Text),
        sa.Column("value", sa.Text),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
    )
    op.create_index("ix_regressions_run_host", "regressions", ["run_id", "host"])
    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        _run_fk(),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("gpu", sa.Integer),
        sa.Column("gpu_key", sa.String(64)),
        sa.Column("metric", sa.String(128), nullable=False),
        sa.Column("value", sa.Float, nullable=False),
    )
    op.create_index("ix_measurements_host_run", "measurements", ["host", "run_id"])
    op.create_index("ix_measurements_run", "measurements", ["run_id"])


def downgrade() -> None:
    """Drop everything (a store from before any history)."""
    for table in ("measurements", "regressions", "findings", "gpus", "nodes", "runs"):
        op.drop_table(table)
