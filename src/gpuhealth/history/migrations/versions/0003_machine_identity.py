"""A node's history follows its machine, a GPU's its serial, wherever they go.

`nodes.node_id`: the machine a host's night belongs to (`product_serial:...`, `machine_id:...`,
or `host:<name>` where the facts named no machine); `nodes.ids`: the machine identities its
facts gave (JSON). `aliases`: every identity (and host name) seen, with the machine it names
now, so a renamed or re-imaged host finds its history. `pins.node_id`: the machine pinned.
Earlier nights are each their host's (`host:<name>`), and their host name an alias of it, so
a node's first night with identities continues the history its name had.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the columns and the aliases; every earlier night keyed by its host's name."""
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("node_id", sa.String(320)))
        batch.add_column(sa.Column("ids", sa.Text))
    op.execute("UPDATE nodes SET node_id = 'host:' || host")
    with op.batch_alter_table("nodes") as batch:
        batch.alter_column("node_id", existing_type=sa.String(320), nullable=False)
        batch.create_index("ix_nodes_node_id_collected_at", ["node_id", "collected_at"])
    with op.batch_alter_table("pins") as batch:
        batch.add_column(sa.Column("node_id", sa.String(320)))
    op.execute("UPDATE pins SET node_id = 'host:' || host")
    with op.batch_alter_table("pins") as batch:
        batch.alter_column("node_id", existing_type=sa.String(320), nullable=False)
        batch.create_index("ix_pins_node_id", ["node_id"])
    op.create_index("ix_gpus_serial", "gpus", ["serial"])
    op.create_index("ix_gpus_uuid", "gpus", ["uuid"])
    op.create_table(
        "aliases",
        sa.Column("kind", sa.String(32), primary_key=True),
        sa.Column("value", sa.String(255), primary_key=True),
        sa.Column("node_id", sa.String(320), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("last_at", sa.Float, nullable=False),
        sa.Column("shared", sa.Boolean, nullable=False),
    )
    op.create_index("ix_aliases_node_id", "aliases", ["node_id"])
    nodes = sa.table("nodes", sa.column("run_id"), sa.column("host"), sa.column("collected_at"))
    runs = sa.table("runs", sa.column("id"), sa.column("started_at"))
    aliases = sa.table(
        "aliases",
        *(sa.column(c) for c in ("kind", "value", "node_id", "host", "last_at", "shared")),
    )
    earlier = (
        sa.select(
            sa.literal("host"),
            nodes.c.host,
            sa.literal("host:") + nodes.c.host,
            nodes.c.host,
            sa.func.max(sa.func.coalesce(nodes.c.collected_at, runs.c.started_at)),
            sa.false(),
        )
        .select_from(nodes.join(runs, runs.c.id == nodes.c.run_id))
        .group_by(nodes.c.host)
    )
    op.execute(aliases.insert().from_select(list(aliases.c), earlier))


def downgrade() -> None:
    """Back to the second schema (histories keyed by host name again)."""
    op.drop_table("aliases")
    op.drop_index("ix_gpus_uuid", "gpus")
    op.drop_index("ix_gpus_serial", "gpus")
    with op.batch_alter_table("pins") as batch:
        batch.drop_index("ix_pins_node_id")
        batch.drop_column("node_id")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_index("ix_nodes_node_id_collected_at")
        batch.drop_column("ids")
        batch.drop_column("node_id")
