"""Drain and consolidation throughput beside the raw embedding throughput, measured in the same run.

    python tests/bench/bench_drain.py [--episodes 10000] [--workers 2] [--tenants 10] [--butlers 3]
                                      [--texts synthetic|realmem] [--database-url URL] [--redis-url URL]

--texts synthetic (the default): short generated episodes of no session. --texts realmem: conversation turns, the
first turns of RealMem personas 1, 2, ... (one per tenant, one butler, in order, each with its session and time),
so every turn also gets its contextual vector and a long one its window vectors, as a chat import would.

1. raw: the configured embedding backend embeds the same episode texts in batches, in this process (1 thread);
2. accepts N episodes straight into the intake (no front: this measures the worker plane alone);
3. starts W real `celery worker` processes on every shard queue, wakes every key, and times until every
   intent is applied (drain) and every episode is consolidated with the heuristic extractor.
Uses its own Redis database (--redis-url, default 15 or BENCH_REDIS_URL; flushed before and after) and a
throwaway database on the embedded PostgreSQL unless --database-url names one.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from memory_api.loadtest.generator import episode_text  # noqa: E402
from shared.config import load_settings  # noqa: E402
from shared.embedding import get_embedder  # noqa: E402
from shared.intake import WriteRequest, accept  # noqa: E402
from shared.schemas import MAX_CONTENT, EpisodeWrite  # noqa: E402
from shared.sharding import MAINTENANCE_QUEUE, shard_queues  # noqa: E402
from tests.bench.common import BENCH_REDIS_URL, bench_engine, bench_redis, run_benchmark  # noqa: E402


def texts_for(n: int, butlers: int) -> list[str]:
    rng = random.Random(42)
    return [episode_text(rng, f"butler{i % butlers}") for i in range(n)]


def realmem_episodes(n: int, tenants: int) -> list[tuple[str, dict]]:
    """(tenant, EpisodeWrite payload) for the first ``n`` turns, split over ``tenants`` personas, each in order."""
    from tests.bench import conversations as rm

    per = -(-n // tenants)
    out = []
    for t in range(tenants):
        for turn in rm.load(t % 10 + 1).turns[:per]:
            payload = {
                "content": turn.content[:MAX_CONTENT],
                "butler": "assistant",
                "session_id": str(turn.session_id),
                "occurred_at": turn.occurred_at.isoformat(),
            }
            out.append((f"drain-{t:02d}", EpisodeWrite.model_validate(payload).model_dump(mode="json")))
    return out[:n]


def raw_embedding_rate(texts: list[str]) -> float:
    embedder = get_embedder()
    embedder.embed(texts[:64])  # warm
    t0 = time.perf_counter()
    for start in range(0, len(texts), 256):  # the worker's ingest batch size
        embedder.embed(texts[start : start + 256])
    return len(texts) / (time.perf_counter() - t0)


def synthetic_episodes(texts: list[str], tenants: int, butlers: int) -> list[tuple[str, dict]]:
    keys = [(f"drain-{t:02d}", f"butler{b}") for t in range(tenants) for b in range(butlers)]
    return [
        (keys[i % len(keys)][0], {"content": body, "butler": keys[i % len(keys)][1]}) for i, body in enumerate(texts)
    ]


def accept_all(engine, episodes: list[tuple[str, dict]]) -> list[tuple[str, str]]:  # noqa: ANN001
    """Every (tenant, payload) straight into the intake, in order; returns the (tenant, butler) keys to wake."""
    keys = sorted({(tenant, payload["butler"]) for tenant, payload in episodes})
    with engine.begin() as conn:
        for tenant in {k[0] for k in keys}:
            conn.execute(text("INSERT INTO tenants (id) VALUES (:t) ON CONFLICT DO NOTHING"), {"t": tenant})
    for start in range(0, len(episodes), 500):
        by_tenant: dict[str, list[WriteRequest]] = {}
        for tenant, payload in episodes[start : start + 500]:
            by_tenant.setdefault(tenant, []).append(WriteRequest("episode", payload["butler"], payload, None))
        with engine.begin() as conn:
            for tenant, writes in by_tenant.items():
                accept(conn, tenant_id=tenant, writes=writes, actor="bench", request_id=None)
    return keys


def start_workers(n: int, database_url: str, redis_url: str, shard_count: int) -> list[subprocess.Popen]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "MEMORY_BUTLER_WORKERS__SHARD_COUNT": str(shard_count),
    }
    queues = ",".join([*shard_queues(shard_count), MAINTENANCE_QUEUE])
    return [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "memory_workers.app:app",
                "worker",
                "--concurrency",
                "1",
                "--loglevel",
                "WARNING",
                "-Q",
                queues,
                "--hostname",
                f"drain{i}@%h",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for i in range(n)
    ]


def wait_ready(app, n: int, deadline_s: float = 120) -> None:  # noqa: ANN001
    """Until ``n`` workers answer a ping (their model is loaded once the pool is up)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < deadline_s:
        if len(app.control.ping(timeout=1.0) or []) >= n:
            return
    raise TimeoutError("workers did not start")


