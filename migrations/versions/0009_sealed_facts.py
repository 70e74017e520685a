"""Field-level encryption of facts (issue 16, item 10): the sealed content (AES-GCM) and its key id per row; the
content column then holds a surrogate, which is all the generated full-text vector and the embedding ever see.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE facts ADD COLUMN content_sealed bytea, ADD COLUMN content_key_id text")
    op.execute(
        "ALTER TABLE facts ADD CONSTRAINT facts_sealed_has_key "
        "CHECK ((content_sealed IS NULL) = (content_key_id IS NULL))"
    )
    # `memory-butler encryption rotate` finds the rows sealed under another key than the active one.
    op.execute("CREATE INDEX idx_facts_content_key ON facts (content_key_id) WHERE content_key_id IS NOT NULL")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS idx_facts_content_key")
    op.execute("ALTER TABLE facts DROP CONSTRAINT IF EXISTS facts_sealed_has_key")
    op.execute("ALTER TABLE facts DROP COLUMN content_key_id, DROP COLUMN content_sealed")
