"""A large synthetic corpus for latency benchmarks: N facts and M rules spread over T tenants.

Embedding 120k texts on 2 cores would take ~10 minutes, so the corpus embeds a few thousand distinct sentences
for real and gives every row the vector of its sentence plus small Gaussian noise (renormalised). Rows are
distinct, neighbourhoods are realistic, and the HNSW index sees a real distribution. HNSW indexes are rebuilt
after the bulk load with maintenance_work_mem = 1 GB (3.6x faster than the default, measured here).
"""

from __future__ import annotations

import io
import random
import time
import uuid
from datetime import datetime, timedelta, timezone

import numpy as np
from sqlalchemy import Engine, text

from shared.context import content_tokens
from shared.embedding import get_embedder, get_token_counter

SUBJECTS = ["user", "partner", "mother", "boss", "dentist", "neighbour", "sister", "friend"]
TOPICS = [
    "coffee",
    "running",
    "jazz",
    "travel",
    "budget",
    "garden",
    "sleep",
    "cooking",
    "reading",
    "cycling",
    "meetings",
    "email",
    "medication",
    "allergies",
    "holidays",
    "movies",
    "football",
    "languages",
    "painting",
    "groceries",
    "car",
    "cat",
    "dog",
    "weather",
    "music",
    "birthday",
    "work",
    "school",
]
VERBS = [
    "prefers",
    "dislikes",
    "is planning",
    "often mentions",
    "asked about",
    "is worried about",
    "enjoys",
    "wants to improve",
    "keeps forgetting",
    "recently changed",
]
RULE_OPENERS = ["Always", "Never", "Before answering, ", "When the user asks about", "Prefer to"]
PERMANENCE = ["permanent", "stable", "standard", "volatile", "ephemeral"]
DECAY = {"permanent": 0.0, "stable": 0.002, "standard": 0.008, "volatile": 0.03, "ephemeral": 0.1}
INDEXES = {
    "idx_facts_embedding": "CREATE INDEX idx_facts_embedding ON facts USING hnsw (embedding vector_cosine_ops)",
    "idx_rules_embedding": "CREATE INDEX idx_rules_embedding ON rules USING hnsw (embedding vector_cosine_ops)",
}


def corpus_tenants(engine: Engine, *, reuse: bool, facts: int, rules: int, tenants: int) -> list[str]:
    """The corpus's tenant ids: loaded now, or (``reuse``) those a previous load left in the database."""
    if not reuse:
        return load_corpus(engine, facts=facts, rules=rules, tenants=tenants, distinct=min(3000, max(facts, 1)))
    with engine.connect() as conn:
        return list(conn.execute(text("SELECT id FROM tenants WHERE id LIKE 'lat-%' ORDER BY id")).scalars())


def sentences(rng: random.Random, n: int) -> list[str]:
    return [
        f"The {rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(TOPICS)} and {rng.choice(TOPICS)} "
        f"({rng.choice(['mornings', 'weekends', 'evenings', 'lately', 'this year'])})"
        for _ in range(n)
    ]


def questions(rng: random.Random, n: int) -> list[str]:
    return [f"what does the {rng.choice(SUBJECTS)} think about {rng.choice(TOPICS)}?" for _ in range(n)]


def _vectors(base: np.ndarray, picks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    v = base[picks] + rng.normal(0, 0.03, size=(len(picks), base.shape[1])).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _vec_text(v: np.ndarray) -> str:
    return "[" + ",".join(f"{x:.5f}" for x in v) + "]"


def load_corpus(
    engine: Engine, *, facts: int, rules: int, tenants: int, distinct: int = 3000, seed: int = 1, progress=print
) -> list[str]:  # noqa: ANN001
    """Bulk-load the corpus with COPY; returns the tenant ids."""
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    texts = sentences(rng, distinct)
    t0 = time.perf_counter()
    base = get_embedder().embed(texts)
    progress(f"embedded {distinct} distinct sentences in {time.perf_counter() - t0:.1f}s")
    tenant_ids = [f"lat-{seed}-{i:03d}" for i in range(tenants)]
    now = datetime.now(timezone.utc)
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO tenants (id) SELECT unnest(CAST(:t AS text[])) ON CONFLICT DO NOTHING"), {"t": tenant_ids}
        )
        for name in INDEXES:
            conn.execute(text(f"DROP INDEX IF EXISTS {name}"))
    _copy(engine, "facts", _fact_rows(facts, tenant_ids, texts, base, rng, nrng, now), progress)
    _copy(engine, "rules", _rule_rows(rules, tenant_ids, texts, base, rng, nrng, now), progress)
    t0 = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL maintenance_work_mem = '1GB'"))
        for ddl in INDEXES.values():
            conn.execute(text(ddl))
        conn.execute(text("ANALYZE facts; ANALYZE rules"))
    progress(f"built HNSW indexes in {time.perf_counter() - t0:.1f}s")
    return tenant_ids


