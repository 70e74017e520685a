"""Target-state schema (seed 001 §5, column lists of seed 000), tenant_id on every memory table.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from alembic import op

revision = "0001"
down_revision = None
branch_labels = ("memory",)
depends_on = None

NAME = r"'^[a-z0-9][a-z0-9_.-]{0,62}$'"

UPGRADE = f"""
CREATE EXTENSION IF NOT EXISTS vector;

CREATE TABLE tenants (
    id TEXT PRIMARY KEY CHECK (id ~ {NAME}),
    display_name TEXT NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE api_tokens (
    id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    name TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    token_hash TEXT NOT NULL UNIQUE CHECK (length(token_hash) = 64),
    butlers TEXT[] NOT NULL CHECK (cardinality(butlers) >= 1),
    role TEXT NOT NULL CHECK (role IN ('butler', 'admin')),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at TIMESTAMPTZ
);

CREATE TABLE embedding_versions (
    id SMALLSERIAL PRIMARY KEY,
    model TEXT NOT NULL,
    revision TEXT NOT NULL,
    dimensions INT NOT NULL CHECK (dimensions > 0),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (model, revision)
);

-- Per-(tenant, butler) write order: the row lock on this counter serialises sequence assignment,
-- so within a shard key, commit order equals sequence order and the sequence has no gaps.
CREATE TABLE shard_sequences (
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    butler TEXT NOT NULL CHECK (butler ~ {NAME}),
    last_seq BIGINT NOT NULL CHECK (last_seq >= 0),
    PRIMARY KEY (tenant_id, butler)
);

-- The front's durable intake (an outbox): a write is "accepted" once its row commits here.
-- The id is the id of the episode/fact/rule the worker will create; (tenant_id, idempotency_key) is unique.
CREATE TABLE write_intents (
    id UUID PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    butler TEXT NOT NULL CHECK (butler ~ {NAME}),
    seq BIGINT NOT NULL CHECK (seq > 0),
    kind TEXT NOT NULL CHECK (kind IN ('episode', 'fact', 'rule')),
    payload JSONB NOT NULL,
    idempotency_key TEXT CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    request_id TEXT,
    actor TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'applied', 'dead_letter')),
    attempts INT NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    last_error TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    applied_at TIMESTAMPTZ,
    UNIQUE (tenant_id, butler, seq)
);
CREATE UNIQUE INDEX uq_write_intents_idempotency ON write_intents (tenant_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX idx_write_intents_pending ON write_intents (tenant_id, butler, seq) WHERE status = 'pending';
CREATE INDEX idx_write_intents_pending_age ON write_intents (created_at) WHERE status = 'pending';

CREATE TABLE episodes (
    id UUID PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    butler TEXT NOT NULL CHECK (butler ~ {NAME}),
    seq BIGINT NOT NULL CHECK (seq > 0),
    session_id UUID,
    content TEXT NOT NULL CHECK (length(content) BETWEEN 1 AND 100000),
    embedding vector(384) NOT NULL,
    embedding_version_id SMALLINT REFERENCES embedding_versions(id),
    search_vector tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    importance DOUBLE PRECISION NOT NULL DEFAULT 5.0 CHECK (importance BETWEEN 1 AND 10),
    reference_count INT NOT NULL DEFAULT 0 CHECK (reference_count >= 0),
    consolidation_status TEXT NOT NULL DEFAULT 'pending'
        CHECK (consolidation_status IN ('pending', 'consolidated', 'failed', 'dead_letter')),
    -- Compatibility projection of the status, derived by the database: never a second source of truth.
    consolidated BOOLEAN GENERATED ALWAYS AS (consolidation_status = 'consolidated') STORED,
    consolidation_attempts INT NOT NULL DEFAULT 0 CHECK (consolidation_attempts >= 0),
    last_consolidation_error TEXT,
    next_consolidation_retry_at TIMESTAMPTZ,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_referenced_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at TIMESTAMPTZ NOT NULL,
    forgotten_at TIMESTAMPTZ,
    request_id TEXT,
    metadata JSONB NOT NULL DEFAULT '{{}}',
    UNIQUE (tenant_id, butler, seq)
);
CREATE INDEX idx_episodes_butler ON episodes (tenant_id, butler, created_at DESC);
CREATE INDEX idx_episodes_unconsolidated ON episodes (tenant_id, butler, seq)
    WHERE consolidation_status IN ('pending', 'failed');
CREATE INDEX idx_episodes_expires ON episodes (expires_at);
CREATE INDEX idx_episodes_embedding ON episodes USING hnsw (embedding vector_cosine_ops);
CREATE INDEX idx_episodes_search ON episodes USING GIN (search_vector);

CREATE TABLE facts (
    id UUID PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    subject TEXT NOT NULL CHECK (length(subject) BETWEEN 1 AND 200),
    predicate TEXT NOT NULL CHECK (length(predicate) BETWEEN 1 AND 200),
    content TEXT NOT NULL CHECK (length(content) BETWEEN 1 AND 20000),
    embedding vector(384) NOT NULL,
    embedding_version_id SMALLINT REFERENCES embedding_versions(id),
    search_vector tsvector GENERATED ALWAYS AS (
        to_tsvector('english', subject || ' ' || replace(predicate, '_', ' ') || ' ' || content)) STORED,
    importance DOUBLE PRECISION NOT NULL DEFAULT 5.0 CHECK (importance BETWEEN 1 AND 10),
    confidence DOUBLE PRECISION NOT NULL DEFAULT 1.0 CHECK (confidence BETWEEN 0 AND 1),
    decay_rate DOUBLE PRECISION NOT NULL DEFAULT 0.008 CHECK (decay_rate >= 0 AND decay_rate <= 10),
    permanence TEXT NOT NULL DEFAULT 'standard'
        CHECK (permanence IN ('permanent', 'stable', 'standard', 'volatile', 'ephemeral')),
    source_butler TEXT,
    source_episode_id UUID REFERENCES episodes(id) ON DELETE SET NULL,
    supersedes_id UUID REFERENCES facts(id) ON DELETE SET NULL,
    superseded_by_id UUID REFERENCES facts(id) ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED,
    superseded_at TIMESTAMPTZ,
    validity TEXT NOT NULL DEFAULT 'active'
        CHECK (validity IN ('active', 'fading', 'superseded', 'expired', 'retracted')),
    scope TEXT NOT NULL DEFAULT 'global' CHECK (scope ~ {NAME}),
    reference_count INT NOT NULL DEFAULT 0 CHECK (reference_count >= 0),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_referenced_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_confirmed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    request_id TEXT,
    tags JSONB NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(tags) = 'array'),
    metadata JSONB NOT NULL DEFAULT '{{}}'
);
CREATE UNIQUE INDEX uq_facts_active_key ON facts (tenant_id, scope, subject, predicate)
    WHERE validity = 'active';
