"""Shared plumbing for the benchmark scripts: a throwaway, migrated database, the machine-speed line
(``shared.embedding.reference_line``), and an entry point that cleans up when the run is stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from shared import db
from shared.embedding import reference_line as reference_line  # printed by every benchmark and the load test

ROOT = Path(__file__).resolve().parents[2]
BENCH_PGDATA = ROOT / ".memory-butler" / "bench-pgdata"
# The benchmarks' own Redis database: emptied before and after each run (see bench_redis).
BENCH_REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")


def run_benchmark(main: Callable[[], int | None]) -> NoReturn:
    """A benchmark's entry point: SIGTERM (``timeout``, a supervisor) then unwinds it as Ctrl-C does, so its
    ``finally`` blocks stop the front and workers it started, drop its throwaway database and flush its Redis
    database, and ``atexit`` stops the embedded server. Python's default ends it on the spot, leaving them running."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    sys.exit(main())


@contextlib.contextmanager
def bench_redis(url: str = BENCH_REDIS_URL) -> Iterator[str]:
    """The benchmarks' Redis database, flushed before and after: queued messages a run leaves are its own."""
    import redis

    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


@contextlib.contextmanager
def bench_engine(database_url: str | None = None, *, keep: bool = False) -> Iterator[Engine]:
    """A migrated database: ``database_url`` as given, or a fresh one on the embedded server (dropped after)."""
    if database_url:
        db.migrate(database_url)
        yield db.make_engine(database_url, pool_size=20)
        return
    admin = make_url(db.start_embedded_postgres(BENCH_PGDATA, stop_at_exit=True)).set(database="postgres")
    admin_url = admin.render_as_string(hide_password=False)
    name = f"mb_bench_{uuid.uuid4().hex[:8]}"
    db.ensure_database(admin_url, name)
    url = admin.set(database=name).render_as_string(hide_password=False)
    db.migrate(url)
    engine = db.make_engine(url, pool_size=20)
    try:
        yield engine
    finally:
        engine.dispose()
        if not keep:
            admin_engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
            with admin_engine.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin_engine.dispose()
