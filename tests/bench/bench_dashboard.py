"""Dashboard latency: the facts list and the fleet page of one tenant holding N facts (default 100k), through the
real front over HTTP on this machine (so each figure is server time plus a localhost round trip, ~1 ms).

    python tests/bench/bench_dashboard.py [--facts 100000] [--rules 5000] [--requests 200] [--database-url URL]

The fleet page is the four calls its script makes (/api/me, /api/butlers, /api/memory/health, /api/memory/activity),
timed back to back; the browser sends the last two side by side, so the page is faster than their sum.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from shared.config import load_settings  # noqa: E402
from shared.db import unit_of_work  # noqa: E402
from shared.tenancy import create_token  # noqa: E402
from tests.bench.common import BENCH_REDIS_URL, bench_engine, bench_redis, reference_line, run_benchmark  # noqa: E402
from tests.bench.corpus import SUBJECTS, TOPICS, load_corpus  # noqa: E402

FLEET_PAGE = (
    ("/api/me", {}),
    ("/api/butlers", {}),
    ("/api/memory/health", {}),
    ("/api/memory/activity", {"limit": 25}),
)


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(np.array(values) * 1000, p))


def _timed(n: int, call: Callable[[], None]) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return times


def scenarios(rng: random.Random) -> dict[str, Callable[[httpx.Client], None]]:
    """Each scenario makes the calls one screen makes; a non-200 answer stops the benchmark."""

    def get(client: httpx.Client, path: str, params: dict) -> None:
        response = client.get(path, params=params)
        response.raise_for_status()

    return {
        "facts list, first page": lambda c: get(c, "/api/memory/facts", {"limit": 50}),
        "facts, butler panel": lambda c: get(
            c, "/api/butlers/health/memory/facts", {"limit": 100, "validity": "active,fading,superseded"}
        ),
        "facts, by subject": lambda c: get(c, "/api/memory/facts", {"subject": rng.choice(SUBJECTS), "limit": 50}),
        "facts, words (q)": lambda c: get(c, "/api/memory/facts", {"q": rng.choice(TOPICS), "limit": 50}),
        "facts, page at 10k": lambda c: get(c, "/api/memory/facts", {"limit": 50, "offset": 10_000}),
        "health (stats+charts)": lambda c: get(c, "/api/memory/health", {}),
        "fleet page (4 calls)": lambda c: [get(c, path, params) for path, params in FLEET_PAGE] and None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--facts", type=int, default=100_000)
    parser.add_argument("--rules", type=int, default=5_000)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--database-url")
    parser.add_argument("--redis-url", default=BENCH_REDIS_URL, help="emptied before and after (no message is sent)")
    args = parser.parse_args()
    for noisy in ("httpx", "uvicorn.access", "memory_butler.dashboard"):  # one line per request otherwise
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from tests.api.conftest import Front  # the API tests' way of running the real front in this process

    with bench_redis(args.redis_url) as redis_url, bench_engine(args.database_url) as engine:
        (tenant,) = load_corpus(
            engine,
            facts=args.facts,
            rules=args.rules,
            tenants=1,
            distinct=1000,
            progress=lambda m: print(m, file=sys.stderr),
        )
        with unit_of_work(engine) as conn:
            _, token = create_token(conn, tenant_id=tenant, name="bench", butlers=["*"], role="admin")
        settings = load_settings(database_url=engine.url.render_as_string(hide_password=False), redis_url=redis_url)
        with (
            Front(settings) as front,
            httpx.Client(base_url=front.base, timeout=30, headers={"Authorization": f"Bearer {token}"}) as client,
        ):
            results = {}
            for label, scenario in scenarios(random.Random(7)).items():
                _timed(5, lambda: scenario(client))  # warm the pool, the plans and the caches
                results[label] = _timed(args.requests, lambda: scenario(client))
    print(
        f"\n{args.facts} facts + {args.rules} rules in one tenant (an admin token sees them all), "
        f"{args.requests} requests each, one client, HTTP to the front on this machine "
        f"({datetime.now(timezone.utc):%Y-%m-%d})"
    )
    print(reference_line())
    print(f"{'screen':<24}{'p50 ms':>9}{'p95 ms':>9}")
    for label, values in results.items():
        print(f"{label:<24}{pct(values, 50):>9.1f}{pct(values, 95):>9.1f}")
    return 0


if __name__ == "__main__":
    run_benchmark(main)