CREATE INDEX idx_facts_scope_validity ON facts (tenant_id, scope, validity);
CREATE INDEX idx_facts_subject ON facts (tenant_id, subject, predicate);
CREATE INDEX idx_facts_source_episode ON facts (source_episode_id) WHERE source_episode_id IS NOT NULL;
CREATE INDEX idx_facts_embedding ON facts USING hnsw (embedding vector_cosine_ops);
CREATE INDEX idx_facts_search ON facts USING GIN (search_vector);
CREATE INDEX idx_facts_tags ON facts USING GIN (tags);

CREATE TABLE rules (
    id UUID PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    content TEXT NOT NULL CHECK (length(content) BETWEEN 1 AND 20000),
    embedding vector(384) NOT NULL,
    embedding_version_id SMALLINT REFERENCES embedding_versions(id),
    search_vector tsvector GENERATED ALWAYS AS (to_tsvector('english', content)) STORED,
    scope TEXT NOT NULL DEFAULT 'global' CHECK (scope ~ {NAME}),
    maturity TEXT NOT NULL DEFAULT 'candidate'
        CHECK (maturity IN ('candidate', 'established', 'proven', 'anti_pattern')),
    validity TEXT NOT NULL DEFAULT 'active' CHECK (validity IN ('active', 'fading', 'expired', 'retracted')),
    importance DOUBLE PRECISION NOT NULL DEFAULT 5.0 CHECK (importance BETWEEN 1 AND 10),
    confidence DOUBLE PRECISION NOT NULL DEFAULT 0.5 CHECK (confidence BETWEEN 0 AND 1),
    decay_rate DOUBLE PRECISION NOT NULL DEFAULT 0.008 CHECK (decay_rate >= 0 AND decay_rate <= 10),
    permanence TEXT NOT NULL DEFAULT 'standard'
        CHECK (permanence IN ('permanent', 'stable', 'standard', 'volatile', 'ephemeral')),
    effectiveness_score DOUBLE PRECISION NOT NULL DEFAULT 0.0 CHECK (effectiveness_score BETWEEN 0 AND 1),
    applied_count INT NOT NULL DEFAULT 0 CHECK (applied_count >= 0),
    success_count INT NOT NULL DEFAULT 0 CHECK (success_count >= 0),
    harmful_count INT NOT NULL DEFAULT 0 CHECK (harmful_count >= 0),
    reference_count INT NOT NULL DEFAULT 0 CHECK (reference_count >= 0),
    source_butler TEXT,
    source_episode_id UUID REFERENCES episodes(id) ON DELETE SET NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_applied_at TIMESTAMPTZ,
    last_evaluated_at TIMESTAMPTZ,
    last_confirmed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_referenced_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    request_id TEXT,
    tags JSONB NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(tags) = 'array'),
    metadata JSONB NOT NULL DEFAULT '{{}}'
);
CREATE INDEX idx_rules_scope_maturity ON rules (tenant_id, scope, maturity);
CREATE INDEX idx_rules_source_episode ON rules (source_episode_id) WHERE source_episode_id IS NOT NULL;
CREATE INDEX idx_rules_embedding ON rules USING hnsw (embedding vector_cosine_ops);
CREATE INDEX idx_rules_search ON rules USING GIN (search_vector);

