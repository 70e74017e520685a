"""Episodes in their conversation: when they happened, the turns before them, and windows of long ones.

- ``occurred_at``: when the episode happened (an import of history gives it; otherwise the accept time). Recency,
  ordering and the ``since``/``until`` bounds use it; the TTL still counts from ``created_at`` (the accept time).
- ``preceding``: the turn(s) just before it in its session, set by the worker at apply time (and again when an
  earlier turn arrives late); ``context_vector`` indexes them as a second, lower-weighted keyword field.
- ``episode_vectors``: an episode's other embeddings: itself read after its preceding turn (``n`` = 0), and the
  overlapping windows of an episode longer than the model reads (256 word pieces, ``n`` >= 1). An episode is as
  near to a query as the nearest of its own embedding and these.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE episodes ADD COLUMN occurred_at TIMESTAMPTZ;
UPDATE episodes SET occurred_at = created_at;
ALTER TABLE episodes ALTER COLUMN occurred_at SET NOT NULL, ALTER COLUMN occurred_at SET DEFAULT now();
ALTER TABLE episodes ADD COLUMN preceding TEXT CHECK (length(preceding) <= 100000);
ALTER TABLE episodes ADD COLUMN context_vector tsvector
    GENERATED ALWAYS AS (to_tsvector('english', coalesce(preceding, ''))) STORED;
-- A session's turns in order: contextualisation at apply time and the read path's neighbours.
CREATE INDEX idx_episodes_session ON episodes (tenant_id, session_id, occurred_at, seq) WHERE session_id IS NOT NULL;

CREATE TABLE episode_vectors (
    episode_id UUID NOT NULL REFERENCES episodes(id) ON DELETE CASCADE,
    n SMALLINT NOT NULL CHECK (n >= 0),
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    butler TEXT NOT NULL,
    embedding vector(384) NOT NULL,
    PRIMARY KEY (episode_id, n)
);
CREATE INDEX idx_episode_vectors_scope ON episode_vectors (tenant_id, butler);
CREATE INDEX idx_episode_vectors_embedding ON episode_vectors USING hnsw (embedding vector_cosine_ops);
"""

DOWNGRADE = """
DROP TABLE IF EXISTS episode_vectors;
DROP INDEX IF EXISTS idx_episodes_session;
ALTER TABLE episodes DROP COLUMN context_vector, DROP COLUMN preceding, DROP COLUMN occurred_at;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
