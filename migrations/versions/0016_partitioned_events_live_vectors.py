"""memory_events partitioned by month (issue 17 §4): declarative range partitioning on occurred_at, tenant first in
every index, a DEFAULT partition so an insert never fails for want of a month, and the same append-only trigger
(exactly the scrub UPDATE and the tenant-purge DELETE pass; 0008). An existing, populated table is converted in
place: its rows are copied with their ids, the id sequence continues after the largest one, and monthly partitions
cover its oldest event up to three months ahead (the beat's event_partitions task keeps creating them ahead and
drops whole months past ``schedule.events_retention_days``; see shared/partitions.py and docs/partitions.md).

The same revision makes the facts' and rules' HNSW indexes partial, ``WHERE validity IN ('active', 'fading')``: every
read and every dedup lookup that searches by vector already has exactly that filter (shared/candidates.py,
shared/consolidation.py), so the planner proves it and uses the index. A row that leaves those states (the decay
sweep's expiry, a supersession, a retraction) is then no longer inserted into the graph, which was most of the
decay sweep's cost (docs/partitions.md: a batch spent ~75% of its time in HNSW inserts).

The primary key must hold the partition key: it is (tenant_id, id, occurred_at), which also serves the tenant's
feed in id order (the old idx_memory_events_tenant_time). ``episodes`` stay one table: facts, rules, links and
episode_vectors reference them by id alone.

Revision ID: 0016
Revises: 0011
Create Date: 2026-11-25
"""

from alembic import op

revision = "0016"
down_revision = "0011"
branch_labels = None
depends_on = None

# Months created ahead by the migration (the maintenance task's default too).
AHEAD_MONTHS = 3

COLUMNS = "id, tenant_id, event_type, entity_type, entity_id, occurred_at, actor, request_id, payload"

# memory_events' columns after its id, as 0001 made them (the same both ways of this migration).
EVENT_COLUMNS = """    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    event_type TEXT NOT NULL,
    entity_type TEXT NOT NULL,
    entity_id UUID,
    occurred_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    actor TEXT NOT NULL,
    request_id TEXT,
    payload JSONB NOT NULL DEFAULT '{}'"""

TRIGGER = """
CREATE TRIGGER trg_memory_events_append_only BEFORE UPDATE OR DELETE ON memory_events
    FOR EACH ROW EXECUTE FUNCTION memory_events_append_only();"""

VECTOR_TABLES = ("facts", "rules")
LIVE_VECTORS = "\n".join(
    f"DROP INDEX idx_{t}_embedding;\nCREATE INDEX idx_{t}_embedding ON {t} USING hnsw (embedding vector_cosine_ops) "
    "WHERE validity IN ('active', 'fading');"
    for t in VECTOR_TABLES
)
ALL_VECTORS = "\n".join(
    f"DROP INDEX idx_{t}_embedding;\nCREATE INDEX idx_{t}_embedding ON {t} USING hnsw (embedding vector_cosine_ops);"
    for t in VECTOR_TABLES
)

UPGRADE = f"""
ALTER TABLE memory_events RENAME TO memory_events_unpartitioned;
ALTER INDEX memory_events_pkey RENAME TO memory_events_unpartitioned_pkey;
ALTER INDEX idx_memory_events_tenant_time RENAME TO memory_events_unpartitioned_tenant_time;
ALTER INDEX idx_memory_events_entity RENAME TO memory_events_unpartitioned_entity;
ALTER SEQUENCE memory_events_id_seq RENAME TO memory_events_unpartitioned_id_seq;

-- A plain sequence rather than an identity column: identity on a partitioned table needs PostgreSQL 17.
CREATE SEQUENCE memory_events_id_seq AS bigint;
CREATE TABLE memory_events (
    id BIGINT NOT NULL DEFAULT nextval('memory_events_id_seq'),
{EVENT_COLUMNS}
) PARTITION BY RANGE (occurred_at);
ALTER SEQUENCE memory_events_id_seq OWNED BY memory_events.id;
CREATE TABLE memory_events_default PARTITION OF memory_events DEFAULT;

-- memory_events_pYYYY_MM for [month, month + 1), UTC, from the oldest event's month to AHEAD_MONTHS ahead.
-- Month arithmetic on timestamptz follows the session's time zone: pin it to UTC for this transaction.
SET LOCAL TIME ZONE 'UTC';
DO $$
DECLARE
    m timestamptz := date_trunc('month', coalesce((SELECT min(occurred_at) FROM memory_events_unpartitioned), now()));
    last_month timestamptz := date_trunc('month', now()) + interval '{AHEAD_MONTHS} months';
BEGIN
    WHILE m <= last_month LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF memory_events FOR VALUES FROM (%L) TO (%L)',
                       'memory_events_p' || to_char(m, 'YYYY_MM'), m, m + interval '1 month');
        m := m + interval '1 month';
    END LOOP;
END $$;

INSERT INTO memory_events ({COLUMNS}) SELECT {COLUMNS} FROM memory_events_unpartitioned;
SELECT setval('memory_events_id_seq', coalesce((SELECT max(id) FROM memory_events_unpartitioned), 0) + 1, false);
DROP TABLE memory_events_unpartitioned;

-- Indexes after the copy (one build per partition instead of row-by-row upkeep); tenant first in each.
ALTER TABLE memory_events ADD PRIMARY KEY (tenant_id, id, occurred_at);
CREATE INDEX idx_memory_events_entity ON memory_events (tenant_id, entity_type, entity_id);
{TRIGGER}
ANALYZE memory_events;
{LIVE_VECTORS}
"""

DOWNGRADE = f"""
{ALL_VECTORS}
ALTER TABLE memory_events RENAME TO memory_events_partitioned;
ALTER SEQUENCE memory_events_id_seq OWNED BY NONE;
ALTER SEQUENCE memory_events_id_seq RENAME TO memory_events_partitioned_id_seq;
ALTER INDEX idx_memory_events_entity RENAME TO memory_events_partitioned_entity;
ALTER INDEX memory_events_pkey RENAME TO memory_events_partitioned_pkey;

CREATE TABLE memory_events (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
{EVENT_COLUMNS}
);
INSERT INTO memory_events ({COLUMNS}) OVERRIDING SYSTEM VALUE SELECT {COLUMNS} FROM memory_events_partitioned;
SELECT setval(pg_get_serial_sequence('memory_events', 'id'),
              coalesce((SELECT max(id) FROM memory_events_partitioned), 0) + 1, false);
DROP TABLE memory_events_partitioned;
DROP SEQUENCE memory_events_partitioned_id_seq;
CREATE INDEX idx_memory_events_tenant_time ON memory_events (tenant_id, id);
CREATE INDEX idx_memory_events_entity ON memory_events (entity_type, entity_id);
{TRIGGER}
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
