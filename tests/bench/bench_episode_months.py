"""Episode cleanup before and after partitioning: one table row by row (0017) against months dropped whole (0018).

    python tests/bench/bench_episode_months.py --episodes 100000 [--database-url URL] [--keep]

Loads N chat-like episodes (24 words each, so ~24 postings; one in five with a second vector, one in twenty the
source of a fact) accepted over the six months before NOW, each with a 7-day TTL, over 10 tenants. Then, each on a
fresh load of the same rows:

1. at revision 0017 (one table, foreign keys cascading): the row-by-row expiry cleanup;
2. the upgrade to 0018 of that populated table (the migration's own cost);
3. at 0018, the row-by-row expiry cleanup alone (the delete trigger doing the foreign keys' work);
4. at 0018, the episode cleanup as the beat runs it: every wholly expired month dropped, the rest row by row.

Prints the reference line, then seconds and rows for each, and after each cleanup the VACUUM of episodes that
reclaims what it left. Without --database-url it creates a throwaway database
on the embedded PostgreSQL (.memory-butler/bench-pgdata).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shared import db, maintenance, partitions  # noqa: E402
from shared.config import load_settings  # noqa: E402
from tests.bench.common import bench_engine, reference_line, run_benchmark  # noqa: E402

NOW = datetime(2026, 6, 1, 3, 0, tzinfo=UTC)
VEC = "[" + ",".join(["0.1"] * 384) + "]"
BEFORE = "0017"

LOAD_SQL = """
INSERT INTO episodes (id, tenant_id, butler, seq, content, embedding, consolidation_status, created_at, expires_at)
SELECT gen_random_uuid(), 'bench-' || (g % 10), 'bench', g,
       (SELECT string_agg('w' || ((g * 7 + k * 131) % 4000), ' ') FROM generate_series(1, 24) k),
       CAST(:vec AS vector), 'consolidated', a.t, a.t + interval '7 days'
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) g,
     LATERAL (SELECT CAST(:now AS timestamptz) - (g % 180) * interval '1 day' - interval '1 hour' AS t) a"""
VECTORS_SQL = """
INSERT INTO episode_vectors (episode_id, n, tenant_id, butler, embedding)
SELECT id, 0, tenant_id, butler, embedding FROM episodes WHERE seq % 5 = 0"""
FACTS_SQL = """
INSERT INTO facts (id, tenant_id, subject, predicate, content, embedding, source_episode_id)
SELECT gen_random_uuid(), tenant_id, 'user', 'p' || seq, 'learned', embedding, id FROM episodes WHERE seq % 20 = 0"""
TABLES = ("episodes", "episode_terms", "episode_vectors", "facts", "rules")


def load(engine: Engine, n: int, *, partitioned: bool, chunk: int = 20_000) -> float:
    """Empty the tables and load n episodes with their postings, vectors and learners; returns seconds."""
    started = time.monotonic()
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(TABLES)}, rule_applications"))
        if partitioned:  # the six months before NOW, as the beat's task would have created them
            for i in range(7):
                month = partitions.add_months(partitions.month_start(NOW), -i)
                if partitions.partition_name(month, partitions.EPISODES) not in partitions.existing(
                    conn, partitions.EPISODES
                ):
                    partitions.create_month(conn, month=month, table=partitions.EPISODES)
    for first in range(1, n + 1, chunk):
        with engine.begin() as conn:
            conn.execute(text(LOAD_SQL), {"vec": VEC, "now": NOW, "first": first, "last": min(n, first + chunk - 1)})
    with engine.begin() as conn:
        conn.execute(text(VECTORS_SQL))
        conn.execute(text(FACTS_SQL))
    vacuum(engine)
    return time.monotonic() - started


def vacuum(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in TABLES:
            conn.execute(text(f"VACUUM ANALYZE {table}"))


def rows_only(engine: Engine) -> tuple[float, int]:
    """The expiry cleanup's row-by-row path alone: (seconds, rows)."""
    started = time.monotonic()
    dead_before = NOW - timedelta(days=30)
    batch = maintenance.CLEANUP_BATCH
    rows, _ = maintenance._drain(
        engine,
        lambda c: maintenance.delete_expired_batch(c, now=NOW, batch=batch, dead_before=dead_before),
        batch=batch,
    )
    return time.monotonic() - started, rows


def vacuum_episodes(engine: Engine) -> float:
    """Seconds for the VACUUM of episodes that reclaims what a cleanup left (dead tuples, index and graph entries)."""
    started = time.monotonic()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM episodes"))
    return time.monotonic() - started


def counts(engine: Engine) -> str:
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM episodes), (SELECT count(*) FROM episode_terms), "
                "(SELECT count(*) FROM episode_vectors), (SELECT count(*) FROM facts WHERE source_episode_id IS NOT NULL)"
            )
        ).one()
    return f"episodes {row[0]:,}, postings {row[1]:,}, vectors {row[2]:,}, sourced facts {row[3]:,}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the throwaway database")
    args = parser.parse_args(argv)
    n = args.episodes
    print(reference_line(), flush=True)
    with bench_engine(args.database_url, keep=args.keep) as engine:
        url = engine.url.render_as_string(hide_password=False)
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO tenants (id) SELECT 'bench-' || g FROM generate_series(0, 9) g "))
        db.downgrade(url, BEFORE)
        print(f"0017, one table: loaded in {load(engine, n, partitioned=False):.1f} s ({counts(engine)})", flush=True)
        seconds, rows = rows_only(engine)
        print(f"  row-by-row cleanup: {rows:,} episodes in {seconds:.1f} s ({counts(engine)} left)", flush=True)
        print(f"  then VACUUM episodes: {vacuum_episodes(engine):.1f} s", flush=True)
        load(engine, n, partitioned=False)
        started = time.monotonic()
        db.migrate(url, "head")
        print(f"upgrade to 0018 of {n:,} episodes: {time.monotonic() - started:.1f} s", flush=True)
        vacuum(engine)
        seconds, rows = rows_only(engine)
        print(f"0018, row-by-row cleanup alone: {rows:,} episodes in {seconds:.1f} s ({counts(engine)} left)")
        print(f"  then VACUUM episodes: {vacuum_episodes(engine):.1f} s", flush=True)
        print(f"0018: loaded in {load(engine, n, partitioned=True):.1f} s", flush=True)
        started = time.monotonic()
        summary = maintenance.episode_cleanup(engine, now=NOW, settings=load_settings())
        print(
            f"  episode cleanup: {summary['expired_month_rows']:,} episodes in "
            f"{len(summary['expired_months_dropped'])} months dropped + {summary['expired_deleted']:,} row by row "
            f"in {time.monotonic() - started:.1f} s ({counts(engine)} left)",
            flush=True,
        )
        print(f"  then VACUUM episodes: {vacuum_episodes(engine):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    run_benchmark(main)
