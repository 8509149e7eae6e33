"""Nights dated by their facts, re-judgements, and pinned baselines.

`nodes.collected_at`: when the host's facts were collected (their `collected_at`), the time
its history is dated by; `nodes.rejudges`: the run whose facts of this host this run judged
again (null for a host's own night). `pins`: a node's (or one GPU's) drift baselines restart
after this time (`gpuhealth history pin`).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the columns (null in earlier runs: dated by their run's start) and the pins."""
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("collected_at", sa.Float))
        batch.add_column(sa.Column("rejudges", sa.Integer))
        batch.create_index("ix_nodes_host_collected_at", ["host", "collected_at"])
    op.create_table(
        "pins",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("gpu", sa.Integer),
        sa.Column("gpu_key", sa.String(64)),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("reason", sa.Text),
    )
    op.create_index("ix_pins_host", "pins", ["host"])


def downgrade() -> None:
    """Back to the first schema."""
    op.drop_table("pins")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_index("ix_nodes_host_collected_at")
        batch.drop_column("rejudges")
        batch.drop_column("collected_at")
