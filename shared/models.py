"""SQLAlchemy Core tables: the query-side mirror of migrations/versions (the DDL there is authoritative).

tests/integration/test_schema.py checks that every column here exists in the migrated database.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    Table,
    Text,
    Computed,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR, UUID

EMBEDDING_DIM = 384

metadata = MetaData()


def _ts(name: str, **kw: Any) -> Column[datetime]:
    return Column(name, DateTime(timezone=True), **kw)


tenants = Table(
    "tenants",
    metadata,
    Column("id", Text, primary_key=True),
    Column("display_name", Text, nullable=False, server_default=""),
    _ts("created_at", nullable=False),
)

api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("token_hash", Text, nullable=False, unique=True),
    Column("butlers", ARRAY(Text), nullable=False),
    Column("role", Text, nullable=False),
    _ts("created_at", nullable=False),
    _ts("revoked_at"),
    _ts("expires_at"),
)

# A purged tenant's tombstone: kept outside the tenant (no foreign key), the audit of its erasure.
tenant_purges = Table(
    "tenant_purges",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("requested_by", Text, nullable=False),
    _ts("started_at", nullable=False),
    _ts("finished_at"),
    Column("counts", JSONB, nullable=False),
)

embedding_versions = Table(
    "embedding_versions",
    metadata,
    Column("id", SmallInteger, primary_key=True),
    Column("model", Text, nullable=False),
    Column("revision", Text, nullable=False),
    Column("dimensions", Integer, nullable=False),
    _ts("created_at", nullable=False),
)

shard_sequences = Table(
    "shard_sequences",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("butler", Text, primary_key=True),
    Column("last_seq", BigInteger, nullable=False),
)

write_intents = Table(
    "write_intents",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("butler", Text, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("kind", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("idempotency_key", Text),
    Column("request_id", Text),
    Column("actor", Text, nullable=False),
    Column("status", Text, nullable=False, server_default="pending"),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("last_error", Text),
    _ts("created_at", nullable=False),
    _ts("applied_at"),
    Column("payload_hash", Text),  # sha256 of (kind, payload): a replay must carry the same write
    _ts("next_attempt_at"),  # a failed intent waits until then (backoff), and its key's later intents too
    Column("trace_context", JSONB),  # the accepting call's W3C traceparent/tracestate (shared.tracing)
)

# Partitioned by month of created_at (the accept time, migration 0018): its key is (tenant_id, id, created_at), and
# nothing references it by a foreign key (triggers keep the old keys' cascade, set-null and check).
episodes = Table(
    "episodes",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("butler", Text, nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("session_id", UUID(as_uuid=True)),
    Column("content", Text, nullable=False),
    Column("content_tokens", Integer),  # see shared.context.content_tokens
    Column("embedding", Vector(EMBEDDING_DIM), nullable=False),
    Column("embedding_version_id", SmallInteger),
    Column("search_vector", TSVECTOR, Computed("to_tsvector('english', content)", persisted=True)),
    Column("importance", Float, nullable=False),
    Column("reference_count", Integer, nullable=False, server_default="0"),
    Column("consolidation_status", Text, nullable=False, server_default="pending"),
    Column("consolidated", Boolean, Computed("consolidation_status = 'consolidated'", persisted=True)),
    Column("consolidation_attempts", Integer, nullable=False, server_default="0"),
    Column("last_consolidation_error", Text),
    _ts("next_consolidation_retry_at"),
    _ts("created_at", nullable=False),
    _ts("last_referenced_at", nullable=False),
    _ts("expires_at", nullable=False),
    _ts("forgotten_at"),
    Column("request_id", Text),
    Column("metadata", JSONB, nullable=False, server_default="{}"),
    _ts("occurred_at", nullable=False),
    Column("preceding", Text),  # the turn before it in its session (see shared.conversation)
    Column("context_vector", TSVECTOR, Computed("to_tsvector('english', coalesce(preceding, ''))", persisted=True)),
)

# An episode's other embeddings: n = 0 itself after its preceding turn, n >= 1 windows of a long one
# (see shared.conversation).
episode_vectors = Table(
    "episode_vectors",
    metadata,
    Column("episode_id", UUID(as_uuid=True), primary_key=True),
    Column("n", SmallInteger, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("butler", Text, nullable=False),
    Column("embedding", Vector(EMBEDDING_DIM), nullable=False),
)

# An episode's term postings (keyword leg): written by the database's triggers on episodes, never by the code.
episode_terms = Table(
    "episode_terms",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("butler", Text, primary_key=True),
    Column("lexeme", Text, primary_key=True),
    Column("episode_id", UUID(as_uuid=True), primary_key=True),
    Column("tf", Float, nullable=False),
    Column("ctf", Float, nullable=False),
)

facts = Table(
    "facts",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("subject", Text, nullable=False),
    Column("predicate", Text, nullable=False),
    Column("content", Text, nullable=False),
    Column("content_tokens", Integer),  # see shared.context.content_tokens
    Column("embedding", Vector(EMBEDDING_DIM), nullable=False),
    Column("embedding_version_id", SmallInteger),
    Column(
        "search_vector",
        TSVECTOR,
        Computed(
            "to_tsvector('english', subject || ' ' || replace(predicate, '_', ' ') || ' ' || content)", persisted=True
        ),
    ),
    Column("importance", Float, nullable=False),
    Column("confidence", Float, nullable=False),
    Column("decay_rate", Float, nullable=False),
    Column("permanence", Text, nullable=False),
    Column("source_butler", Text),
    Column("source_episode_id", UUID(as_uuid=True)),
    Column("supersedes_id", UUID(as_uuid=True)),
    Column("superseded_by_id", UUID(as_uuid=True)),
    _ts("superseded_at"),
    Column("validity", Text, nullable=False, server_default="active"),
    Column("scope", Text, nullable=False, server_default="global"),
    Column("reference_count", Integer, nullable=False, server_default="0"),
    _ts("created_at", nullable=False),
    _ts("last_referenced_at", nullable=False),
    _ts("last_confirmed_at", nullable=False),
    Column("request_id", Text),
    Column("tags", JSONB, nullable=False, server_default="[]"),
    Column("metadata", JSONB, nullable=False, server_default="{}"),
    # Field-level encryption (shared.protection): content then holds a surrogate, these the sealed content.
    Column("content_sealed", LargeBinary),
    Column("content_key_id", Text),
)

rules = Table(
    "rules",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("content", Text, nullable=False),
    Column("content_tokens", Integer),  # see shared.context.content_tokens
    Column("embedding", Vector(EMBEDDING_DIM), nullable=False),
    Column("embedding_version_id", SmallInteger),
    Column("search_vector", TSVECTOR, Computed("to_tsvector('english', content)", persisted=True)),
    Column("scope", Text, nullable=False, server_default="global"),
    Column("maturity", Text, nullable=False, server_default="candidate"),
    Column("validity", Text, nullable=False, server_default="active"),
    Column("importance", Float, nullable=False),
    Column("confidence", Float, nullable=False),
    Column("decay_rate", Float, nullable=False),
    Column("permanence", Text, nullable=False),
    Column("effectiveness_score", Float, nullable=False),
    Column("applied_count", Integer, nullable=False, server_default="0"),
    Column("success_count", Integer, nullable=False, server_default="0"),
    Column("harmful_count", Integer, nullable=False, server_default="0"),
    Column("reference_count", Integer, nullable=False, server_default="0"),
    Column("source_butler", Text),
    Column("source_episode_id", UUID(as_uuid=True)),
    _ts("created_at", nullable=False),
    _ts("last_applied_at"),
    _ts("last_evaluated_at"),
    _ts("last_confirmed_at", nullable=False),
    _ts("last_referenced_at", nullable=False),
    Column("request_id", Text),
    Column("tags", JSONB, nullable=False, server_default="[]"),
    Column("metadata", JSONB, nullable=False, server_default="{}"),
)

memory_links = Table(
    "memory_links",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("source_type", Text, primary_key=True),
    Column("source_id", UUID(as_uuid=True), primary_key=True),
    Column("target_type", Text, primary_key=True),
    Column("target_id", UUID(as_uuid=True), primary_key=True),
    Column("relation", Text, primary_key=True),
    _ts("created_at", nullable=False),
)

memory_events = Table(
    "memory_events",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("event_type", Text, nullable=False),
    Column("entity_type", Text, nullable=False),
    Column("entity_id", UUID(as_uuid=True)),
    _ts("occurred_at", nullable=False),
    Column("actor", Text, nullable=False),
    Column("request_id", Text),
    Column("payload", JSONB, nullable=False),
)

rule_applications = Table(
    "rule_applications",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("rule_id", UUID(as_uuid=True), nullable=False),
    Column("outcome", Text, nullable=False),
    Column("reason", Text),
    Column("actor", Text, nullable=False),
    Column("request_id", Text),
    _ts("occurred_at", nullable=False),
)

# One row per idempotent feedback call (memory_confirm, memory_mark_*): a retry answers the stored result.
feedback_receipts = Table(
    "feedback_receipts",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("butler", Text, primary_key=True),
    Column("idempotency_key", Text, primary_key=True),
    Column("tool", Text, nullable=False),
    Column("entity_id", UUID(as_uuid=True), nullable=False),
    Column("payload_hash", Text, nullable=False),
    Column("result", JSONB, nullable=False, server_default="{}"),
    _ts("created_at", nullable=False),
)

consolidation_runs = Table(
    "consolidation_runs",
    metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("tenant_id", Text, nullable=False),
    Column("butler", Text, nullable=False),
    Column("idempotency_key", Text, nullable=False),
    Column("extractor", Text, nullable=False),
    Column("first_seq", BigInteger, nullable=False),
    Column("last_seq", BigInteger, nullable=False),
    Column("episode_count", Integer, nullable=False),
    Column("outcome", Text, nullable=False),
    _ts("started_at", nullable=False),
    _ts("finished_at", nullable=False),
    Column("worker", Text),
    Column("summary", JSONB, nullable=False),
)

maintenance_runs = Table(
    "maintenance_runs",
    metadata,
    Column("id", BigInteger, primary_key=True),
    Column("task", Text, nullable=False),
    Column("tick", Text, nullable=False),
    _ts("started_at", nullable=False),
    _ts("finished_at"),
    Column("summary", JSONB, nullable=False),
)

MEMORY_TABLES = {"episode": episodes, "fact": facts, "rule": rules}
