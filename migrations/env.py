"""Alembic environment: runs migrations under a session advisory lock so concurrent starters don't race."""

from alembic import context
from sqlalchemy import create_engine, text

from shared.models import metadata

MIGRATION_LOCK = 7_318_442_001  # arbitrary constant shared by every process that migrates


def run_migrations_online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url is not None, "shared.db.alembic_config sets sqlalchemy.url"
    engine = create_engine(url)
    with engine.connect() as connection:
        connection.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK})
        connection.commit()
        try:
            context.configure(connection=connection, target_metadata=metadata, transaction_per_migration=True)
            with context.begin_transaction():
                context.run_migrations()
            connection.commit()
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK})
            connection.commit()
    engine.dispose()


run_migrations_online()
