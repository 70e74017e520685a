"""Vectors stay in their row, and a term's postings answer from the index alone (issue 12: search latency).

pgvector's type is stored EXTERNAL: once a row passes PostgreSQL's ~2 kB TOAST threshold, the vector is the first
value moved out of line. An episode row (a chat turn, its preceding turn, two tsvectors and a 1.5 kB vector) is
~4 kB, so most episodes' vectors lived in the TOAST table, and the read path's exact sort over a caller's episodes
fetched each one from there: on a 1,457-turn tenant 6,048 buffers against 942 with the vectors inline, and the
candidate statement's p50 19.5 -> 15.5 ms. PLAIN keeps every vector in its row (1.5 kB always fits a page); the
text columns are what TOAST moves instead, and only the few rows a read returns need them. Existing vectors are
rewritten in place to take the new storage (an UPDATE of the vector alone: no trigger reacts to it).

``episode_terms``' primary key carries each posting's counts (INCLUDE tf, ctf), so a query lexeme's postings are
read by an index-only scan (measured 0.077 -> 0.020 ms per lexeme) instead of visiting the heap for every posting.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-25
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

TABLES = ("episodes", "facts", "rules", "episode_vectors")


def _storage(mode: str) -> str:
    return "\n".join(f"ALTER TABLE {t} ALTER COLUMN embedding SET STORAGE {mode};" for t in TABLES)


def _primary_key(include: str) -> str:
    return (
        "ALTER TABLE episode_terms DROP CONSTRAINT episode_terms_pkey, "
        f"ADD CONSTRAINT episode_terms_pkey PRIMARY KEY (tenant_id, lexeme, episode_id){include};"
    )


def upgrade() -> None:
    op.execute(_storage("PLAIN"))
    for table in TABLES:
        op.execute(f"UPDATE {table} SET embedding = embedding::real[]::vector")
    op.execute(_primary_key(" INCLUDE (tf, ctf)"))


def downgrade() -> None:
    op.execute(_primary_key(""))
    op.execute(_storage("EXTERNAL"))