def wait_for(engine, sql: str, *, deadline_s: float, every_s: float = 0.25) -> float:  # noqa: ANN001
    """Seconds until ``sql`` returns 0."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < deadline_s:
        with engine.connect() as conn:
            if conn.execute(text(sql)).scalar() == 0:
                return time.perf_counter() - t0
        time.sleep(every_s)
    raise TimeoutError(sql)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--butlers", type=int, default=3)
    parser.add_argument(
        "--texts", choices=("synthetic", "realmem"), default="synthetic", help="what the episodes say (see above)"
    )
    parser.add_argument("--database-url", help="a database to use (migrated, not dropped); default: a throwaway one")
    parser.add_argument("--redis-url", default=BENCH_REDIS_URL, help="flushed before and after")
    args = parser.parse_args()
    settings = load_settings()
    if args.texts == "realmem":
        episodes = realmem_episodes(args.episodes, args.tenants)
    else:
        episodes = synthetic_episodes(texts_for(args.episodes, args.butlers), args.tenants, args.butlers)
    texts = [payload["content"] for _, payload in episodes]
    raw = raw_embedding_rate(texts)
    print(f"raw embedding ({get_embedder().backend}, 1 thread, batches of 256): {raw:.0f} episodes/s")
    with bench_redis(args.redis_url), bench_engine(args.database_url) as engine:
        url = engine.url.render_as_string(hide_password=False)
        keys = accept_all(engine, episodes)
        workers = start_workers(args.workers, url, args.redis_url, settings.workers.shard_count)
        try:
            from memory_workers import app as worker_app
            from memory_workers.enqueue import wake_apply

            bench_settings = load_settings(redis_url=args.redis_url, database_url=url)
            worker_app.configure(worker_app.app, bench_settings)
            wait_ready(worker_app.app, args.workers)
            for tenant, butler in keys:
                wake_apply(tenant, butler, settings=bench_settings)
            drain_s = wait_for(engine, "SELECT count(*) FROM write_intents WHERE status = 'pending'", deadline_s=1800)
            consolidated_s = wait_for(
                engine, "SELECT count(*) FROM episodes WHERE consolidation_status <> 'consolidated'", deadline_s=1800
            )
        finally:
            for w in workers:
                os.killpg(w.pid, signal.SIGTERM)
            for w in workers:
                w.wait(timeout=60)
        with engine.connect() as conn:
            facts = conn.execute(text("SELECT count(*) FROM facts")).scalar()
            rules = conn.execute(text("SELECT count(*) FROM rules")).scalar()
    drain = args.episodes / drain_s
    print(
        f"drain: {args.episodes} episodes applied with embeddings in {drain_s:.1f}s by {args.workers} worker(s) "
        f"= {drain:.0f} episodes/s = {drain / raw:.0%} of raw"
    )
    print(
        f"consolidated (heuristic) {consolidated_s:.1f}s after the drain ended: "
        f"{args.episodes / (drain_s + consolidated_s):.0f} episodes/s end to end; {facts} facts, {rules} rules"
    )
    return 0


if __name__ == "__main__":
    run_benchmark(main)
