"""memory.apply_writes on the real database and model: order, exactly-once effects, poison isolation, batching."""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

import pytest

from tests.polling import poll
import redis as redis_lib
from sqlalchemy import text

from memory_workers import app as worker_app
from memory_workers.enqueue import Publisher, wake_apply
from memory_workers.extractors import HeuristicExtractor
from memory_workers.tasks import Runtime, install_runtime
from memory_workers.tasks.ingest import apply_pending
from shared import intake
from shared.config import Settings, get_settings, load_settings
from shared.db import unit_of_work
from shared.embedding import get_embedder
from shared.schemas import EpisodeWrite, FactWrite, RuleWrite
from shared.sharding import queue_for, shard_queues
from shared.writes import Actor

ACTOR = Actor("worker:test")
BATCH = 8
MAX_ATTEMPTS = 3


class SpyEmbedder:
    """The real embedder, counting its calls (the thing under test is the number of model calls)."""

    def __init__(self, inner: Any, explode_on: str | None = None) -> None:
        self.inner, self.version, self.calls, self.explode_on = inner, inner.version, [], explode_on

    def embed(self, texts: Sequence[str]) -> Any:
        self.calls.append(list(texts))
        if self.explode_on and any(self.explode_on in t for t in texts):
            raise RuntimeError("embedder crashed")
        return self.inner.embed(texts)


@pytest.fixture(scope="module")
def settings(database_url: str, redis_url: str) -> Settings:
    return load_settings(database_url=database_url, redis_url=redis_url,
                         workers={"ingest_batch_size": BATCH, "shard_count": 4},
                         consolidation={"max_attempts": MAX_ATTEMPTS})


@pytest.fixture(scope="module")
def model() -> Any:
    return get_embedder()


def make_runtime(settings: Settings, engine: Any, model: Any, **spy: Any) -> Runtime:
    return Runtime(settings, engine, SpyEmbedder(model, **spy), HeuristicExtractor())


def new_tenant(engine: Any) -> str:
    tenant_id = f"t-{uuid.uuid4().hex[:12]}"
    with unit_of_work(engine) as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant_id})
    return tenant_id


def episode(content: str, butler: str = "general") -> intake.WriteRequest:
    return intake.WriteRequest("episode", butler, EpisodeWrite(content=content, butler=butler).model_dump(mode="json"),
                               None)


def fact(content: str, *, predicate: str = "home_city", butler: str = "general", **extra: Any) -> intake.WriteRequest:
    write = FactWrite(subject="user", predicate=predicate, content=content, **extra)
    return intake.WriteRequest("fact", butler, write.model_dump(mode="json"), None)


def accept(engine: Any, tenant_id: str, writes: Sequence[intake.WriteRequest]) -> list[intake.Accepted]:
    with unit_of_work(engine) as conn:
        return intake.accept(conn, tenant_id=tenant_id, writes=writes, actor="test", request_id="req-1",
                             now=datetime.now(timezone.utc))


def rows(engine: Any, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).all()


def test_a_burst_is_applied_in_seq_order_exactly_once_with_one_embed_call_per_batch(settings, engine, model):
    rt = make_runtime(settings, engine, model)
    t = new_tenant(engine)
    cities = iter(["Lives in Berlin", "Lives in Lisbon", "Lives in Paris"])
    accepted = []
    for call in range(5):  # five separate accepts, as five requests would make them
        burst = [episode(f"Session {call}.{n}: we planned the week.") for n in range(4)]
        if call % 2 == 0:
            burst.insert(2, fact(next(cities)))
        accepted += accept(engine, t, burst)

    summary = apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)

    assert summary.counts["episode"] == 20 and summary.counts["fact"] == 3 and not summary.more
    stored = rows(engine, "SELECT seq FROM episodes WHERE tenant_id = :t ORDER BY seq", t=t)
    assert [s for (s,) in stored] == [a.seq for a in accepted if a.kind == "episode"]
    order = rows(engine, "SELECT (payload->>'seq')::int FROM memory_events WHERE tenant_id = :t "
                         "AND event_type = 'episode.stored' ORDER BY id", t=t)
    assert [s for (s,) in order] == sorted(s for (s,) in order)
    facts = rows(engine, "SELECT content, validity FROM facts WHERE tenant_id = :t ORDER BY created_at", t=t)
    assert facts == [("Lives in Berlin", "superseded"), ("Lives in Lisbon", "superseded"), ("Lives in Paris", "active")]
    assert rows(engine, "SELECT DISTINCT status FROM write_intents WHERE tenant_id = :t", t=t) == [("applied",)]
    assert len(rt.embedder.calls) == math.ceil(23 / BATCH)
    assert all(len(call) <= BATCH for call in rt.embedder.calls)
    assert sum(len(call) for call in rt.embedder.calls) == 23


