"""Shared fixtures: a real PostgreSQL 18 + pgvector (embedded, or TEST_DATABASE_URL) and the real Redis.

Each pytest run gets its own fresh database (dropped at the end) and its own Redis database number
(TEST_REDIS_DB, default 11), flushed before and after, so runs never see each other's data.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis as redis_lib
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from shared import db
from tests.typecheck import MYPY, TEST_NAME, start_mypy

ROOT = Path(__file__).resolve().parent.parent
TEST_PGDATA = Path(os.environ.get("TEST_PGDATA", ROOT / ".memory-butler" / "test-pgdata"))
TEST_REDIS_URL = os.environ.get("TEST_REDIS_URL", f"redis://127.0.0.1:6379/{os.environ.get('TEST_REDIS_DB', '11')}")


@pytest.fixture(scope="session")
def admin_url() -> str:
    """A superuser URL on the test server (embedded PostgreSQL unless TEST_DATABASE_URL is set)."""
    explicit = os.environ.get("TEST_DATABASE_URL")
    if explicit:
        return db.normalise_url(explicit)
    url = db.start_embedded_postgres(TEST_PGDATA, stop_at_exit=True)  # the suite leaves no server running
    return make_url(url).set(database="postgres").render_as_string(hide_password=False)


def _create_db(admin_url: str, name: str) -> str:
    db.ensure_database(admin_url, name)
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def _drop_db(admin_url: str, name: str) -> None:
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    engine.dispose()


@pytest.fixture(scope="session")
def database_url(admin_url: str) -> Iterator[str]:
    """A migrated, empty database for this pytest run."""
    name = f"mb_test_{uuid.uuid4().hex[:10]}"
    url = _create_db(admin_url, name)
    db.migrate(url)
    yield url
    db.engine_for.cache_clear()
    _drop_db(admin_url, name)


@pytest.fixture()
def empty_database_url(admin_url: str) -> Iterator[str]:
    """A brand-new database with no schema (for migration round trips)."""
    name = f"mb_empty_{uuid.uuid4().hex[:10]}"
    yield _create_db(admin_url, name)
    _drop_db(admin_url, name)


@pytest.fixture(scope="session")
def engine(database_url: str) -> Engine:
    return db.engine_for(database_url)


@pytest.fixture()
def conn(engine: Engine) -> Iterator:
    """A connection inside a transaction that is rolled back after the test."""
    with engine.connect() as connection:
        trans = connection.begin()
        try:
            yield connection
        finally:
            trans.rollback()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    client = redis_lib.Redis.from_url(TEST_REDIS_URL)
    client.ping()
    client.flushdb()
    yield TEST_REDIS_URL
    client.flushdb()
    client.close()


@pytest.fixture()
def tenant(conn) -> str:
    """A fresh tenant inside the test's transaction."""
    tenant_id = f"t-{uuid.uuid4().hex[:12]}"
    conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant_id})
    return tenant_id


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run that holds the type check starts it now, to run beside the other tests (tests/typecheck.py)."""
    if any(item.name == TEST_NAME for item in session.items):
        session.config.stash[MYPY] = start_mypy()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The suite leaves no process behind: a type check still running (the run stopped early) is ended."""
    mypy = session.config.stash.get(MYPY, None)
    if mypy is not None and mypy.poll() is None:
        mypy.kill()
        mypy.communicate()
