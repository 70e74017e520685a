"""Partial indexes for the decay sweep (live facts by id) and the dead-letter gauge (write intents).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-21
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX idx_facts_live_id ON facts (id) WHERE validity IN ('active', 'fading')")
    op.execute(
        "CREATE INDEX idx_write_intents_dead_letter ON write_intents (tenant_id, butler) WHERE status = 'dead_letter'"
    )


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS idx_write_intents_dead_letter")
    op.execute("DROP INDEX IF EXISTS idx_facts_live_id")
