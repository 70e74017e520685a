"""What tracing costs a read: memory_search and memory_context through the real front, tracing off or on.

    python tests/bench/bench_tracing.py [--calls 300] [--facts 50] [--traced] [--redis-url URL] [--database-url URL]

Starts the embedded PostgreSQL (stopped at exit) with a throwaway database (or uses --database-url, migrated), a
front in this process (uvicorn in a
thread, as tests/api do), stores --facts facts through it and applies them in-process, then times --calls calls
of each read tool, one MCP session, back to back. ``--traced`` turns tracing on with an in-memory exporter (every
span recorded, none shipped). Compare a run of this commit with one of the commit before tracing for "off".
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx2  # noqa: E402
from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from shared import db  # noqa: E402
from shared.config import load_settings  # noqa: E402
from tests.api.conftest import Front, new_tenant, new_token  # noqa: E402
from tests.bench.common import BENCH_REDIS_URL  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PGDATA = ROOT / ".memory-butler" / "bench-pgdata"


async def timed_calls(url: str, token: str, calls: int, facts: int) -> dict[str, list[float]]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                for n in range(facts):
                    await session.call_tool(
                        "memory_store_fact",
                        {"subject": "user", "predicate": f"likes_{n}", "content": f"The user likes thing number {n}"},
                    )
                await asyncio.to_thread(apply_all)
                out: dict[str, list[float]] = {}
                for tool, args in (
                    ("memory_search", {"query": "what does the user like"}),
                    ("memory_context", {"trigger_prompt": "what does the user like", "butler": "general"}),
                ):
                    for _ in range(10):  # warm-up: prepared statements, the embedder's first calls
                        await session.call_tool(tool, args)
                    times = []
                    for _ in range(calls):
                        started = time.perf_counter()
                        result = await session.call_tool(tool, args)
                        times.append(time.perf_counter() - started)
                        assert not result.is_error, result
                    out[tool] = times
                return out


_apply = None


def apply_all() -> None:
    assert _apply is not None
    _apply()


def main() -> None:
    global _apply
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--facts", type=int, default=50)
    parser.add_argument("--traced", action="store_true", help="tracing on (in-memory exporter)")
    parser.add_argument("--redis-url", default=BENCH_REDIS_URL, help="flushed before and after (wake-ups land there)")
    parser.add_argument("--database-url", help="a migrated database to use as is (default: a throwaway one)")
    args = parser.parse_args()
    import redis

    broker = redis.Redis.from_url(args.redis_url)
    broker.flushdb()

    if args.database_url:
        admin, name, url = None, None, args.database_url
    else:
        admin = make_url(db.start_embedded_postgres(PGDATA, stop_at_exit=True)).set(database="postgres")
        name = f"mb_bench_tracing_{uuid.uuid4().hex[:8]}"
        db.ensure_database(admin.render_as_string(hide_password=False), name)
        url = admin.set(database=name).render_as_string(hide_password=False)
    try:
        db.migrate(url)
        settings = load_settings(database_url=url, redis_url=args.redis_url)
        if args.traced:
            from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

            from shared import tracing

            exporter = InMemorySpanExporter()
            tracing.setup(settings.tracing, role="front", exporter=exporter)
        engine = db.engine_for(url)
        tenant = new_tenant(engine)
        token = new_token(engine, tenant, ["general"])

        def apply() -> None:
            from memory_workers.tasks import build_runtime
            from memory_workers.tasks.ingest import apply_pending
            from shared.writes import Actor

            apply_pending(build_runtime(settings), tenant_id=tenant, butler="general", actor=Actor("bench"))

        _apply = apply
        with Front(settings) as front:
            results = asyncio.run(timed_calls(front.url, token, args.calls, args.facts))
        if args.traced:
            finished = exporter.get_finished_spans()
            reads = {s.context.trace_id for s in finished if s.name in {f"tools/call {t}" for t in results}}
            in_reads = [s for s in finished if s.context.trace_id in reads]
            print(f"spans per read call: {len(in_reads) / max(1, len(reads)):.1f} (the client's MCP span included)")
        for tool, times in results.items():
            ms = sorted(t * 1000 for t in times)
            print(
                f"{tool:15} traced={args.traced!s:5} n={len(ms)} mean={statistics.fmean(ms):.2f} ms "
                f"p50={ms[len(ms) // 2]:.2f} ms p95={ms[int(len(ms) * 0.95)]:.2f} ms"
            )
    finally:
        broker.flushdb()
        db.engine_for.cache_clear()
        if admin is None:
            return
        engine = create_engine(admin.render_as_string(hide_password=False), isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


if __name__ == "__main__":
    main()
