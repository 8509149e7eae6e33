"""Alembic environment of the run store: always run by gpuhealth.history.store on a connection
it opened (and locked), never from an alembic.ini."""

from alembic import context

from gpuhealth.history.store import METADATA

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=METADATA,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters tables by copying
)
with context.begin_transaction():
    context.run_migrations()