CREATE TABLE memory_links (
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    source_type TEXT NOT NULL CHECK (source_type IN ('episode', 'fact', 'rule')),
    source_id UUID NOT NULL,
    target_type TEXT NOT NULL CHECK (target_type IN ('episode', 'fact', 'rule')),
    target_id UUID NOT NULL,
    relation TEXT NOT NULL
        CHECK (relation IN ('derived_from', 'supports', 'contradicts', 'supersedes', 'related_to')),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, source_type, source_id, target_type, target_id, relation)
);
CREATE INDEX idx_memory_links_target ON memory_links (tenant_id, target_type, target_id);

CREATE TABLE memory_events (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    event_type TEXT NOT NULL,
    entity_type TEXT NOT NULL,
    entity_id UUID,
    occurred_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    actor TEXT NOT NULL,
    request_id TEXT,
    payload JSONB NOT NULL DEFAULT '{{}}'
);
CREATE INDEX idx_memory_events_tenant_time ON memory_events (tenant_id, id);
CREATE INDEX idx_memory_events_entity ON memory_events (entity_type, entity_id);

CREATE FUNCTION memory_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'memory_events is append-only: % refused', TG_OP USING ERRCODE = 'integrity_constraint_violation';
END $$;
CREATE TRIGGER trg_memory_events_append_only BEFORE UPDATE OR DELETE ON memory_events
    FOR EACH ROW EXECUTE FUNCTION memory_events_append_only();

CREATE TABLE rule_applications (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    rule_id UUID NOT NULL REFERENCES rules(id) ON DELETE CASCADE,
    outcome TEXT NOT NULL CHECK (outcome IN ('helpful', 'harmful')),
    reason TEXT,
    actor TEXT NOT NULL,
    request_id TEXT,
    occurred_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX idx_rule_applications_rule ON rule_applications (rule_id, occurred_at);

-- One row per consolidation batch: its idempotency key is the batch's identity, written in the
-- same transaction as the batch's effects, so a redelivered batch finds it and changes nothing.
CREATE TABLE consolidation_runs (
    id UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id TEXT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    butler TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    extractor TEXT NOT NULL,
    first_seq BIGINT NOT NULL,
    last_seq BIGINT NOT NULL,
    episode_count INT NOT NULL CHECK (episode_count >= 0),
    outcome TEXT NOT NULL CHECK (outcome IN ('consolidated', 'failed', 'partial')),
    started_at TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    worker TEXT,
    summary JSONB NOT NULL DEFAULT '{{}}',
    UNIQUE (tenant_id, idempotency_key)
);
CREATE INDEX idx_consolidation_runs_key ON consolidation_runs (tenant_id, butler, started_at);

-- Scheduled maintenance: one row per (task, tick) — the unique key makes a second beat's tick a no-op.
CREATE TABLE maintenance_runs (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task TEXT NOT NULL,
    tick TEXT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    finished_at TIMESTAMPTZ,
    summary JSONB NOT NULL DEFAULT '{{}}',
    UNIQUE (task, tick)
);
"""

DOWNGRADE = """
DROP TABLE IF EXISTS maintenance_runs, consolidation_runs, rule_applications, memory_events, memory_links,
    rules, facts, episodes, write_intents, shard_sequences, embedding_versions, api_tokens, tenants CASCADE;
DROP FUNCTION IF EXISTS memory_events_append_only();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
