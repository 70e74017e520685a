"""Re-embedding after a model change: rows whose embedding_version_id is not the current model's, in batches.

Each batch is one transaction (one model call, one UPDATE per table via unnest), keyed by id so an interrupted
run resumes where it stopped and a second run finds nothing to do.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from sqlalchemy import Engine, text

from shared import repository as repo
from shared.conversation import Embed, rebuild_vectors
from shared.embedding import ModelVersion, word_piece_offsets

# What is embedded for each type, in SQL: the same text as shared.consolidation_plan.embedding_text.
EMBED_TEXT = {
    "episodes": "content",
    "facts": "subject || ' ' || replace(predicate, '_', ' ') || ': ' || content",
    "rules": "content",
}


# What else a batch reads: an episode's other vectors are rebuilt with it (shared.conversation).
EXTRA = {"episodes": "tenant_id, butler, preceding", "facts": "NULL AS preceding", "rules": "NULL AS preceding"}


def stale_count(engine: Engine, version_id: int) -> int:
    with engine.connect() as conn:
        return sum(
            conn.execute(
                text(f"SELECT count(*) FROM {t} WHERE embedding_version_id IS DISTINCT FROM :v"), {"v": version_id}
            ).scalar_one()
            for t in EMBED_TEXT
        )


def reembed(engine: Engine, *, embed: Embed, version: ModelVersion, batch: int = 256) -> Iterator[tuple[str, int]]:
    """Yield (table, rows done in this batch) as batches commit."""
    with engine.begin() as conn:
        version_id = repo.embedding_version_id(conn, version)
    for table, expr in EMBED_TEXT.items():
        after = uuid.UUID(int=0)
        while True:
            with engine.begin() as conn:
                rows = conn.execute(
                    text(
                        f"SELECT id, {expr} AS body, {EXTRA[table]} FROM {table} WHERE id > :after "
                        "AND embedding_version_id IS DISTINCT FROM :v ORDER BY id LIMIT :n FOR UPDATE SKIP LOCKED"
                    ),
                    {"after": after, "v": version_id, "n": batch},
                ).all()
                if not rows:
                    break
                vectors = embed([r.body for r in rows])
                conn.execute(
                    text(
                        f"UPDATE {table} t SET embedding = CAST(b.vec AS vector), embedding_version_id = :v "
                        "FROM unnest(CAST(:ids AS uuid[]), CAST(:vecs AS text[])) AS b(id, vec) WHERE t.id = b.id"
                    ),
                    {
                        "v": version_id,
                        "ids": [str(r.id) for r in rows],
                        "vecs": ["[" + ",".join(f"{x:.7g}" for x in v) + "]" for v in vectors],
                    },
                )
                if table == "episodes":  # and their contextual and window vectors
                    rebuild_vectors(
                        conn,
                        rows=[{**r._mapping, "content": r.body} for r in rows],
                        embed=embed,
                        offsets=word_piece_offsets,
                    )
                after = rows[-1].id
            yield table, len(rows)
