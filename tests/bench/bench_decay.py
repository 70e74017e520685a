"""Decay-sweep throughput: bulk-load N facts (set-based), run shared.maintenance.decay_sweep, print rows/s.

    python tests/bench/bench_decay.py --facts 1000000 [--batch 5000] [--database-url URL] [--keep]
    python tests/bench/bench_decay.py --facts 200000 --batch 1000,5000,20000 --probe   # choose DECAY_BATCH
    python tests/bench/bench_decay.py --facts 0 --episodes 200000 --batch 1000,5000   # choose CLEANUP_BATCH
    python tests/bench/bench_decay.py --facts 0 --events 2000000   # events cleanup: partition drop vs row DELETE

Without --database-url it creates a throwaway database on the embedded PostgreSQL (.memory-butler/bench-pgdata).
Confirm ages are uniform in [0, 60) days and permanence follows a plausible mix, so about a tenth of the
facts change band on the first sweep. With several batch sizes, each later size starts from the facts reset
to active (a dirtier table: compare sizes with --probe, which interleaves single rolled-back batches).
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shared import maintenance, partitions  # noqa: E402
from shared.config import load_settings  # noqa: E402
from tests.bench.common import bench_engine, reference_line, run_benchmark  # noqa: E402

NOW = datetime(2026, 6, 1, 3, 0, tzinfo=UTC)
VEC = "[" + ",".join(["0.1"] * 384) + "]"
TENANTS = 100

# permanence by bucket of 20 (permanent 10%, stable 30%, standard 35%, volatile 15%, ephemeral 10%).
LOAD_SQL = """
INSERT INTO facts (id, tenant_id, subject, predicate, content, embedding, permanence, decay_rate, confidence,
                   last_confirmed_at, created_at)
SELECT gen_random_uuid(), 'bench-' || (g % :tenants), 'subject ' || (g % 997), 'predicate ' || g,
       'bench fact number ' || g || ' about subject ' || (g % 997), CAST(:vec AS vector), p.permanence,
       p.rate, 0.6 + random() * 0.4, CAST(:now AS timestamptz) - random() * interval '60 days',
       CAST(:now AS timestamptz) - interval '61 days'
FROM generate_series(1, :n) g
CROSS JOIN LATERAL (SELECT CASE WHEN g % 20 < 2 THEN 'permanent' WHEN g % 20 < 8 THEN 'stable'
                               WHEN g % 20 < 15 THEN 'standard' WHEN g % 20 < 18 THEN 'volatile'
                               ELSE 'ephemeral' END AS permanence) q
