"""In-process read latency at scale: p50/p95 of memory_search, memory_recall and memory_context.

    python tests/bench/bench_latency.py [--facts 100000] [--rules 20000] [--tenants 100] [--queries 300] [--phases]

Single client, through shared.reads.Reader (the code path the MCP tools call), with the query embedding timed
on its own. Without --database-url a throwaway database on the embedded PostgreSQL is used. ``--phases`` also
prints when each phase of a memory_context call starts and ends (medians, from the call's start).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shared import candidates, retrieval  # noqa: E402
from shared import context as context_builder  # noqa: E402
from shared.config import load_settings  # noqa: E402
from shared.embedding import get_embedder, get_query_embedder, get_token_counter  # noqa: E402
from shared.reads import Reader  # noqa: E402
from shared.writes import Visibility  # noqa: E402
from tests.bench.common import bench_engine, run_benchmark  # noqa: E402
from tests.bench.corpus import corpus_tenants, questions  # noqa: E402


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(np.array(values) * 1000, p))


class Phases:
    """When each phase of a memory_context call starts and ends, from the call's start (``--phases``)."""

    # A context read makes the hits its block shows as the block takes them: "context block" includes them.
    WRAPPED = {
        "gather statement": (candidates, "gather"),
        "ranking": (retrieval, "_ordered"),
        "context block": (context_builder, "build"),
    }

    def __init__(self) -> None:
        self.t0: float | None = None
        self.call: dict[str, tuple[float, float]] = {}
        self.calls: list[dict[str, tuple[float, float]]] = []
        for label, (module, name) in self.WRAPPED.items():
            setattr(module, name, self.timed(label, getattr(module, name)))

    def timed(self, label: str, func: Callable) -> Callable:
        def run(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                if self.t0 is not None:
                    self.call[label] = (start - self.t0, time.perf_counter() - self.t0)

        return run

    def begin(self) -> None:
        self.t0, self.call = time.perf_counter(), {}

    def end(self) -> None:
        self.call["total"] = (0.0, time.perf_counter() - self.t0)
        self.calls.append(self.call)
        self.t0 = None

    def report(self) -> None:
        print("\nmemory_context phases (medians, ms from the call's start)")
        for label in ("query embedding", *self.WRAPPED, "total"):
            spans = [call[label] for call in self.calls if label in call]
            start, end = (statistics.median(s[i] for s in spans) * 1000 for i in (0, 1))
            print(f"{label:<22}{start:>9.1f}{end:>9.1f}")


def measure(reader: Reader, tenants: list[str], qs: list[str], phases: Phases | None = None) -> dict[str, list[float]]:
    rng = random.Random(3)
    view = Visibility(scopes=("global", "health"), butlers=("health",))
    out: dict[str, list[float]] = {"search": [], "recall": [], "context": []}
    calls = {
        "search": lambda t, q: reader.search(
            tenant_id=t,
            visibility=view,
            query=q,
            types=["fact", "rule", "episode"],
            mode="hybrid",
            limit=20,
            min_confidence=None,
        ),
        "recall": lambda t, q: reader.recall(tenant_id=t, visibility=view, topic=q, limit=20),
        "context": lambda t, q: reader.context(tenant_id=t, visibility=view, trigger_prompt=q, token_budget=3000),
    }
    for q in qs:
        for name, call in calls.items():
            # A tenant per call: the same tenant three times in a row would let the second and third calls find
            # the first one's pages in shared buffers.
            tenant = rng.choice(tenants)
            traced = phases is not None and name == "context"
            if traced:
                phases.begin()
            t0 = time.perf_counter()
            call(tenant, q)
            out[name].append(time.perf_counter() - t0)
            if traced:
                phases.end()
    return out


def _timed(embed, text: str) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    embed(text)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--facts", type=int, default=100_000)
    parser.add_argument("--rules", type=int, default=20_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--database-url")
    parser.add_argument("--reuse", action="store_true", help="the database already holds the corpus: skip loading")
    parser.add_argument("--phases", action="store_true", help="also time the phases of memory_context")
    args = parser.parse_args()
    phases = Phases() if args.phases else None
    embedder = get_query_embedder()
    embed_times: list[float] = []

    def timed_embed(q: str):  # noqa: ANN202
        t0 = time.perf_counter()
        v = embedder.embed_one(q)
        embed_times.append(time.perf_counter() - t0)
        return v

    with bench_engine(args.database_url) as engine:
        tenants = corpus_tenants(engine, reuse=args.reuse, facts=args.facts, rules=args.rules, tenants=args.tenants)
        reader = Reader(
            engine=engine,
            settings=load_settings(),
            embed=phases.timed("query embedding", timed_embed) if phases else timed_embed,
            count_tokens=get_token_counter().count_many,
        )
        qs = questions(random.Random(5), args.queries)
        measure(reader, tenants, qs[:30])  # warm the pool and the caches
        # The machine's speed now (it varies by ±50% here from hour to hour): the embedding on one thread, alone;
        # then the read path's query embedding (``embedding.query_threads``), alone.
        reference = [_timed(get_embedder().embed_one, q) for q in qs[:100]]
        alone = [_timed(embedder.embed_one, q) for q in qs[:100]]
        embed_times.clear()
        results = measure(reader, tenants, qs, phases)
    print(
        f"\n{args.facts} facts + {args.rules} rules across {args.tenants} tenants, {args.queries} queries, "
        f"single client, in-process ({datetime.now(timezone.utc):%Y-%m-%d})"
    )
    print(f"{'call':<22}{'p50 ms':>9}{'p95 ms':>9}")
    print(
        f"{'embedding, 1 thread':<22}{pct(reference, 50):>9.1f}{pct(reference, 95):>9.1f}   (reference: machine speed)"
    )
    print(
        f"{'query embedding':<22}{pct(alone, 50):>9.1f}{pct(alone, 95):>9.1f}   "
        f"(alone, {load_settings().embedding.query_threads} threads)"
    )
    print(
        f"{'query embedding, read':<22}{pct(embed_times, 50):>9.1f}{pct(embed_times, 95):>9.1f}   "
        "(in reads: on its own thread, beside the transaction)"
    )
    for name, values in results.items():
        print(f"{'memory_' + name + ' (total)':<22}{pct(values, 50):>9.1f}{pct(values, 95):>9.1f}")
    if phases:
        phases.report()
    return 0


if __name__ == "__main__":
    run_benchmark(main)