def test_redelivering_the_task_changes_nothing(settings, engine, model):
    rt = make_runtime(settings, engine, model)
    t = new_tenant(engine)
    accept(engine, t, [episode("I live in Berlin."), fact("Lives in Berlin"), episode("Thanks!")])
    apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)
    before = _snapshot(engine, t)

    again = apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)

    assert sum(again.counts.values()) == 0 and _snapshot(engine, t) == before
    assert len(rt.embedder.calls) == 1  # the redelivery found nothing to embed


def _snapshot(engine: Any, tenant_id: str) -> tuple:
    return tuple(rows(engine, f"SELECT count(*) FROM {table} WHERE tenant_id = :t", t=tenant_id)[0][0]
                 for table in ("episodes", "facts", "rules", "memory_links", "memory_events"))


def test_a_poison_intent_is_dead_lettered_without_blocking_later_ones(settings, engine, model):
    rt = make_runtime(settings, engine, model)
    t = new_tenant(engine)
    bad_payload = intake.WriteRequest("fact", "general", {"predicate": "name", "content": "no subject"}, None)
    refused_row = fact("Works at Acme", predicate="employer", source_episode_id=str(uuid.uuid4()))  # FK violation
    later_rule = intake.WriteRequest("rule", "general", RuleWrite(content="Always answer in Spanish").model_dump(), None)
    wrong_key = intake.WriteRequest("episode", "general", EpisodeWrite(content="x", butler="health").model_dump(), None)
    ids = [a.id for a in accept(engine, t, [episode("first"), bad_payload, refused_row, wrong_key, episode("later"),
                                            later_rule])]

    first = apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)

    status = dict(rows(engine, "SELECT id, status FROM write_intents WHERE tenant_id = :t", t=t))
    assert [status[i] for i in ids] == ["applied", "dead_letter", "pending", "dead_letter", "applied", "applied"]
    assert first.more  # the refused row is still pending, so the task asks to be run again
    for _ in range(MAX_ATTEMPTS - 1):
        apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)
    [(state, attempts, error)] = rows(engine, "SELECT status, attempts, last_error FROM write_intents WHERE id = :i",
                                      i=ids[2])
    assert (state, attempts) == ("dead_letter", MAX_ATTEMPTS) and error.startswith("ForeignKeyViolation")
    [(dead_attempts, dead_error)] = rows(engine, "SELECT attempts, last_error FROM write_intents WHERE id = :i",
                                         i=ids[1])
    assert dead_attempts == 1 and "subject" in dead_error
    assert rows(engine, "SELECT count(*) FROM rules WHERE tenant_id = :t", t=t) == [(1,)]


def test_a_batch_the_embedder_cannot_take_is_applied_one_intent_at_a_time(settings, engine, model):
    rt = make_runtime(settings, engine, model, explode_on="EXPLODE")
    t = new_tenant(engine)
    ids = [a.id for a in accept(engine, t, [episode("one"), episode("EXPLODE two"), episode("three")])]

    apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)

    status = dict(rows(engine, "SELECT id, status FROM write_intents WHERE tenant_id = :t", t=t))
    assert [status[i] for i in ids] == ["applied", "dead_letter", "applied"]
    assert rows(engine, "SELECT content FROM episodes WHERE tenant_id = :t ORDER BY seq", t=t) == [("one",), ("three",)]


def test_a_busy_key_is_left_to_its_holder(settings, engine, model):
    from memory_workers.tasks.ingest import apply_lock_key

    rt = make_runtime(settings, engine, model)
    t = new_tenant(engine)
    accept(engine, t, [episode("waiting")])
    with engine.connect() as holder, holder.begin():
        holder.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": apply_lock_key(t, "general")})
        summary = apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)
    assert summary.busy and rows(engine, "SELECT count(*) FROM episodes WHERE tenant_id = :t", t=t) == [(0,)]


