"""Forgetting that holds and tenant purge (issue 16, items 5, 7, 8): token expiry, a tombstone table for purged
tenants (outside every tenant), and an append-only trigger on memory_events that allows exactly two paths:
scrubbing an event's payload down to its ids and transition names, and deleting a tenant's events while that
tenant's purge is in progress (its open tombstone row, visible only inside the purge's own transaction).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

# Payload keys an event keeps after a scrub: ids, sequence numbers, counts and transition names, never text a
# caller wrote (content, subject, predicate, reasons, notes, errors).
SCRUB_KEEP = (
    "butler",
    "seq",
    "scope",
    "from",
    "to",
    "from_validity",
    "to_validity",
    "from_maturity",
    "to_maturity",
    "superseded_by",
    "supersedes",
    "late",
    "manual",
    "cause",
    "run",
    "episodes",
    "outcome",
    "count",
    "replayed",
    "edited_from",
    "attempts",
)
KEEP_ARRAY = "ARRAY[" + ", ".join(f"'{k}'" for k in SCRUB_KEEP) + "]"

UPGRADE = f"""
ALTER TABLE api_tokens ADD COLUMN expires_at TIMESTAMPTZ;

-- One row per tenant purge, kept after the tenant is gone (no foreign key: it must outlive the tenant).
-- finished_at IS NULL only inside the purge's own transaction: the commit carries the finished row.
CREATE TABLE tenant_purges (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    finished_at TIMESTAMPTZ,
    counts JSONB NOT NULL DEFAULT '{{}}'
);
CREATE INDEX idx_tenant_purges_open ON tenant_purges (tenant_id) WHERE finished_at IS NULL;

-- The retention sweeps: applied intents by age, dead-lettered ones by age.
CREATE INDEX idx_write_intents_applied_at ON write_intents (applied_at) WHERE status = 'applied';
CREATE INDEX idx_write_intents_dead_age ON write_intents (created_at) WHERE status = 'dead_letter';

CREATE FUNCTION memory_events_scrubbed(payload jsonb) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce((SELECT jsonb_object_agg(key, value) FROM jsonb_each(payload)
                     WHERE key = ANY({KEEP_ARRAY})), '{{}}'::jsonb) || '{{"scrubbed": true}}'::jsonb
$$;

CREATE OR REPLACE FUNCTION memory_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE'
       AND (NEW.id, NEW.tenant_id, NEW.event_type, NEW.entity_type, NEW.entity_id, NEW.occurred_at, NEW.actor,
            NEW.request_id) IS NOT DISTINCT FROM
           (OLD.id, OLD.tenant_id, OLD.event_type, OLD.entity_type, OLD.entity_id, OLD.occurred_at, OLD.actor,
            OLD.request_id)
       AND NEW.payload = memory_events_scrubbed(OLD.payload) THEN
        RETURN NEW;  -- the scrub: content out, ids and transition names kept
    END IF;
    IF TG_OP = 'DELETE' AND EXISTS (
        SELECT 1 FROM tenant_purges WHERE tenant_id = OLD.tenant_id AND finished_at IS NULL) THEN
        RETURN OLD;  -- the tenant's purge
    END IF;
    RAISE EXCEPTION 'memory_events is append-only: % refused', TG_OP USING ERRCODE = 'integrity_constraint_violation';
END $$;
"""

DOWNGRADE = """
CREATE OR REPLACE FUNCTION memory_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'memory_events is append-only: % refused', TG_OP USING ERRCODE = 'integrity_constraint_violation';
END $$;
DROP FUNCTION IF EXISTS memory_events_scrubbed(jsonb);
DROP INDEX IF EXISTS idx_write_intents_dead_age;
DROP INDEX IF EXISTS idx_write_intents_applied_at;
DROP TABLE IF EXISTS tenant_purges;
ALTER TABLE api_tokens DROP COLUMN IF EXISTS expires_at;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
