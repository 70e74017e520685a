"""PostgreSQL's own time for the read path's candidate statement (``candidates.gather``), without the client.

    python tests/bench/bench_gather.py --database-url URL [--tenants 10] [--queries 10] [--repeat 5]

Runs on a database that already holds the latency corpus (``bench_latency.py`` loads it). For each tenant and
question it builds the statement exactly as a recall would (facts and rules, hybrid) and reads the server's
execution time from ``EXPLAIN (ANALYZE, TIMING OFF)``; also the semantic half and the keyword half alone.
Then this client's CPU to run the hybrid statement and read its rows in each result format (text, and the binary
format gather asks for: shared.db.BINARY_RESULTS), alternated call by call so both see the same machine.
Prints the medians in ms. To compare two versions of the statement, run this file in a checkout of each.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shared import candidates, db  # noqa: E402
from shared.embedding import get_query_embedder, to_pgvector  # noqa: E402
from tests.bench.common import reference_line  # noqa: E402
from tests.bench.corpus import questions  # noqa: E402

VARIANTS = {"hybrid (both halves)": (True, True), "semantic half": (True, False), "keyword half": (False, True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--queries", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=5, help="executions per tenant, question and variant")
    args = parser.parse_args()
    engine = db.make_engine(args.database_url)
    embedder = get_query_embedder()
    qs = questions(random.Random(5), args.queries)
    vectors = {q: to_pgvector(embedder.embed_one(q)) for q in qs}
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    fetch: dict[str, list[float]] = {"text": [], "binary": []}  # client CPU ms per execution, by result format
    with engine.connect() as conn:
        tenants = (
            conn.execute(text("SELECT id FROM tenants WHERE id LIKE 'lat-%' ORDER BY id LIMIT :n"), {"n": args.tenants})
            .scalars()
            .all()
        )
        if not tenants:
            parser.error("no corpus in this database: run tests/bench/bench_latency.py against it first")
        conn.execute(text(candidates.read_settings(pool=50, timeout_ms=10_000, generic_plans=True)))
        for tenant in tenants:
            f = candidates.Filter(tenant, ("global", "health"), ("health",), 0.05, datetime.now(timezone.utc))
            for q in qs:
                for name, (semantic, keyword) in VARIANTS.items():
                    statement, params = candidates.prepare(
                        conn,
                        kinds=("fact", "rule"),
                        f=f,
                        query=q,
                        pool=50,
                        query_vec=vectors[q] if semantic else None,
                        keyword=keyword,
                    )
                    sql = statement.text
                    for _ in range(args.repeat):
                        plan = conn.execute(
                            text("EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + sql), params
                        ).scalar_one()
                        times[name].append(plan[0]["Execution Time"])
                    if name == "hybrid (both halves)":
                        for i in range(args.repeat):
                            for fmt in ("text", "binary") if i % 2 else ("binary", "text"):
                                marked = statement.execution_options(**{db.BINARY_RESULTS: fmt == "binary"})
                                started = time.process_time()
                                conn.execute(marked, params).all()
                                fetch[fmt].append(1000 * (time.process_time() - started))
        conn.rollback()
    print("\n" + reference_line())
    print(
        f"gather statement, server execution time: {len(tenants)} tenants x {len(qs)} questions x "
        f"{args.repeat} ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)"
    )
    for name, values in times.items():
        p95 = sorted(values)[int(len(values) * 0.95)]
        print(f"{name:<22}{statistics.median(values):>8.2f} ms median  (p95 {p95:.2f})")
    print("hybrid statement, this client's CPU to run it and read its rows (executions alternated):")
    for fmt, values in fetch.items():
        print(f"{fmt + ' rows':<22}{statistics.median(values):>8.3f} ms median  ({len(values)} executions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
