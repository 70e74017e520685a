"""episodes partitioned by month of their accept time (issue 17 §4): declarative range partitioning on
``created_at``, tenant first in every btree index, a DEFAULT partition so an insert never fails for want of a month.

The partition key is ``created_at``, the time the write was accepted: the TTL counts from it (``expires_at =
created_at + ttl``), so a month of accepts expires together and can go as a whole (shared/episode_partitions.py).
``occurred_at`` is the caller's conversation time: an import of last year's history would land in old months that
are still alive, and a month would never be wholly expired.

A partitioned table's unique keys must hold the partition key, so the primary key is (tenant_id, id, created_at)
and nothing can reference ``episodes(id)`` alone any more. The four foreign keys that did are dropped and their
referential actions are kept by the database, by triggers:

- ``episodes_references_delete``: after a DELETE on episodes (one statement-level trigger, the deleted rows as a
  transition table), the deleted episodes' ``episode_vectors`` and ``episode_terms`` go (was ON DELETE CASCADE),
  and ``facts``/``rules.source_episode_id`` pointing at them become NULL (was ON DELETE SET NULL). Every path that
  deletes episodes (the cleanup, a dead letter's drop, a tenant purge) goes through it unchanged;
- ``facts_source_episode_check``/``rules_source_episode_check``: a fact or rule naming a source episode is refused
  (foreign_key_violation, as before) unless that episode exists in the same tenant; the episode is locked FOR KEY
  SHARE as the foreign key's check did, so a concurrent delete cannot slip between.

``episode_vectors`` and ``episode_terms`` are written only for episodes in hand (the terms by the triggers on
episodes themselves, the vectors right after their episodes in the same transaction), so they need no insert check.
A month dropped whole (the cleanup's partition path) fires no row trigger: that path cleans the references itself.

An existing, populated table is converted in place, in this one transaction: months from the oldest accept to three
ahead, rows copied with their ids (postings and vectors are kept as they are), then the indexes and triggers.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

# Months created ahead by the migration (the maintenance task's default too).
AHEAD_MONTHS = 3

# Every column but the generated ones (search_vector, consolidated, context_vector: recomputed on the copy).
COLUMNS = (
    "id, tenant_id, butler, seq, session_id, content, embedding, embedding_version_id, importance, reference_count, "
    "consolidation_status, consolidation_attempts, last_consolidation_error, next_consolidation_retry_at, "
    "created_at, last_referenced_at, expires_at, forgotten_at, request_id, metadata, content_tokens, occurred_at, "
    "preceding"
)
LIKE = "INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING GENERATED INCLUDING STORAGE"

# The indexes both ways share (0001, 0004); the expiry index is the one whose shape changes.
INDEXES = """
CREATE INDEX idx_episodes_butler ON episodes (tenant_id, butler, created_at DESC);
CREATE INDEX idx_episodes_unconsolidated ON episodes (tenant_id, butler, seq)
    WHERE consolidation_status IN ('pending', 'failed');
CREATE INDEX idx_episodes_session ON episodes (tenant_id, session_id, occurred_at, seq) WHERE session_id IS NOT NULL;
CREATE INDEX idx_episodes_embedding ON episodes USING hnsw (embedding vector_cosine_ops);
CREATE INDEX idx_episodes_search ON episodes USING GIN (search_vector);
ALTER TABLE episodes ADD CONSTRAINT episodes_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES tenants(id)
    ON DELETE CASCADE;
ALTER TABLE episodes ADD CONSTRAINT episodes_embedding_version_id_fkey FOREIGN KEY (embedding_version_id)
    REFERENCES embedding_versions(id);"""

# 0015's postings triggers (the functions stay): created after a copy, which must not write postings again.
TERMS_TRIGGERS = """
CREATE TRIGGER episodes_terms_insert AFTER INSERT ON episodes
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION episode_terms_insert();
CREATE TRIGGER episodes_terms_update AFTER UPDATE OF content, preceding ON episodes FOR EACH ROW
    WHEN (OLD.search_vector IS DISTINCT FROM NEW.search_vector OR OLD.context_vector IS DISTINCT FROM NEW.context_vector)
    EXECUTE FUNCTION episode_terms_update();"""

REFERENCES = ("facts", "rules")
OLD_FKS = {
    "facts": "facts_source_episode_id_fkey FOREIGN KEY (source_episode_id) REFERENCES episodes(id) ON DELETE SET NULL",
    "rules": "rules_source_episode_id_fkey FOREIGN KEY (source_episode_id) REFERENCES episodes(id) ON DELETE SET NULL",
    "episode_vectors": "episode_vectors_episode_id_fkey FOREIGN KEY (episode_id) REFERENCES episodes(id) "
    "ON DELETE CASCADE",
    "episode_terms": "episode_terms_episode_id_fkey FOREIGN KEY (episode_id) REFERENCES episodes(id) ON DELETE CASCADE",
}

REFERENCE_TRIGGERS = """
-- ON DELETE CASCADE / SET NULL of the dropped foreign keys, once per statement for all its rows.
CREATE FUNCTION episodes_references_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM episode_vectors v USING old_rows o WHERE v.episode_id = o.id;
    DELETE FROM episode_terms t USING old_rows o WHERE t.episode_id = o.id;
    UPDATE facts f SET source_episode_id = NULL FROM old_rows o
        WHERE f.source_episode_id = o.id AND f.tenant_id = o.tenant_id;
    UPDATE rules r SET source_episode_id = NULL FROM old_rows o
        WHERE r.source_episode_id = o.id AND r.tenant_id = o.tenant_id;
    RETURN NULL;
