"""write_intents.trace_context: the W3C trace context (traceparent, tracestate) of the call that accepted the
write, so the worker that applies it - after a redelivery, or inside another call's batch - records the apply in
that call's trace (shared.tracing). NULL when tracing is off. Adding a nullable column rewrites nothing.

Revision ID: 0011
Revises: 0015
Create Date: 2026-11-24
"""

from alembic import op

revision = "0011"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE write_intents ADD COLUMN trace_context jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE write_intents DROP COLUMN IF EXISTS trace_context")
