"""An operator token role (fleet-wide /metrics and maintenance runs, no memory access), and an index for the
newest maintenance run per task (memory_stats' operator view, the cleanup's pruning).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE api_tokens DROP CONSTRAINT IF EXISTS api_tokens_role_check")
    op.execute(
        "ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_role_check CHECK (role IN ('butler', 'admin', 'operator'))"
    )
    op.execute("CREATE INDEX idx_maintenance_runs_newest ON maintenance_runs (task, started_at DESC)")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS idx_maintenance_runs_newest")
    op.execute("DELETE FROM api_tokens WHERE role = 'operator'")
    op.execute("ALTER TABLE api_tokens DROP CONSTRAINT IF EXISTS api_tokens_role_check")
    op.execute("ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_role_check CHECK (role IN ('butler', 'admin'))")