def test_another_workers_recheck_of_the_key_never_makes_the_holder_skip_its_oldest_intent(settings, engine, model):
    rt = make_runtime(settings, engine, model)
    t = new_tenant(engine)
    accepted = accept(engine, t, [episode(f"Turn {n}.") for n in range(3)])
    # given a worker that just let go of the key re-checking it for pending intents, its transaction still open
    with engine.connect() as checker, checker.begin():
        assert intake.has_pending(checker, tenant_id=t, butler="general")
        # when the key's next holder applies it meanwhile
        summary = apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)
    # then it applied every intent, the oldest first (a re-check that row-locked the oldest made the holder's
    # SKIP LOCKED claim apply the later ones first, and the oldest after them)
    assert summary.counts["episode"] == 3 and not summary.more
    order = rows(engine, "SELECT (payload->>'seq')::int FROM memory_events WHERE tenant_id = :t "
                         "AND event_type = 'episode.stored' ORDER BY id", t=t)
    assert [s for (s,) in order] == [a.seq for a in accepted]
    assert rows(engine, "SELECT count(*) FROM write_intents WHERE tenant_id = :t AND status = 'pending'", t=t) == [(0,)]


# ---- through a real Celery worker ---------------------------------------------------------------------




@pytest.fixture()
def celery_worker(settings, engine, model) -> Iterator[Runtime]:
    """An in-process worker (solo pool) on every shard queue of the test Redis, using the test database."""
    from celery.contrib.testing.worker import start_worker

    rt = make_runtime(settings, engine, model)
    worker_app.configure(worker_app.app, settings)
    install_runtime(rt)
    handlers = logging.getLogger().handlers[:]  # the worker installs JSON logging on pytest's captured stderr
    try:
        with start_worker(worker_app.app, pool="solo", perform_ping_check=False,
                          queues=shard_queues(settings.workers.shard_count), loglevel="WARNING"):
            yield rt
    finally:
        install_runtime(None)
        worker_app.configure(worker_app.app, get_settings())
        logging.getLogger().handlers[:] = handlers


def test_a_woken_worker_applies_the_writes_and_then_consolidates_them(settings, engine, celery_worker):
    t = new_tenant(engine)
    accept(engine, t, [episode("My name is Ana."), episode("Always answer in Spanish.")])

    wake_apply(t, "general", settings=settings)

    poll(lambda: rows(engine, "SELECT count(*) = 2 FROM episodes WHERE tenant_id = :t "
                              "AND consolidation_status = 'consolidated'", t=t)[0][0],
         deadline_s=30, what="the episodes to be applied and consolidated")
    assert rows(engine, "SELECT subject, predicate FROM facts WHERE tenant_id = :t", t=t) == [("user", "name")]
    assert rows(engine, "SELECT content FROM rules WHERE tenant_id = :t", t=t) == [("Always answer in Spanish",)]
    [(worker,)] = rows(engine, "SELECT DISTINCT actor FROM memory_events WHERE tenant_id = :t "
                               "AND event_type = 'episode.stored'", t=t)
    assert worker.startswith("worker:")


def test_the_publisher_coalesces_a_burst_into_a_few_messages_on_the_right_queues(settings, redis_url):
    client = redis_lib.Redis.from_url(redis_url)
    t = f"t-{uuid.uuid4().hex[:12]}"
    queues = {b: queue_for(t, b, settings.workers.shard_count) for b in ("general", "health")}
    publisher = Publisher(settings)
    try:
        for n in range(500):
            publisher.wake_apply(t, "general" if n % 2 else "health")
        assert publisher.flush(10)
    finally:
        publisher.close()
    messages = [json.loads(m) for q in set(queues.values()) for m in client.lrange(q, 0, -1)]
    mine = [m for m in messages if m["headers"]["kwargsrepr"].find(t) >= 0]
    for q in set(queues.values()):
        client.delete(q)
    assert 2 <= len(mine) <= 20 and publisher.snapshot()["published"] == len(mine)
    assert {m["headers"]["task"] for m in mine} == {"memory.apply_writes"}
