"""Each memory's token count, stored at write time so the context builder does not tokenize what it already knows.

NULL (rows written before this revision, or rewritten by the decay sweep's anti-pattern inversion) means
"count it when read".

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TABLES = ("episodes", "facts", "rules")


def upgrade() -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} ADD COLUMN content_tokens integer CHECK (content_tokens >= 0)")


def downgrade() -> None:
    for table in TABLES:
        op.execute(f"ALTER TABLE {table} DROP COLUMN content_tokens")
