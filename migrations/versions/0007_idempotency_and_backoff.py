"""Idempotency keys per shard key with a payload hash; write intents retry with backoff; feedback receipts.

- ``write_intents.payload_hash``: sha256 of the accepted write, so a replay with another payload is refused
  (idempotency_conflict) instead of answered with the first write's id.
- Idempotency keys are unique per (tenant, butler): an episode's butler, a fact's or rule's shard butler (the
  token's default butler for a global write, else the scope's butler). Two butlers may use the same key.
- ``write_intents.next_attempt_at``: a failed intent is retried after a backoff (Postgres time), and its key's
  later intents wait behind it (shared.intake.claim_pending).
- ``feedback_receipts``: one row per (tenant, butler, idempotency_key) of memory_confirm / memory_mark_*, so a
  retried feedback call records one confirmation or application.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE write_intents ADD COLUMN payload_hash TEXT CHECK (length(payload_hash) = 64)")
    op.execute("ALTER TABLE write_intents ADD COLUMN next_attempt_at TIMESTAMPTZ")
    op.execute("DROP INDEX IF EXISTS uq_write_intents_idempotency")
    op.execute(
        "CREATE UNIQUE INDEX uq_write_intents_idempotency ON write_intents (tenant_id, butler, idempotency_key) "
        "WHERE idempotency_key IS NOT NULL"
    )
    op.execute("""
CREATE TABLE feedback_receipts (
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    butler TEXT NOT NULL,
    idempotency_key TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    tool TEXT NOT NULL,
    entity_id UUID NOT NULL,
    payload_hash TEXT NOT NULL CHECK (length(payload_hash) = 64),
    result JSONB NOT NULL DEFAULT '{}',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, butler, idempotency_key)
)""")
    op.execute("CREATE INDEX idx_feedback_receipts_age ON feedback_receipts (created_at)")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS feedback_receipts")
    op.execute("DROP INDEX IF EXISTS uq_write_intents_idempotency")
    op.execute(
        "CREATE UNIQUE INDEX uq_write_intents_idempotency ON write_intents (tenant_id, idempotency_key) "
        "WHERE idempotency_key IS NOT NULL"
    )
    op.execute("ALTER TABLE write_intents DROP COLUMN IF EXISTS next_attempt_at")
    op.execute("ALTER TABLE write_intents DROP COLUMN IF EXISTS payload_hash")
