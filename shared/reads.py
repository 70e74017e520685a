"""Read services: search, recall, get, context, activity. One short read-only transaction each, bounded in time.

A slow or unreachable database surfaces as :class:`shared.errors.Unavailable` within ``read_timeout_ms``;
the front turns that into an empty, ``degraded`` answer (callers fail open).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from datetime import datetime, timezone
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import ColumnElement, Connection, Engine, and_, exists, or_, select, text
from sqlalchemy.exc import DBAPIError, OperationalError, TimeoutError as PoolTimeout

from shared import candidates
from shared import context as context_builder
from shared import repository as repo
from shared import retrieval
from shared import telemetry
from shared.candidates import Filter
from shared.config import Settings
from shared.db import SESSION_SETTINGS, sqlstate
from shared.embedding import to_pgvector
from shared.errors import InvalidInput, Unavailable
from shared.lifecycle import rule_evidence
from shared.models import episodes, facts, memory_events, rules
from shared.protection import open_facts, open_hits
from shared.references import ReferenceBumper
from shared.replicas import ReadPlane
from shared.rerank import get_reranker, rerank
from shared.schemas import Hit
from shared.writes import Visibility, load_visible

QUERY_CANCELED = "57014"  # SQLSTATE of a statement cancelled by statement_timeout


def session_settings(settings: Settings) -> str:
    """What a read pool's connections run once (``db.make_engine(session_settings=...)``) so that the retrieval
    reads of a :class:`Reader` with these ``settings`` need no transaction."""
    retrieval = settings.memory.retrieval
    return candidates.retrieval_session(pool=retrieval.candidate_pool, timeout_ms=retrieval.read_timeout_ms)


EmbedQuery = Callable[[str], np.ndarray]
# The query's embedding later, as the pgvector text the candidate SQL binds: e.g. the submit of a
# shared.query_batcher.QueryBatcher made with encode=to_pgvector (a cached query's text is made once).
EmbedLater = Callable[[str], Future[str]]
CountTokens = Callable[[Sequence[str]], list[int]]
H = TypeVar("H", bound=Sequence[Hit])  # hits in rank order: a list, or shared.retrieval.LazyHits


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Reader:
    """The read side for one process: engine, settings, query embedder and token counter are made once.

    Reads go through ``plane`` (:mod:`shared.replicas`): a replica when one is configured and fresh enough, else
    ``engine`` (the primary). :meth:`after` gives a Reader whose reads must see a given WAL position."""

    def __init__(
        self,
        *,
        engine: Engine,
        settings: Settings,
        embed: EmbedQuery,
        count_tokens: CountTokens,
        bumper: ReferenceBumper | None = None,
        plane: ReadPlane | None = None,
        embed_later: EmbedLater | None = None,
    ) -> None:
        self.engine = engine
        self.plane = plane or ReadPlane(primary=engine)
        self._floor: int | None = None
        self.settings = settings
        self.retrieval = settings.memory.retrieval
        self._session = session_settings(settings)
        self._embed = embed
        self._count = count_tokens
        self._bumper = bumper
        # The query is embedded on another thread while the read's own thread opens its transaction (and, for
        # memory_context, fetches the recent episodes): ``embed_later``'s (the front's micro-batcher), else this.
        self._embed_later = embed_later
        self._embedding = (
            None if embed_later else ThreadPoolExecutor(max_workers=1, thread_name_prefix="query-embedding")
        )

    def after(self, floor: int | None) -> Reader:
        """This Reader, reading only where WAL position ``floor`` is replayed (None: this Reader itself)."""
        if floor is None:
            return self
        routed = copy.copy(self)  # shares the engine, the plane, the embedder and its thread
        routed._floor = floor
        return routed

    @contextmanager
    def _read(self, *, generic_plans: bool = False) -> Iterator[Connection]:
        """A read-only transaction with a statement timeout; DB trouble becomes Unavailable.

        ``generic_plans``: a retrieval read (search, recall, context). On a connection whose session already has
        the retrieval settings (the front's read pools, :func:`shared.candidates.retrieval_session`) it runs
        without a transaction: each statement is its own snapshot, one round trip each. Its statements read
        memories, never intents, so no two of them must agree on one snapshot."""
        settings = candidates.read_settings(
            pool=self.retrieval.candidate_pool, timeout_ms=self.retrieval.read_timeout_ms, generic_plans=generic_plans
        )
        try:
            # The connection is a replica's or the primary's (self.plane).
            with self.plane.connect(floor=self._floor).execution_options(isolation_level="AUTOCOMMIT") as conn:
                if generic_plans and conn.info.get(SESSION_SETTINGS) == self._session:
                    yield conn
                    return
                # One snapshot for the whole read: a row and the intent that precedes it are seen consistently.
                # The transaction is opened by hand so BEGIN and the read's settings travel in one round trip (the
                # driver would send its BEGIN alone first).
                conn.execute(text(f"BEGIN ISOLATION LEVEL REPEATABLE READ; {settings}"))
                try:
                    yield conn
                except BaseException:
                    with suppress(DBAPIError):
                        conn.execute(text("ROLLBACK"))
                    raise
                conn.execute(text("COMMIT"))
        except (DBAPIError, PoolTimeout) as exc:
            if sqlstate(exc) == QUERY_CANCELED:
                raise Unavailable("database too slow: statement timeout") from exc
            if isinstance(exc, (OperationalError, PoolTimeout)):
                raise Unavailable(f"database unavailable: {type(exc).__name__}") from exc
            raise

    def _filter(
        self,
        tenant_id: str,
        visibility: Visibility,
        min_confidence: float | None,
        now: datetime,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> Filter:
        return Filter(
            tenant_id=tenant_id,
            scopes=visibility.scopes,
            butlers=visibility.butlers,
            min_confidence=min_confidence,
            now=now,
            since=since,
            until=until,
        )

    def _bump(self, hits: Sequence[Hit], *, recent: bool = True) -> None:
        if self._bumper is not None:
            self._bumper.add(((h.type, h.id) for h in hits), recent=recent)

    def _vector(self, query: str) -> Future[str]:
        if self._embed_later is not None:
            return self._embed_later(query)
        assert self._embedding is not None  # made when there is no embed_later
        return self._embedding.submit(lambda: to_pgvector(self._embed(query)))

    def search(
        self,
        *,
        tenant_id: str,
        visibility: Visibility,
        query: str,
        types: Sequence[str],
        mode: str,
        limit: int,
        min_confidence: float | None,
        now: datetime | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        open_sealed: bool = False,
    ) -> list[Hit]:
        """memory_search; ``since``/``until`` bound the episodes by when they happened (facts and rules unbounded).

        ``open_sealed``: the caller may read sealed facts' plaintext (shared.protection.may_open); else surrogates."""
        now = now or utcnow()
        if since is not None and until is not None and since >= until:
            raise InvalidInput("until: must be later than since", field="until")
        floor = self.settings.memory.facts.retrieval_confidence_threshold if min_confidence is None else min_confidence
        vec = self._vector(query) if mode != "keyword" else None
        with self._read(generic_plans=True) as conn:
            hits = retrieval.search(
                conn,
                f=self._filter(tenant_id, visibility, floor, now, since, until),
                query=query,
                vector=None if vec is None else vec.result,
                types=types,
                mode=mode,
                limit=limit,
                settings=self.retrieval,
            )
            hits = self._open(conn, tenant_id, hits, open_sealed)
        reranker = get_reranker(self.retrieval.reranker, self.retrieval.reranker_path)
        if reranker is not None:  # outside the read transaction: the model's time holds no connection
            hits = rerank(query, hits, text=lambda h: h.content, reranker=reranker, top_n=self.retrieval.reranker_top_n)
        telemetry.observe_read("memory_search", hits)
        self._bump(hits)
        return hits

    def recall(
        self,
        *,
        tenant_id: str,
        visibility: Visibility,
        topic: str,
        limit: int,
        min_confidence: float | None = None,
        now: datetime | None = None,
        open_sealed: bool = False,
    ) -> list[Hit]:
        now = now or utcnow()
        floor = self.settings.memory.facts.retrieval_confidence_threshold if min_confidence is None else min_confidence
        vec = self._vector(topic)
        with self._read(generic_plans=True) as conn:
            hits = retrieval.recall(
                conn,
                f=self._filter(tenant_id, visibility, floor, now),
                topic=topic,
                vector=vec.result,
                limit=limit,
                settings=self.retrieval,
            )
            hits = self._open(conn, tenant_id, hits, open_sealed)
        telemetry.observe_read("memory_recall", hits)
        self._bump(hits)
        return hits

    def context(
        self,
        *,
        tenant_id: str,
        visibility: Visibility,
        trigger_prompt: str,
        token_budget: int | None,
        now: datetime | None = None,
        open_sealed: bool = False,
    ) -> context_builder.ContextBlock:
        """The token-budgeted memory block for a butler's prompt (byte-identical for the same data and ``now``)."""
        now = now or utcnow()
        budget = token_budget or self.retrieval.context_token_budget
        f = self._filter(tenant_id, visibility, self.settings.memory.facts.retrieval_confidence_threshold, now)
        vec = self._vector(trigger_prompt)
        with self._read(generic_plans=True) as conn:
            found = retrieval.context_sections(
                conn,
                f=f,
                topic=trigger_prompt,
                vector=vec.result,
                recent=self.retrieval.context_recent_episodes,
                settings=self.retrieval,
            )
            found["fact"] = self._open(conn, tenant_id, found["fact"], open_sealed)
        # The top of each kind is what the quality proxies read; the rest need not be made.
        telemetry.observe_read("memory_context", [h for hits in found.values() for h in hits[: telemetry.TOP_K]])
        block = context_builder.build(
            facts=found["fact"],
            rules=found["rule"],
            warnings=found["warning"],
            episodes=found["episode"],
            budget=budget,
            quotas=self.retrieval.section_quotas,
            count=self._count,
            now=now,
        )
        # Shown, not used: counted, but recency is left alone (see shared.references.flush_bumps).
        self._bump(block.shown, recent=False)
        return block

    def get(
        self, *, tenant_id: str, visibility: Visibility, kind: str, entity_id: uuid.UUID, open_sealed: bool = False
    ) -> dict[str, Any]:
        """One memory with its links; Pending if accepted but not applied, NotFound if unknown."""
        with self._read() as conn:
            row = dict(load_visible(conn, kind=kind, tenant_id=tenant_id, entity_id=entity_id, visibility=visibility))
            if kind == "fact" and row["content_key_id"] is not None and open_sealed:
                opened = open_facts(conn, tenant_id=tenant_id, ids=[entity_id], settings=self.settings.encryption)
                row["content"] = opened.get(entity_id, row["content"])
            links = [dict(r) for r in repo.links_of(conn, tenant_id=tenant_id, entity_type=kind, entity_id=entity_id)]
            applications = repo.rule_applications_of(conn, rule_id=entity_id) if kind == "rule" else []
        if kind == "rule":
            row["evidence"] = _evidence(applications, self.settings.memory.rules.evidence_half_life_days)
        self._bump(
            [
                Hit(
                    type=kind,
                    id=entity_id,
                    content="",
                    score=0,
                    relevance=0,
                    created_at=row["created_at"],
                    importance=row["importance"],
                )
            ]
        )
        row.pop("tenant_id", None)
        return {"type": kind, **row, "links": links}

    def _open(self, conn: Connection, tenant_id: str, hits: H, open_sealed: bool) -> H | list[Hit]:
        """Sealed facts' plaintext for a caller allowed to read it (one query, only when a sealed fact is among hits)."""
        if not open_sealed or not self.settings.encryption.keys:
            return hits
        return open_hits(conn, tenant_id=tenant_id, hits=hits, settings=self.settings.encryption)

    def stats(self, *, tenant_id: str, scope: str | None, now: datetime | None = None) -> dict[str, Any]:
        """memory_stats, inside the same bounded read transaction as every other read."""
        from shared.stats import stats

        with self._read() as conn:
            return stats(conn, tenant_id=tenant_id, scope=scope, now=now or utcnow(), settings=self.settings)

    def activity(
        self,
        *,
        tenant_id: str,
        since: datetime | int,
        limit: int,
        entity_types: Sequence[str] | None = None,
        scope: str | None = None,
    ) -> list[dict[str, Any]]:
        """memory_events after ``since`` (a time, or an event id cursor), oldest first; ``scope`` keeps the events
        about facts and rules in global + scope and about that butler's episodes (what memory_stats counts)."""
        if limit < 1 or limit > 1000:
            raise InvalidInput("limit: must be between 1 and 1000", field="limit")
        query = select(memory_events).where(memory_events.c.tenant_id == tenant_id)
        if isinstance(since, int):
            query = query.where(memory_events.c.id > since)
        else:
            query = query.where(memory_events.c.occurred_at > since)
        if entity_types:
            query = query.where(memory_events.c.entity_type.in_(list(entity_types)))
        if scope is not None:
            query = query.where(_about_scope(scope))
        with self._read() as conn:
            rows = conn.execute(query.order_by(memory_events.c.id).limit(limit)).mappings().all()
        return [{k: v for k, v in r.items() if k != "tenant_id"} for r in rows]


def _about_scope(scope: str) -> ColumnElement[bool]:
    """An event is about ``scope`` if its entity is a fact or rule in global + scope, or an episode of that butler.
    Events about other entities, or about rows since deleted, are not."""
    event = memory_events.c
    in_scope = (
        ("fact", facts, facts.c.scope.in_(("global", scope))),
        ("rule", rules, rules.c.scope.in_(("global", scope))),
        ("episode", episodes, episodes.c.butler == scope),
    )
    return or_(
        *(
            and_(
                event.entity_type == kind,
                exists().where(table.c.id == event.entity_id, table.c.tenant_id == event.tenant_id, where),
            )
            for kind, table, where in in_scope
        )
    )


def _evidence(applications: Sequence[Any], half_life_days: float) -> dict[str, Any]:
    """A rule's feedback as memory_get shows it: counts, recency-weighted effectiveness, the latest applications."""
    evidence = rule_evidence(
        [(a["outcome"], a["occurred_at"]) for a in applications], now=utcnow(), half_life_days=half_life_days
    )
    return {
        "helpful": evidence.helpful,
        "harmful": evidence.harmful,
        "recent_effectiveness": round(evidence.effectiveness, 4),
        "half_life_days": half_life_days,
        "latest": [dict(a) for a in applications[:5]],
    }
