"""Episode term postings: the keyword leg's BM25 reads term frequencies from an index instead of every row.

A long conversation query holds ~16 lexemes, and ~65 % of a chat tenant's turns hold one of them: reading each such
row's ``tsvector`` to count the query's terms was ~2/3 of a search on a 1,800-turn tenant (issue 12). ``episode_terms``
holds one row per (episode, lexeme) with the lexeme's count in the episode's own text (``tf``) and in its preceding
turn (``ctf``, the second keyword field), keyed for a read's lookup: (tenant, lexeme) -> episodes.

The database keeps it true: statement-level triggers on ``episodes`` write an inserted episode's postings and rewrite
them when its terms change (``preceding`` set or re-contextualised, content redacted); a deleted episode's postings go
with it (ON DELETE CASCADE). A forgotten or expired episode keeps its postings: every read joins them to the rows it
may see.

Revision ID: 0015
Revises: 0009
Create Date: 2026-11-24
"""

from alembic import op

revision = "0015"
down_revision = "0009"
branch_labels = None
depends_on = None

# An episode's postings from its two tsvectors (a lexeme stripped of positions counts once).
POSTINGS = """
SELECT e.tenant_id, u.lexeme, e.id AS episode_id, sum(u.tf)::real AS tf, sum(u.ctf)::real AS ctf
FROM {rows} e, LATERAL (
    SELECT t.lexeme, coalesce(cardinality(t.positions), 1) AS tf, 0 AS ctf FROM unnest(e.search_vector) t
    UNION ALL
    SELECT t.lexeme, 0, coalesce(cardinality(t.positions), 1) FROM unnest(e.context_vector) t
) u
GROUP BY e.tenant_id, u.lexeme, e.id
"""

UPGRADE = f"""
CREATE TABLE episode_terms (
    tenant_id TEXT NOT NULL,
    lexeme TEXT NOT NULL,
    episode_id UUID NOT NULL REFERENCES episodes(id) ON DELETE CASCADE,
    tf REAL NOT NULL CHECK (tf >= 0),
    ctf REAL NOT NULL CHECK (ctf >= 0),
    PRIMARY KEY (tenant_id, lexeme, episode_id)
);
CREATE INDEX idx_episode_terms_episode ON episode_terms (episode_id);

CREATE FUNCTION episode_terms_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO episode_terms (tenant_id, lexeme, episode_id, tf, ctf)
    {POSTINGS.format(rows="new_rows")};
    RETURN NULL;
END $$;

-- Row level, and only for the columns the terms come from: a reference bump or a status change costs nothing.
CREATE FUNCTION episode_terms_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM episode_terms WHERE episode_id = NEW.id;
    INSERT INTO episode_terms (tenant_id, lexeme, episode_id, tf, ctf)
    {POSTINGS.format(rows="(SELECT NEW.*) AS")};
    RETURN NULL;
END $$;

CREATE TRIGGER episodes_terms_insert AFTER INSERT ON episodes
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION episode_terms_insert();
CREATE TRIGGER episodes_terms_update AFTER UPDATE OF content, preceding ON episodes FOR EACH ROW
    WHEN (OLD.search_vector IS DISTINCT FROM NEW.search_vector OR OLD.context_vector IS DISTINCT FROM NEW.context_vector)
    EXECUTE FUNCTION episode_terms_update();

INSERT INTO episode_terms (tenant_id, lexeme, episode_id, tf, ctf)
{POSTINGS.format(rows="episodes")};
"""

DOWNGRADE = """
DROP TRIGGER IF EXISTS episodes_terms_update ON episodes;
DROP TRIGGER IF EXISTS episodes_terms_insert ON episodes;
DROP FUNCTION IF EXISTS episode_terms_update();
DROP FUNCTION IF EXISTS episode_terms_insert();
DROP TABLE IF EXISTS episode_terms;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