END $$;
CREATE TRIGGER episodes_references_delete AFTER DELETE ON episodes
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION episodes_references_delete();

-- The foreign key's check: the source episode exists (in the writer's tenant), locked against a concurrent delete.
CREATE FUNCTION episode_source_check() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM episodes WHERE tenant_id = NEW.tenant_id AND id = NEW.source_episode_id FOR KEY SHARE;
    IF NOT FOUND THEN
        RAISE foreign_key_violation USING MESSAGE = format(
            'insert or update on table "%s" violates the source episode reference: episode %s is not present',
            TG_TABLE_NAME, NEW.source_episode_id);
    END IF;
    RETURN NEW;
END $$;
""" + "\n".join(
    f"CREATE TRIGGER {t}_source_episode_check BEFORE INSERT OR UPDATE OF source_episode_id ON {t} FOR EACH ROW "
    f"WHEN (NEW.source_episode_id IS NOT NULL) EXECUTE FUNCTION episode_source_check();"
    for t in REFERENCES
)

UPGRADE = f"""
{"".join(f"ALTER TABLE {t} DROP CONSTRAINT {fk.split()[0]};" + chr(10) for t, fk in OLD_FKS.items())}
ALTER TABLE episodes RENAME TO episodes_unpartitioned;
CREATE TABLE episodes (LIKE episodes_unpartitioned {LIKE}) PARTITION BY RANGE (created_at);
CREATE TABLE episodes_default PARTITION OF episodes DEFAULT;

-- episodes_pYYYY_MM for [month, month + 1), UTC, from the oldest accept's month to AHEAD_MONTHS ahead.
SET LOCAL TIME ZONE 'UTC';
DO $$
DECLARE
    m timestamptz := date_trunc('month', coalesce((SELECT min(created_at) FROM episodes_unpartitioned), now()));
    last_month timestamptz := date_trunc('month', now()) + interval '{AHEAD_MONTHS} months';
BEGIN
    WHILE m <= last_month LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF episodes FOR VALUES FROM (%L) TO (%L)',
                       'episodes_p' || to_char(m, 'YYYY_MM'), m, m + interval '1 month');
        m := m + interval '1 month';
    END LOOP;
END $$;

INSERT INTO episodes ({COLUMNS}) SELECT {COLUMNS} FROM episodes_unpartitioned;
DROP TABLE episodes_unpartitioned;

-- Keys and indexes after the copy (one build per partition); tenant first in every btree.
ALTER TABLE episodes ADD CONSTRAINT episodes_pkey PRIMARY KEY (tenant_id, id, created_at);
ALTER TABLE episodes ADD CONSTRAINT episodes_tenant_id_butler_seq_key UNIQUE (tenant_id, butler, seq, created_at);
CREATE INDEX idx_episodes_expires ON episodes (tenant_id, expires_at);
{INDEXES}
{TERMS_TRIGGERS}
{REFERENCE_TRIGGERS}
ANALYZE episodes;
"""

# Back to one table. References that a month's drop left behind (its clean-up interrupted) are cleared first, so
# the foreign keys can be validated again.
DOWNGRADE = f"""
{"".join(f"DROP TRIGGER {t}_source_episode_check ON {t};" + chr(10) for t in REFERENCES)}
DROP TRIGGER episodes_references_delete ON episodes;
DROP FUNCTION episode_source_check();
DROP FUNCTION episodes_references_delete();
DO $$
DECLARE t text;
BEGIN
    FOR t IN SELECT relname FROM pg_class WHERE relname ~ '^episodes_expired_p[0-9]{{4}}_[0-9]{{2}}$' AND relkind = 'r'
    LOOP
        EXECUTE format('DROP TABLE %I', t);
    END LOOP;
END $$;

ALTER TABLE episodes RENAME TO episodes_partitioned;
CREATE TABLE episodes (LIKE episodes_partitioned {LIKE});
INSERT INTO episodes ({COLUMNS}) SELECT {COLUMNS} FROM episodes_partitioned;
DROP TABLE episodes_partitioned;
ALTER TABLE episodes ADD CONSTRAINT episodes_pkey PRIMARY KEY (id);
ALTER TABLE episodes ADD CONSTRAINT episodes_tenant_id_butler_seq_key UNIQUE (tenant_id, butler, seq);
CREATE INDEX idx_episodes_expires ON episodes (expires_at);
{INDEXES}
{TERMS_TRIGGERS}

DELETE FROM episode_vectors v WHERE NOT EXISTS (SELECT 1 FROM episodes e WHERE e.id = v.episode_id);
DELETE FROM episode_terms t WHERE NOT EXISTS (SELECT 1 FROM episodes e WHERE e.id = t.episode_id);
{
    "".join(
        f"UPDATE {t} x SET source_episode_id = NULL WHERE source_episode_id IS NOT NULL "
        f"AND NOT EXISTS (SELECT 1 FROM episodes e WHERE e.id = x.source_episode_id);" + chr(10)
        for t in REFERENCES
    )
}
{"".join(f"ALTER TABLE {t} ADD CONSTRAINT {fk};" + chr(10) for t, fk in OLD_FKS.items())}
ANALYZE episodes;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