CROSS JOIN LATERAL (SELECT q.permanence, CASE q.permanence WHEN 'permanent' THEN 0.0 WHEN 'stable' THEN 0.002
                               WHEN 'standard' THEN 0.008 WHEN 'volatile' THEN 0.03 ELSE 0.1 END AS rate) p"""


def ensure_tenants(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO tenants (id) SELECT 'bench-' || g FROM generate_series(0, :k - 1) g ON CONFLICT DO NOTHING"
            ),
            {"k": TENANTS},
        )


def load(engine: Engine, n: int, chunk: int = 100_000) -> float:
    """Insert n facts in chunks of generate_series; returns seconds."""
    started = time.monotonic()
    done = 0
    while done < n:
        size = min(chunk, n - done)
        with engine.begin() as conn:
            sql = LOAD_SQL.replace("generate_series(1, :n)", f"generate_series({done + 1}, {done + size})")
            conn.execute(text(sql), {"tenants": TENANTS, "vec": VEC, "now": NOW})
        done += size
        print(f"  loaded {done:,} facts ({time.monotonic() - started:.0f} s)", flush=True)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE facts"))
    return time.monotonic() - started


# 10 tenants; a quarter of the episodes expired, 80% consolidated: expiry and capacity both have work.
EPISODES_SQL = """
INSERT INTO episodes (id, tenant_id, butler, seq, content, embedding, consolidation_status, created_at, expires_at)
SELECT gen_random_uuid(), 'bench-' || (g % 10), 'bench', g, 'bench episode ' || g, CAST(:vec AS vector),
       CASE WHEN g % 5 = 0 THEN 'pending' ELSE 'consolidated' END,
       CAST(:now AS timestamptz) - (g % 1000) * interval '1 minute',
       CAST(:now AS timestamptz) + CASE WHEN g % 4 = 0 THEN interval '-1 day' ELSE interval '7 days' END
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) g"""


def load_episodes(engine: Engine, n: int, chunk: int = 50_000) -> None:
    """Replace every episode with n fresh ones (the same work for each batch size)."""
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM episodes"))
    for first in range(1, n + 1, chunk):
        last = min(n, first + chunk - 1)
        with engine.begin() as conn:
            conn.execute(text(EPISODES_SQL), {"vec": VEC, "now": NOW, "first": first, "last": last})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE episodes"))


def cleanup(engine: Engine, n: int, batch: int) -> None:
    started = time.monotonic()
    summary = maintenance.episode_cleanup(engine, now=NOW, settings=load_settings(), batch=batch)
    seconds = time.monotonic() - started
    deleted = summary["expired_deleted"] + summary["capacity_deleted"]
    print(
        f"cleanup batch={batch:>6}: {deleted:,} of {n:,} episodes deleted in {seconds:.1f} s "
        f"= {deleted / seconds:,.0f} rows/s: {summary}",
        flush=True,
    )


# Events spread evenly over the 12 months before NOW, over the bench tenants.
EVENTS_SQL = """
INSERT INTO memory_events (tenant_id, event_type, entity_type, entity_id, occurred_at, actor, payload)
SELECT 'bench-' || (g % :tenants), 'fact.stored', 'fact', gen_random_uuid(),
       CAST(:now AS timestamptz) - (g % 365) * interval '1 day' - interval '1 hour', 'bench',
       jsonb_build_object('seq', g, 'content', 'bench event ' || g)
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) g"""


def events_cleanup(engine: Engine, n: int, chunk: int = 200_000) -> None:
    """Load n events over a year; time a row DELETE of the months past a 180-day retention (rolled back, trigger
    off: what a row-wise cleanup would cost) against the partition task dropping the same months."""
    with engine.begin() as conn:
        for month in range(13):
            partitions.create_month(conn, month=partitions.add_months(partitions.month_start(NOW), -month))
    for first in range(1, n + 1, chunk):
        with engine.begin() as conn:
            conn.execute(
                text(EVENTS_SQL), {"tenants": TENANTS, "now": NOW, "first": first, "last": min(n, first + chunk - 1)}
            )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE memory_events"))
    settings = load_settings(schedule={"events_retention_days": 180})
    with engine.connect() as conn:
        names = partitions.expired(partitions.existing(conn), now=NOW, retention_days=180)
    bounds = {"hi": partitions.add_months(partitions.partition_month(names[-1]), 1)}
    with engine.connect() as conn:
        tx = conn.begin()
        conn.execute(text("ALTER TABLE memory_events DISABLE TRIGGER trg_memory_events_append_only"))
        started = time.monotonic()
        rows = conn.execute(text("DELETE FROM memory_events WHERE occurred_at < :hi"), bounds).rowcount
        deleted_in = time.monotonic() - started
        tx.rollback()
    started = time.monotonic()
    summary = maintenance.event_partitions(engine, now=NOW, settings=settings)
    dropped_in = time.monotonic() - started
    print(
        f"events cleanup: {rows:,} of {n:,} events past 180 days: row DELETE {deleted_in:.1f} s "
        f"({rows / deleted_in:,.0f} rows/s); partition drop of {len(summary['dropped'])} months {dropped_in:.2f} s: "
        f"{summary}",
        flush=True,
    )


def reset(engine: Engine) -> None:
    """Put every fact back to active and drop the sweep's events, so another batch size sees the same work."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE facts SET validity = 'active' WHERE validity <> 'active'"))
        conn.execute(text("ALTER TABLE memory_events DISABLE TRIGGER trg_memory_events_append_only"))
        conn.execute(text("DELETE FROM memory_events WHERE actor = 'decay_sweep'"))
        conn.execute(text("ALTER TABLE memory_events ENABLE TRIGGER trg_memory_events_append_only"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE facts"))
        conn.execute(text("VACUUM ANALYZE memory_events"))


def sweep(engine: Engine, n: int, batch: int) -> dict:
    settings = load_settings()
    started = time.monotonic()
    summary = maintenance.decay_sweep(engine, now=NOW, settings=settings, batch=batch)
    seconds = time.monotonic() - started
    changed = sum(v for k, v in summary.items() if k.startswith(("fact.", "rule.")))
    print(
        f"batch={batch:>6}: {n:,} facts in {seconds:.1f} s = {n / seconds:,.0f} rows/s, "
        f"{summary['batches']} batches, {changed:,} changed ({100 * changed / n:.1f}%): {summary}",
        flush=True,
    )
    return summary


def probe(engine: Engine, sizes: list[int], rounds: int = 5) -> None:
    """Per-row cost of single batches, sizes interleaved, each rolled back: fair under a noisy machine."""
    settings = load_settings()
    costs: dict[int, list[float]] = {b: [] for b in sizes}
    for _ in range(rounds):
        for b in sizes:
            start = uuid.UUID(int=random.getrandbits(126))  # in the first quarter of ids: a full page follows
            with engine.connect() as conn:
                tx = conn.begin()
                started = time.perf_counter()
                _, summary = maintenance.decay_sweep_batch(
                    conn,
                    kind="fact",
                    after_id=start,
                    batch=b,
                    now=NOW,
                    facts_cfg=settings.memory.facts,
                    rules_cfg=settings.memory.rules,
                )
                costs[b].append((time.perf_counter() - started) / summary["facts_scanned"] * 1e6)
                tx.rollback()
    for b in sizes:
        median = statistics.median(costs[b])
        print(
            f"probe batch={b:>6}: median {median:.1f} us/row (min {min(costs[b]):.1f}, max {max(costs[b]):.1f}), "
            f"~{median * b / 1000:.0f} ms a batch",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--facts", type=int, default=1_000_000)
    parser.add_argument("--batch", default=str(maintenance.DECAY_BATCH), help="one size, or several: 1000,5000")
    parser.add_argument("--episodes", type=int, default=0, help="also time episode_cleanup on this many")
    parser.add_argument("--events", type=int, default=0, help="also time the events cleanup on this many")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--keep", action="store_true", help="keep the throwaway database")
    parser.add_argument("--probe", action="store_true", help="also time single batches per size, rolled back")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    sizes = [int(b) for b in args.batch.split(",")]
    print(reference_line(), flush=True)
    with bench_engine(args.database_url, keep=args.keep) as engine:
        ensure_tenants(engine)
        for size in sizes if args.episodes else ():
            load_episodes(engine, args.episodes)
            cleanup(engine, args.episodes, size)
        if args.events:
            events_cleanup(engine, args.events)
        if not args.facts:
            return 0
        print(f"loading {args.facts:,} facts ...", flush=True)
        print(f"loaded in {load(engine, args.facts):.0f} s", flush=True)
        if args.probe:
            probe(engine, sizes)
        for i, size in enumerate(sizes):
            if i:
                reset(engine)
            sweep(engine, args.facts, size)
            print("  again (nothing left to change, the steady daily cost of a scan):", flush=True)
            sweep(engine, args.facts, size)
    return 0


if __name__ == "__main__":
    run_benchmark(main)
