"""Retrieval-quality benchmark: recall@1/5/10 and nDCG@10 per mode and question class.

    python tests/bench/bench_retrieval.py [--tenants 6] [--database-url URL]

Without --database-url it creates a throwaway database on the embedded PostgreSQL (.memory-butler/bench-pgdata).
"""

from __future__ import annotations

import argparse
import math
import sys
import uuid
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import Engine, text

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shared import writes  # noqa: E402
from shared.config import load_settings  # noqa: E402
from shared.consolidation_plan import fact_text  # noqa: E402
from shared.db import unit_of_work  # noqa: E402
from shared.embedding import get_embedder, get_query_embedder, get_token_counter  # noqa: E402
from shared.reads import Reader  # noqa: E402
from shared.schemas import FactWrite  # noqa: E402
from shared.writes import ALL, Actor  # noqa: E402
from tests.bench.retrieval_dataset import Memory, Question, generate  # noqa: E402

MODES = ("semantic", "keyword", "hybrid")
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)


def load(engine: Engine, memories: list[Memory], *, run: str) -> dict[str, uuid.UUID]:
    """Store every memory as a fact (one embedding call for all); returns key -> id."""
    embedder = get_embedder()
    vectors = embedder.embed([fact_text(m.subject, m.predicate, m.content) for m in memories])
    ids: dict[str, uuid.UUID] = {}
    with unit_of_work(engine) as conn:
        for tenant in sorted({m.tenant for m in memories}):
            conn.execute(text("INSERT INTO tenants (id) VALUES (:t) ON CONFLICT DO NOTHING"), {"t": f"{tenant}-{run}"})
        for memory, vector in zip(memories, vectors, strict=True):
            ids[memory.key] = uuid.uuid4()
            writes.store_fact(
                conn,
                tenant_id=f"{memory.tenant}-{run}",
                fact_id=ids[memory.key],
                vector=vector,
                write=FactWrite(subject=memory.subject, predicate=memory.predicate, content=memory.content),
                embedding_version_id=None,
                source_butler="bench",
                actor=Actor("bench"),
                now=NOW,
            )
    return ids


def evaluate(engine: Engine, *, tenants: int = 6, seed: int = 7) -> dict[str, dict[str, dict[str, float]]]:
    """{class: {mode: {recall@1, recall@5, recall@10, ndcg@10, n}}} over the generated set."""
    memories, questions = generate(tenants=tenants, seed=seed)
    run = uuid.uuid4().hex[:6]
    ids = load(engine, memories, run=run)
    settings = load_settings()
    reader = Reader(
        engine=engine,
        settings=settings,
        embed=get_query_embedder().embed_one,
        count_tokens=get_token_counter().count_many,
    )
    ranks: dict[tuple[str, str], list[int | None]] = defaultdict(list)
    for q in questions:
        for mode in MODES:
            hits = reader.search(
                tenant_id=f"{q.tenant}-{run}",
                visibility=ALL,
                query=q.text,
                types=["fact"],
                mode=mode,
                limit=10,
                min_confidence=0.0,
                now=NOW,
            )
            found = [h.id for h in hits]
            ranks[(q.kind, mode)].append(found.index(ids[q.relevant]) + 1 if ids[q.relevant] in found else None)
    return {kind: {mode: _metrics(ranks[(kind, mode)]) for mode in MODES} for kind in _kinds(questions)}


def _kinds(questions: list[Question]) -> list[str]:
    return sorted({q.kind for q in questions})


def _metrics(ranks: list[int | None]) -> dict[str, float]:
    n = len(ranks)
    return {
        "recall@1": sum(r is not None and r <= 1 for r in ranks) / n,
        "recall@5": sum(r is not None and r <= 5 for r in ranks) / n,
        "recall@10": sum(r is not None for r in ranks) / n,
        "ndcg@10": sum(1 / math.log2(r + 1) for r in ranks if r is not None) / n,
        "n": n,
    }


def render(results: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [f"{'class':<11}{'mode':<10}{'n':>5}{'R@1':>8}{'R@5':>8}{'R@10':>8}{'nDCG@10':>9}"]
    for kind, by_mode in results.items():
        for mode, m in by_mode.items():
            lines.append(
                f"{kind:<11}{mode:<10}{m['n']:>5}{m['recall@1']:>8.3f}{m['recall@5']:>8.3f}"
                f"{m['recall@10']:>8.3f}{m['ndcg@10']:>9.3f}"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    from tests.bench.common import bench_engine

    with bench_engine(args.database_url) as engine:
        results = evaluate(engine, tenants=args.tenants)
    print(render(results))
    return 0


if __name__ == "__main__":
    from tests.bench.common import run_benchmark

    run_benchmark(main)
