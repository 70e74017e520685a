"""One typed Settings object: defaults from the seed, then butler.toml, then the environment.

This is the only module that reads environment variables. Precedence (first wins):
environment (``DATABASE_URL``, ``REDIS_URL``, ``MEMORY_BUTLER_*`` with ``__`` for nesting) >
``butler.toml`` (path from ``MEMORY_BUTLER_CONFIG``, else ``./butler.toml`` if present) > defaults.
A bad value fails at start with :class:`ConfigError`, whose message names the key.
"""

from __future__ import annotations

import os
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

ENV_PREFIX = "MEMORY_BUTLER_"
# PostgreSQL ends the session of a client that vanished without closing its connection within about this long.
DEAD_CLIENT_TIMEOUT_S = 60.0
CONFIG_ENV = "MEMORY_BUTLER_CONFIG"


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the key (e.g. ``memory.facts.expiry_confidence_threshold``)."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EpisodeSettings(_Section):
    default_ttl_days: float = Field(7, gt=0, le=3650)
    max_entries: int = Field(10_000, ge=1)


class FactSettings(_Section):
    retrieval_confidence_threshold: float = Field(0.2, ge=0, le=1)
    expiry_confidence_threshold: float = Field(0.05, ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> "FactSettings":
        if self.expiry_confidence_threshold > self.retrieval_confidence_threshold:
            raise ValueError("expiry_confidence_threshold must not exceed retrieval_confidence_threshold")
        return self


class PromoteToEstablished(_Section):
    min_successes: int = Field(5, ge=0)
    min_effectiveness: float = Field(0.6, ge=0, le=1)


class PromoteToProven(_Section):
    min_successes: int = Field(15, ge=0)
    min_effectiveness: float = Field(0.8, ge=0, le=1)
    min_age_days: float = Field(30, ge=0)


class HarmfulToAntiPattern(_Section):
    min_harmful: int = Field(3, ge=1)
    max_effectiveness: float = Field(0.3, ge=0, le=1)


class RuleSettings(_Section):
    promote_to_established: PromoteToEstablished = PromoteToEstablished()
    promote_to_proven: PromoteToProven = PromoteToProven()
    harmful_to_antipattern: HarmfulToAntiPattern = HarmfulToAntiPattern()
    baseline_confidence: float = Field(0.5, ge=0, le=1)
    # Promotion and demotion judge effectiveness over the rule's applications (rule_applications), each weighted
    # by its age with this half-life: a rule that helped a year ago and harms today is demoted, not shielded by
    # its old successes. Counts (min_successes, min_harmful) stay plain counts.
    evidence_half_life_days: float = Field(90, gt=0)


class ScoreWeights(_Section):
    relevance: float = Field(0.4, ge=0, le=1)
    importance: float = Field(0.3, ge=0, le=1)
    recency: float = Field(0.2, ge=0, le=1)
    confidence: float = Field(0.1, ge=0, le=1)


class SemanticWeights(_Section):
    """fusion="value": the cosine's weight against BM25's, per memory type. Raw conversation turns keep the
    speaker's own words, so their exact terms count for more (chosen on the conversation dev split); facts and rules
    are rewritten, normalised statements whose shared words with a question are mostly incidental (chosen on the
    synthetic set, where keyword noise reorders paraphrases below 0.9)."""

    episode: float = Field(0.6, ge=0, le=1)
    fact: float = Field(0.9, ge=0, le=1)
    rule: float = Field(0.9, ge=0, le=1)


class SectionQuotas(_Section):
    """Share of the context token budget each section is first given (rules' share covers the anti-pattern
    warnings, a quarter of it); unused share flows to later sections, and what is left at the end goes back to the
    sections in order (shared.context)."""

    facts: float = Field(0.5, ge=0, le=1)
    rules: float = Field(0.3, ge=0, le=1)
    episodes: float = Field(0.2, ge=0, le=1)


class RetrievalSettings(_Section):
    default_limit: int = Field(20, ge=1, le=200)
    default_mode: Literal["hybrid", "semantic", "keyword"] = "hybrid"
    context_token_budget: int = Field(3000, ge=50, le=32_000)
    score_weights: ScoreWeights = ScoreWeights()
    section_quotas: SectionQuotas = SectionQuotas()
    # Hybrid fusion: "value" = semantic_weight * cosine + (1 - semantic_weight) * BM25 share, both legs scored for
    # every candidate; "rrf" = reciprocal rank fusion of the two lists (the seed's; kept as an option).
    # The defaults were chosen on the conversation dev split (BENCHMARKS.md, "Conversation retrieval").
    fusion: Literal["value", "rrf"] = "value"
    semantic_weight: SemanticWeights = SemanticWeights()
    # The BM25 share is raised to this power: >1 discounts partial keyword matches. 1 (the share as it is) was chosen
    # on RealMem dev and LoCoMo 1-5, and held on RealMem 6-10 and LoCoMo 6-10 (BENCHMARKS.md, "keyword exponent").
    keyword_exponent: float = Field(1.0, ge=1, le=4)
    bm25_k1: float = Field(0.6, gt=0, le=3)  # term-frequency saturation: chat turns are short, saturate early
    bm25_b: float = Field(0.3, ge=0, le=1)  # length normalisation: long assistant turns are not penalised much
    # What a query term found in an episode's preceding turn counts for (1 = as in the episode itself).
    context_weight: float = Field(0.3, ge=0, le=1)
    # Hybrid episodes: this share of a turn's relevance comes from the mean of its session's best session_top
    # candidates, so a session answering in several turns lifts each of them (0 = off; shared.fusion).
    session_share: float = Field(0.3, ge=0, le=1)
    session_top: int = Field(2, ge=1, le=20)
    # recall/context: each further hit of a session (episodes) or subject+predicate (facts) already listed scores
    # this much less (multiplied once per earlier hit), so a list covers more of what was said. 1 = no spreading:
    # the answering turns of one conversation sit together, and spreading them cost the block its evidence on both
    # conversation sets (BENCHMARKS.md, "LoCoMo"); e.g. 0.92 to spread.
    diversity_decay: float = Field(1.0, gt=0, le=1)
    # memory_search: the same for its list, below its first search_diversity_head hits, which keep their relevance
    # order: the head holds the answering turns, the rest of a long list reaches more sessions. Chosen on RealMem dev
    # (BENCHMARKS.md, "A list's tail"); decay 1 or a head >= the limit rank by relevance alone.
    search_diversity_decay: float = Field(0.8, gt=0, le=1)
    search_diversity_head: int = Field(10, ge=0, le=200)
    # recall/context: a rule-based reading of the question (identity, preference, procedure, event) nudges facts
    # against rules and durable facts against passing ones (shared.intent).
    intent_routing: bool = True
    # memory_search's optional second stage (shared.rerank): "cross-encoder" reorders the top reranker_top_n hits
    # with the model in reranker_path (a local directory; no weights ship with the project).
    reranker: Literal["none", "cross-encoder"] = "none"
    reranker_path: str = ""
    reranker_top_n: int = Field(20, ge=1, le=200)
    rrf_k: int = Field(60, ge=1)
    # fusion="rrf" only: a keyword match joins the fusion only if it covers more than this share of the query's idf
    # weight: a clear majority, so a row holding one of two similarly rare terms (share ~0.5) stays out.
    hybrid_keyword_min_strength: float = Field(0.6, ge=0, le=1)
    # Recency is exp(-rate * days since last reference); 0.05/day halves in ~14 days.
    recency_decay_per_day: float = Field(0.05, ge=0)
    candidate_pool: int = Field(50, ge=1, le=1000)
    # memory_context's episodes: the best matches for the prompt, ranked by (1 - share) * relevance + share *
    # recency of when they happened; the newest few always compete (the conversation so far).
    context_recent_episodes: int = Field(5, ge=0, le=100)
    context_episode_recency: float = Field(0.2, ge=0, le=1)
    read_timeout_ms: int = Field(2000, ge=10, le=60_000)

    @model_validator(mode="after")
    def _reranker_has_a_model(self) -> "RetrievalSettings":
        if self.reranker == "cross-encoder" and not Path(self.reranker_path).is_dir():
            raise ValueError(
                "reranker_path must be a directory holding the cross-encoder when reranker = "
                f"'cross-encoder' (got {self.reranker_path!r})"
            )
        return self


class MemorySettings(_Section):
    embedding_model: str = "all-MiniLM-L6-v2"
    embedding_dimensions: Literal[384] = 384
    episodes: EpisodeSettings = EpisodeSettings()
    facts: FactSettings = FactSettings()
    rules: RuleSettings = RuleSettings()
    retrieval: RetrievalSettings = RetrievalSettings()


class ScheduleEntry(_Section):
    cron: str
    prompt: str = ""

    @model_validator(mode="after")
    def _five_fields(self) -> "ScheduleEntry":
        if len(self.cron.split()) != 5:
            raise ValueError(f"cron must have 5 fields (minute hour day month weekday), got {self.cron!r}")
        return self


class ScheduleSettings(_Section):
    consolidate: ScheduleEntry = ScheduleEntry(cron="0 */6 * * *", prompt="Run memory consolidation")
    decay_sweep: ScheduleEntry = ScheduleEntry(cron="0 3 * * *", prompt="Run confidence decay sweep")
    episode_cleanup: ScheduleEntry = ScheduleEntry(cron="0 4 * * *", prompt="Expire old episodes")
    # Not in the seed: memory_events' and episodes' monthly partitions are created ahead, events' months dropped
    # past their retention (an episodes' month goes with the episode cleanup once all of it is past its TTL).
    event_partitions: ScheduleEntry = ScheduleEntry(cron="30 4 * * *", prompt="Maintain event partitions")
    # Not in the seed: bursts must not wait 6 h, and lost messages must be re-sent.
    backlog_trigger_seconds: float = Field(30, gt=0)
    redelivery_sweep_seconds: float = Field(15, gt=0)
    # maintenance_runs rows (one per task tick, ~8,600 a day) older than this are deleted by the episode cleanup.
    runs_retention_days: float = Field(14, gt=0)
    # Applied write intents older than this are deleted by the episode cleanup (a forget scrubs its intent at
    # once); an idempotency key answers a replay with the first id for this long.
    intents_retention_days: float = Field(3, gt=0)
    # Dead letters (episodes and write intents) outlive the episode TTL: they wait this long (from acceptance)
    # for a redrive or an explicit drop, then the episode cleanup deletes them.
    dead_letters_retention_days: float = Field(30, gt=0)
    # memory_events months wholly older than this are dropped (a partition at a time); 0 keeps every month.
    events_retention_days: float = Field(0, ge=0)
    # Monthly events partitions kept ready beyond the current month (a missed month lands in the DEFAULT one).
    events_partitions_ahead_months: int = Field(3, ge=1, le=24)
    # Monthly episodes partitions kept ready beyond the current month (by accept time; same DEFAULT fallback).
    episodes_partitions_ahead_months: int = Field(3, ge=1, le=24)


class ConsolidationSettings(_Section):
    extractor: Literal["heuristic", "openai", "command"] = "heuristic"
    # Consolidate a key as soon as its episodes are applied (else only on the schedule and the backlog trigger).
    after_apply: bool = True
    batch_size: int = Field(50, ge=1, le=1000)
    # And at most this many tokens of episode text per batch (a batch always holds at least one episode): a
    # language model's prompt stays inside its context window however long the episodes are.
    batch_tokens: int = Field(6000, ge=100)
    max_attempts: int = Field(5, ge=1, le=100)
    backoff_base_seconds: float = Field(30, gt=0)
    backoff_max_seconds: float = Field(3600, gt=0)
    openai_base_url: str = "http://127.0.0.1:11434/v1"
    openai_model: str = "gpt-4o-mini"
    openai_api_key: str = ""
    openai_timeout_seconds: float = Field(120, gt=0)
    # How the answer's JSON schema is asked for: "json_schema" (OpenAI, vLLM, Ollama >= 0.5, llama.cpp's
    # llama-server) or "json_object" with the schema beside it (llama-cpp-python's server, which refuses the first).
    openai_response_format: Literal["json_schema", "json_object"] = "json_schema"
    # An answer longer than this is cut off and refused (finish_reason=length), so a model that runs away costs a
    # bounded time (a 1.5B local model once generated for 500 s).
    openai_max_tokens: int = Field(4096, ge=256, le=65536)
    command: list[str] = []
    command_timeout_seconds: float = Field(300, gt=0)
    # A new fact or rule that says what a known one says (MiniLM cosine at least this, and the same numbers,
    # names and polarity: shared.consolidation_plan.same_meaning) confirms the known one instead of adding a
    # second; a rule like an anti-pattern is not learned again. Measured: paraphrased rules 0.75-0.82, different
    # rules 0.27-0.55; the same fact reworded 0.92-0.96, another value of one predicate 0.55-0.74.
    rule_match_similarity: float = Field(0.75, ge=0, le=1)
    fact_match_similarity: float = Field(0.85, ge=0, le=1)
    # Derived memories take the batch butler's scope; a fact whose predicate (its vocabulary base, e.g.
    # "name", "allergic_to") is listed here is published to every butler of the tenant instead.
    global_predicates: list[str] = []


class WorkerSettings(_Section):
    shard_count: int = Field(8, ge=1, le=1024)
    ingest_batch_size: int = Field(256, ge=1, le=4096)
    task_time_limit_seconds: int = Field(600, ge=10)
    # A write intent that failed to apply is retried after an equal-jitter exponential backoff (on the database
    # clock): base, 2x base, 4x base ... capped; its key's later intents wait behind it. With 5 attempts
    # (consolidation.max_attempts) and these defaults a transient failure has ~40-75 s to clear before the
    # intent is dead-lettered.
    apply_backoff_base_seconds: float = Field(5.0, gt=0)
    apply_backoff_max_seconds: float = Field(300.0, gt=0)
    # Each worker node serves its pool processes' metrics (prometheus_client multiprocess mode) on this port;
    # 0 = not served. Bind to an address only Prometheus reaches: worker metrics carry no tenant, and no auth.
    metrics_port: int = Field(0, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    # Where the pool processes write their samples (emptied when the node starts); default
    # <data_dir>/worker-metrics/<node name>.
    metrics_dir: Path | None = None


class EmbeddingSettings(_Section):
    backend: Literal["onnx", "torch"] = "onnx"
    # Where the ONNX export of the installed model is kept (made once per machine, shared by every data dir).
    cache_dir: Path = Path.home() / ".cache" / "memory-butler"

    @field_validator("cache_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    # One thread per process for batches (workers, backfills): two processes with two threads each halve total
    # throughput on 2 cores.
    threads: int = Field(1, ge=1, le=64)
    # Threads for the front's query embeddings (one model call per micro-batch, see shared.query_batcher). One:
    # a second thread spins while it waits for work, ~2x the CPU per query (measured on 2 cores: 4.9 vs 10.0 ms
    # for a single query, 2.7 vs 5.1 ms per query in batches of 8) for ~4 ms less latency on an idle machine.
    query_threads: int = Field(1, ge=1, le=64)
    # A query alone of at least query_long_tokens word pieces runs on this many threads instead (a second session
    # of the model): long questions are the slow reads, and a batch of one means the front is not busy. Measured
    # on 2 cores (calm): 87 word pieces 13.8 -> 8.0 ms, 172 word pieces 27.9 -> 17.1 ms, for 15-20 % more CPU.
    # 1 (or query_threads) = no second session.
    query_long_threads: int = Field(2, ge=1, le=64)
    query_long_tokens: int = Field(64, ge=1, le=512)
    # Queries run on the model with 8-bit weights (ONNX; stored memories keep the float vectors unless store_int8):
    # about half the CPU per query on the project's fast machine (none saved on an AVX2-only CPU without VNNI), each
    # vector within ~0.007 cosine of the float one, the same retrieval quality on the conversation benchmark's both
    # splits (BENCHMARKS.md, "Embedding backends"). false = the float model.
    query_int8: bool = True
    # Stored memories (episodes, their context and windows, facts, rules) are embedded on the int8 model too, each
    # text alone: the workers' embedding is their main cost (BENCHMARKS.md, "Stored vectors: smaller batches,
    # and an int8 option").
    store_int8: bool = False
    # The front's concurrent reads share one model call per batch: the embedding thread waits at most this long
    # for more queries after the first (0 = embed what is queued right away). See shared.query_batcher. Not with
    # the int8 query model, which runs each text alone: a batch saves it nothing, so it never waits.
    query_batch_wait_ms: float = Field(1.0, ge=0, le=50)
    # How long an identical query text reuses its embedding (an LRU of 1024 texts per front; 0 = no reuse).
    query_cache_ttl_s: float = Field(60.0, ge=0, le=86_400)
    mkldnn: bool = False


class ReplicaSettings(_Section):
    """The read plane (DATABASE_READ_URL): when a replica stops serving reads and how often it is checked."""

    # A replica further behind the primary than this serves no reads (they go to the primary): a memory written
    # this long ago must show in memory_recall. Also the alert's bound (deploy/prometheus).
    max_lag_seconds: float = Field(10, gt=0, le=3600)
    # How often each front reads the primary's and each replica's WAL position (two tiny queries per replica).
    check_interval_seconds: float = Field(1.0, ge=0.05, le=60)


class ApiSettings(_Section):
    host: str = "127.0.0.1"
    port: int = Field(8150, ge=1, le=65535)
    max_batch: int = Field(500, ge=1, le=10_000)
    max_content_chars: int = Field(20_000, ge=100)
    # Reads a front process admits beyond the read_threads it runs at once; one more answers degraded at once
    # (fail open) instead of waiting past its deadline. Accepts are not counted: they have their own threads.
    read_queue: int = Field(48, ge=0, le=10_000)
    # Reads a front process runs at once (threads); the rest wait in the read queue, holding no thread and no GIL.
    # Few: a read mostly waits (database, embedding), and every runnable read thread takes CPU and GIL turns from
    # the accepts (measured on 2 cores, 40 context readers + 20 accepts/s: accept p50 150-270 ms with 4 threads,
    # 420 with 6, 500-560 with 8, 660-950 with 24, at the same read rate; docs/capacity.md).
    read_threads: int = Field(4, ge=1, le=24)
    # Front processes `serve` starts (uvicorn workers; the front is stateless): 0 = one per two available cores.
    workers: int = Field(0, ge=0, le=64)
    # memory_context_batch's total work: at most this many blocks, this many tokens of budget summed over them,
    # and this long in all (blocks not built by then come back empty and degraded, never late).
    context_batch_max_requests: int = Field(64, ge=1, le=10_000)
    context_batch_max_tokens: int = Field(200_000, ge=100)
    context_batch_deadline_seconds: float = Field(15.0, gt=0)
    # Per-token limits on tool calls, per front (0 = off, the embedded stack's default; compose turns them on):
    # a token bucket of token_rate_per_second refilling up to token_burst calls, and at most
    # token_max_concurrent calls in flight. Over a limit a call answers rate_limited (retryable).
    token_rate_per_second: float = Field(0.0, ge=0)
    token_burst: int = Field(0, ge=0)
    token_max_concurrent: int = Field(0, ge=0)
    # A feedback call's idempotency_key (memory_confirm, memory_mark_*) is remembered this long: a retry after that
    # counts again. Writes' keys live as long as their intents.
    feedback_key_retention_days: float = Field(7.0, gt=0)


Detector = Literal["secret", "email", "iban", "card", "national_id", "phone"]
# The names of shared.redaction.DETECTORS.
REDACTION_DETECTORS: tuple[Detector, ...] = ("secret", "email", "iban", "card", "national_id", "phone")


def _check_patterns(patterns: list[str]) -> list[str]:
    from shared.redaction import compile_custom  # pure; imported here so config stays the root of the graph

    compile_custom(patterns)
    return patterns


class RedactionOverride(_Section):
    """One tenant's redaction policy: each key given replaces the default's (unset keys inherit it)."""

    enabled: bool | None = None
    detectors: list[Detector] | None = None
    custom_patterns: list[str] | None = None

    @field_validator("custom_patterns")
    @classmethod
    def _compiles(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _check_patterns(value)


class RedactionSettings(_Section):
    """Redaction before persistence (shared.redaction, shared.protection): episode, fact and rule content (and a
    fact's subject, a harmful mark's reason) lose what the detectors find before anything is written."""

    enabled: bool = True
    detectors: list[Detector] = list(REDACTION_DETECTORS)
    # Python regular expressions; every match becomes [CUSTOM]. Checked at start (a bad one names itself).
    custom_patterns: list[str] = []
    # tenant id -> override, e.g. [butler.redaction.tenants.acme] detectors = ["secret", "card"]
    tenants: dict[str, RedactionOverride] = {}

    @field_validator("custom_patterns")
    @classmethod
    def _compiles(cls, value: list[str]) -> list[str]:
        return _check_patterns(value)


class EncryptionSettings(_Section):
    """Field-level encryption of facts whose base predicate is listed (shared.crypto, shared.protection)."""

    # Base predicates (the vocabulary's, e.g. "medical_condition", "diagnosis", "iban"); empty = nothing encrypted.
    predicates: list[str] = []
    # key id -> 32-byte AES key, base64 (urlsafe or standard). Give them by environment, never in a shared file:
    # MEMORY_BUTLER_ENCRYPTION__KEYS='{"k2026": "..."}'. Old keys stay listed until `encryption rotate` has run.
    keys: dict[str, SecretStr] = {}
    # The key new rows are sealed with (and `encryption rotate` re-seals to).
    active_key: str = ""
    # The key whose derivation blinds the value part of a sealed set predicate ("allergic_to_<value>" is stored as
    # "allergic_to_<16 hex>"); "" = active_key. Keep it fixed (and listed) across rotations: blinded predicates must
    # stay equal for a new fact to supersede an old one.
    index_key: str = ""
    # Butlers whose tokens read the plaintext ("*" = every caller who may see the fact; an admin token covers every
    # butler). Other callers get the surrogate "[ENCRYPTED <predicate>]".
    readers: list[str] = ["*"]

    @model_validator(mode="after")
    def _usable(self) -> "EncryptionSettings":
        from shared.crypto import decode_key

        for key_id, secret in self.keys.items():
            decode_key(secret.get_secret_value(), key_id=key_id)
        if self.predicates and self.active_key not in self.keys:
            raise ValueError(f"active_key {self.active_key!r} must be one of keys when predicates are listed")
        if self.index_key and self.index_key not in self.keys:
            raise ValueError(f"index_key {self.index_key!r} must be one of keys")
        return self

    @field_validator("predicates")
    @classmethod
    def _normalised(cls, value: list[str]) -> list[str]:
        from shared.vocabulary import base_predicate

        return [base_predicate(p) for p in value]


class TracingSettings(_Section):
    """OpenTelemetry traces (shared.tracing), off by default. An otlp_endpoint alone turns on the OTLP exporter."""

    # none: no tracing at all (nothing is instrumented); console: one JSON span per line on stdout (development);
    # otlp: OTLP over HTTP/protobuf to otlp_endpoint (a collector, Jaeger, Tempo...); auto: otlp if an endpoint is
    # set, else none.
    exporter: Literal["auto", "none", "console", "otlp"] = "auto"
    otlp_endpoint: str = ""
    service_name: str = "memory-butler"
    sample_ratio: float = Field(1.0, ge=0, le=1)  # of root traces; a caller's sampled/unsampled flag is kept

    @property
    def active_exporter(self) -> str:
        """The exporter in force: the explicit one, else otlp when an endpoint is set, else none."""
        if self.exporter != "auto":
            return self.exporter
        return "otlp" if self.otlp_endpoint else "none"

    @model_validator(mode="after")
    def _otlp_has_an_endpoint(self) -> "TracingSettings":
        if self.exporter == "otlp" and not self.otlp_endpoint:
            raise ValueError("otlp_endpoint must be set when exporter = 'otlp' (e.g. 'http://127.0.0.1:4318')")
        return self


class Settings(BaseSettings):
    """Everything configurable. Build with :func:`load_settings`, never by reading ``os.environ`` elsewhere."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True)

    database_url: str | None = Field(None, validation_alias=AliasChoices("DATABASE_URL", "database_url"))
    # One or more streaming replicas of database_url, comma-separated: the fronts' reads go there (docs/replicas.md).
    database_read_url: str | None = Field(None, validation_alias=AliasChoices("DATABASE_READ_URL", "database_read_url"))
    redis_url: str | None = Field(None, validation_alias=AliasChoices("REDIS_URL", "redis_url"))
    data_dir: Path = Path.home() / ".memory-butler"
    tenant_id: str = Field("default", pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    flower_port: int = Field(5555, ge=1, le=65535)
    flower_basic_auth: str = "admin:memory-butler"
    # How long PostgreSQL keeps the session, open transaction and advisory locks of a client that vanished without
    # closing its connection (a host lost power or was cut off the network): every engine sets TCP keepalives and
    # tcp_user_timeout for its sessions (shared.db.dead_client_settings). Without them a cut-off worker's lock held
    # its key for the kernel's retransmission timeout, ~15 min (tests/e2e/test_hosts.py, docs/hosts.md).
    dead_client_timeout_seconds: float = Field(DEAD_CLIENT_TIMEOUT_S, ge=5, le=3600)

    memory: MemorySettings = MemorySettings()
    schedule: ScheduleSettings = ScheduleSettings()
    consolidation: ConsolidationSettings = ConsolidationSettings()
    workers: WorkerSettings = WorkerSettings()
    api: ApiSettings = ApiSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    redaction: RedactionSettings = RedactionSettings()
    encryption: EncryptionSettings = EncryptionSettings()
    replicas: ReplicaSettings = ReplicaSettings()
    tracing: TracingSettings = TracingSettings()

    @field_validator("database_read_url")
    @classmethod
    def _read_urls(cls, value: str | None) -> str | None:
        for url in split_urls(value):
            if not url.startswith(("postgres://", "postgresql://", "postgresql+psycopg://", "postgresql+psycopg2://")):
                scheme = url.split(":")[0]
                raise ValueError(f"each comma-separated URL must be a postgresql:// URL (got {scheme}://...)")
        if value is not None and not split_urls(value):
            raise ValueError("no URL given (unset it to read from the primary)")
        return value

    @property
    def read_urls(self) -> tuple[str, ...]:
        """The replicas reads go to (empty: every read goes to database_url)."""
        return split_urls(self.database_read_url)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _ButlerTomlSource(settings_cls))


def split_urls(value: str | None) -> tuple[str, ...]:
    """``"url1, url2"`` as ``("url1", "url2")``; blanks dropped."""
    return tuple(part.strip() for part in (value or "").split(",") if part.strip())


class _ButlerTomlSource(PydanticBaseSettingsSource):
    """Reads the ``[butler]`` table of butler.toml (the seed's layout) as settings."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = toml_path()
        if path is None:
            return {}
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
        butler = dict(data.get("butler", {}))
        # The seed's [butler] table also carries name/port/description/db; only some map to settings.
        for key in ("name", "description", "db"):
            butler.pop(key, None)
        if "port" in butler:
            butler.setdefault("api", {})["port"] = butler.pop("port")
        return butler


def toml_path() -> Path | None:
    """The butler.toml in force: ``$MEMORY_BUTLER_CONFIG`` (must exist) or ``./butler.toml`` if present."""
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"{CONFIG_ENV}={explicit}: no such file")
        return path
    local = Path("butler.toml")
    return local if local.is_file() else None


def load_settings(**overrides: Any) -> Settings:
    """Build Settings or raise ConfigError naming every bad key."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(settings)'}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"invalid configuration: {problems}") from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, loaded once."""
    return load_settings()