def _tokens(content: str) -> str:
    return str(content_tokens([content], get_token_counter().count_many)[0])


def _fact_rows(n, tenant_ids, texts, base, rng, nrng, now):  # noqa: ANN001, ANN202
    picks = nrng.integers(0, len(texts), size=n)
    vecs = _vectors(base, picks, nrng)
    for i in range(n):
        perm = rng.choice(PERMANENCE)
        when = now - timedelta(days=rng.uniform(0, 60))
        content = texts[picks[i]]
        yield [
            str(uuid.uuid4()),
            tenant_ids[i % len(tenant_ids)],
            rng.choice(SUBJECTS),
            f"{rng.choice(TOPICS)}_{i}",
            content,
            _tokens(content),
            _vec_text(vecs[i]),
            str(rng.randint(1, 10)),
            "1.0",
            str(DECAY[perm]),
            perm,
            rng.choice(["global", "health", "general"]),
            when.isoformat(),
            when.isoformat(),
            when.isoformat(),
        ]


def _rule_rows(n, tenant_ids, texts, base, rng, nrng, now):  # noqa: ANN001, ANN202
    picks = nrng.integers(0, len(texts), size=n)
    vecs = _vectors(base, picks, nrng)
    for i in range(n):
        when = now - timedelta(days=rng.uniform(0, 60))
        content = f"{rng.choice(RULE_OPENERS)} {texts[picks[i]]}"
        yield [
            str(uuid.uuid4()),
            tenant_ids[i % len(tenant_ids)],
            content,
            _tokens(content),
            _vec_text(vecs[i]),
            rng.choice(["candidate", "established", "proven"]),
            "0.5",
            "0.008",
            "standard",
            "0.7",
            rng.choice(["global", "health", "general"]),
            when.isoformat(),
            when.isoformat(),
            when.isoformat(),
        ]


COPY_COLUMNS = {
    "facts": "id, tenant_id, subject, predicate, content, content_tokens, embedding, importance, confidence, "
    "decay_rate, permanence, scope, created_at, last_confirmed_at, last_referenced_at",
    "rules": "id, tenant_id, content, content_tokens, embedding, maturity, confidence, decay_rate, permanence, "
    "effectiveness_score, scope, created_at, last_confirmed_at, last_referenced_at",
}


def _copy(engine: Engine, table: str, rows, progress, chunk: int = 20_000) -> None:  # noqa: ANN001
    t0 = time.perf_counter()
    raw = engine.raw_connection()
    total = 0
    try:
        cur = raw.cursor()
        buf = io.StringIO()
        for i, row in enumerate(rows, start=1):
            buf.write("\t".join(row) + "\n")
            if i % chunk == 0:
                total += _flush(cur, table, buf)
                buf = io.StringIO()
                progress(f"{table}: {total} rows")
        total += _flush(cur, table, buf)
        raw.commit()
    finally:
        raw.close()
    progress(f"loaded {total} {table} in {time.perf_counter() - t0:.1f}s")


def _flush(cur, table: str, buf: io.StringIO) -> int:  # noqa: ANN001
    data = buf.getvalue()
    if not data:
        return 0
    with cur.copy(f"COPY {table} ({COPY_COLUMNS[table]}) FROM STDIN") as copy:
        copy.write(data)
    return data.count("\n")


__all__ = ["corpus_tenants", "load_corpus", "questions"]
