"""memory.apply_writes on the real database and model: order, exactly-once effects, poison isolation, batching."""

from __future__ import annotations

import dataclasses

import contextlib
import json
import logging
import math
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import anyio
import pytest

from tests.polling import poll
import redis as redis_lib
from sqlalchemy import event, text

from memory_workers import app as worker_app
from memory_workers.app import CONSOLIDATE_TASK
from memory_workers.enqueue import (
    BUSY_RECHECK_MARGIN_S,
    RECHECK_PREFIX,
    WOKEN_TTL_S,
    Publisher,
    apply_wakeup_taken,
    recheck_busy,
    wake_apply,
    woken_marker,
)
from memory_workers.extractors import HeuristicExtractor
from memory_workers.tasks import Runtime, install_runtime
from memory_workers.tasks.ingest import apply_pending
from shared import db, intake
from shared.config import Settings, get_settings, load_settings
from shared.consolidation import key_lock
from shared.db import unit_of_work
from shared.embedding import get_embedder
from shared.schemas import EpisodeWrite, FactWrite, RuleWrite
from shared.sharding import queue_for, shard_queues
from shared.writes import Actor

ACTOR = Actor("worker:test")
BATCH = 8
MAX_ATTEMPTS = 3
BACKOFF_BASE_S = 0.05  # a failed intent is retried after 25-50 ms, then 50-100 ms (capped at 0.2 s)
DEAD_CLIENT_S = 5  # a key found busy is woken again 10 s later (its holder may have died holding it)


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
    return load_settings(
        database_url=database_url,
        redis_url=redis_url,
        workers={
            "ingest_batch_size": BATCH,
            "shard_count": 4,
            "apply_backoff_base_seconds": BACKOFF_BASE_S,
            "apply_backoff_max_seconds": 0.2,
        },
        consolidation={"max_attempts": MAX_ATTEMPTS},
        dead_client_timeout_seconds=DEAD_CLIENT_S,
    )


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
    return intake.WriteRequest(
        "episode", butler, EpisodeWrite(content=content, butler=butler).model_dump(mode="json"), None
    )


def fact(content: str, *, predicate: str = "home_city", butler: str = "general", **extra: Any) -> intake.WriteRequest:
    write = FactWrite(subject="user", predicate=predicate, content=content, **extra)
    return intake.WriteRequest("fact", butler, write.model_dump(mode="json"), None)


def accept(engine: Any, tenant_id: str, writes: Sequence[intake.WriteRequest]) -> list[intake.Accepted]:
    with unit_of_work(engine) as conn:
        return intake.accept(conn, tenant_id=tenant_id, writes=writes, actor="test", request_id="req-1")


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
    order = rows(
        engine,
        "SELECT (payload->>'seq')::int FROM memory_events WHERE tenant_id = :t "
        "AND event_type = 'episode.stored' ORDER BY id",
        t=t,
    )
    assert [s for (s,) in order] == sorted(s for (s,) in order)
    facts = rows(engine, "SELECT content, validity FROM facts WHERE tenant_id = :t ORDER BY created_at", t=t)
    assert facts == [("Lives in Berlin", "superseded"), ("Lives in Lisbon", "superseded"), ("Lives in Paris", "active")]
    assert rows(engine, "SELECT DISTINCT status FROM write_intents WHERE tenant_id = :t", t=t) == [("applied",)]
    assert len(rt.embedder.calls) == math.ceil(23 / BATCH)
    assert all(len(call) <= BATCH for call in rt.embedder.calls)
    assert sum(len(call) for call in rt.embedder.calls) == 23


def test_an_accept_is_one_statement_per_butler_numbered_in_order(engine):
    """The accept path every write takes: no key, no look-up; one statement per butler takes the numbers and
    inserts the intents, in the call's order, gap-free across calls."""
    tenant_id = new_tenant(engine)
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        first = accept(engine, tenant_id, [episode("one"), episode("two", "health"), episode("three")])
        second = accept(engine, tenant_id, [episode("four")])
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert len(statements) == 3 and all("INSERT INTO write_intents" in s for s in statements)  # 2 butlers, then 1
    assert [(a.butler, a.seq) for a in first + second] == [
        ("general", 1),
        ("health", 1),
        ("general", 2),
        ("general", 3),
    ]
    stored = rows(
        engine,
        "SELECT butler, seq, payload->>'content', created_at IS NOT NULL FROM write_intents WHERE tenant_id = :t "
        "ORDER BY butler, seq",
        t=tenant_id,
    )
    assert [tuple(r) for r in stored] == [
        ("general", 1, "one", True),
        ("general", 2, "three", True),
        ("general", 3, "four", True),
        ("health", 1, "two", True),
    ]


def test_the_fronts_one_statement_accept_refuses_a_replay_and_the_accept_with_the_look_up_finds_the_first(engine):
    """The front's first try (accept_fresh, one statement on the event loop) does not look keys up (most writes are
    not replays): a replay there raises ConcurrentReplay, the statement fails whole and leaves the key's numbering
    gap-free, and accept (with the look-up) returns the first write's id."""
    tenant_id = new_tenant(engine)
    keyed = [dataclasses.replace(episode("one"), idempotency_key="k1")]
    batch = [dataclasses.replace(episode("fresh"), idempotency_key="k2"), *keyed]  # a fresh write and the replay
    assert intake.fresh_in_one_statement(keyed) and intake.fresh_in_one_statement(batch)
    assert not intake.fresh_in_one_statement([*batch, *keyed])  # a key twice in one call
    assert not intake.fresh_in_one_statement([episode("a"), episode("b", "health")])  # two butlers

    async def fresh(writes: list[intake.WriteRequest]) -> list[intake.Accepted]:
        async with db.make_async_pool(engine.url.render_as_string(hide_password=False), size=1) as pool:
            async with pool.connection() as conn:
                return await intake.accept_fresh(conn, tenant_id=tenant_id, writes=writes, actor="t", request_id=None)

    (first,) = anyio.run(fresh, keyed)
    with pytest.raises(intake.ConcurrentReplay):  # refused whole, the fresh write with it
        anyio.run(fresh, batch)
    (replayed,) = accept(engine, tenant_id, keyed)
    (after,) = anyio.run(fresh, [episode("two")])

    assert (first.seq, first.replayed) == (1, False)
    assert (replayed.id, replayed.seq, replayed.replayed) == (first.id, 1, True)
    assert after.seq == 2  # the refused try's number was rolled back with it
    assert rows(engine, "SELECT count(*) FROM write_intents WHERE tenant_id = :t", t=tenant_id)[0][0] == 2


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
    return tuple(
        rows(engine, f"SELECT count(*) FROM {table} WHERE tenant_id = :t", t=tenant_id)[0][0]
        for table in ("episodes", "facts", "rules", "memory_links", "memory_events")
    )


def _status(engine: Any, tenant_id: str) -> dict[uuid.UUID, str]:
    return dict(rows(engine, "SELECT id, status FROM write_intents WHERE tenant_id = :t", t=tenant_id))


def _retry_until_settled(rt: Runtime, engine: Any, tenant_id: str, intent_id: uuid.UUID) -> None:
    """Run the key again (as its delayed wake-ups would) until ``intent_id`` is applied or dead-lettered."""

    def settled() -> bool:
        apply_pending(rt, tenant_id=tenant_id, butler="general", actor=ACTOR)
        return _status(engine, tenant_id)[intent_id] != "pending"

    poll(settled, deadline_s=20, what="the failed intent to be retried until it settles", every_s=0.02)


def test_a_poison_intent_is_dead_lettered_and_holds_later_ones_until_then(settings, engine, model):
    rt = make_runtime(settings, engine, model)
    t = new_tenant(engine)
    bad_payload = intake.WriteRequest("fact", "general", {"predicate": "name", "content": "no subject"}, None)
    refused_row = fact("Works at Acme", predicate="employer", source_episode_id=str(uuid.uuid4()))  # FK violation
    later_rule = intake.WriteRequest(
        "rule", "general", RuleWrite(content="Always answer in Spanish").model_dump(), None
    )
    wrong_key = intake.WriteRequest("episode", "general", EpisodeWrite(content="x", butler="health").model_dump(), None)
    ids = [
        a.id
        for a in accept(
            engine, t, [episode("first"), bad_payload, refused_row, wrong_key, episode("later"), later_rule]
        )
    ]

    first = apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)

    # a bad payload never passes: dead-lettered at once, holding nothing; the refused row will be retried, so
    # everything accepted after it waits (per-key order), untried and uncounted
    status = _status(engine, t)
    assert [status[i] for i in ids] == ["applied", "dead_letter", "pending", "pending", "pending", "pending"]
    assert rows(engine, "SELECT content FROM episodes WHERE tenant_id = :t", t=t) == [("first",)]
    assert rows(
        engine, "SELECT count(*) FROM write_intents WHERE tenant_id = :t AND attempts > 0 AND status = 'pending'", t=t
    ) == [(1,)]
    assert first.counts["retry"] == 1 and first.counts["episode"] == 1
    _retry_until_settled(rt, engine, t, ids[2])
    [(state, attempts, error)] = rows(
        engine, "SELECT status, attempts, last_error FROM write_intents WHERE id = :i", i=ids[2]
    )
    assert (state, attempts) == ("dead_letter", MAX_ATTEMPTS) and error.startswith("ForeignKeyViolation")
    # once the head is dead-lettered the rest apply (the wrong-key episode is a bad payload of its own)
    apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)
    status = _status(engine, t)
    assert [status[i] for i in ids] == ["applied", "dead_letter", "dead_letter", "dead_letter", "applied", "applied"]
    [(dead_attempts, dead_error)] = rows(
        engine, "SELECT attempts, last_error FROM write_intents WHERE id = :i", i=ids[1]
    )
    assert dead_attempts == 1 and "subject" in dead_error
    assert rows(engine, "SELECT count(*) FROM rules WHERE tenant_id = :t", t=t) == [(1,)]


def test_a_batch_the_embedder_cannot_take_is_applied_one_intent_at_a_time(settings, engine, model):
    rt = make_runtime(settings, engine, model, explode_on="EXPLODE")
    t = new_tenant(engine)
    ids = [a.id for a in accept(engine, t, [episode("one"), episode("EXPLODE two"), episode("three")])]

    apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)

    # the culprit failed once and waits out a backoff; the episode after it waits with it
    assert [_status(engine, t)[i] for i in ids] == ["applied", "pending", "pending"]
    assert rows(engine, "SELECT attempts FROM write_intents WHERE id = :i", i=ids[1]) == [(1,)]
    _retry_until_settled(rt, engine, t, ids[1])
    apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)
    assert [_status(engine, t)[i] for i in ids] == ["applied", "dead_letter", "applied"]
    assert rows(engine, "SELECT content FROM episodes WHERE tenant_id = :t ORDER BY seq", t=t) == [("one",), ("three",)]


def test_retries_back_off_on_the_database_clock_instead_of_spending_every_attempt_at_once(
    database_url, redis_url, engine, model
):
    # given a slow backoff (4-8 s, then 8-16 s) and an intent the database refuses
    slow = load_settings(
        database_url=database_url,
        redis_url=redis_url,
        consolidation={"max_attempts": 5},
        workers={"apply_backoff_base_seconds": 8, "apply_backoff_max_seconds": 60},
    )
    rt = make_runtime(slow, engine, model)
    t = new_tenant(engine)
    (head,) = [
        a.id
        for a in accept(engine, t, [fact("Works at Acme", predicate="employer", source_episode_id=str(uuid.uuid4()))])
    ]
    # when the key is run three times in a row (a burst of redeliveries)
    runs = [apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR) for _ in range(3)]
    # then one attempt was spent, and the next waits for its backoff, measured on the database clock
    [(attempts, status, wait)] = rows(
        engine,
        "SELECT attempts, status, extract(epoch FROM next_attempt_at - now()) FROM write_intents WHERE id = :i",
        i=head,
    )
    assert (attempts, status) == (1, "pending") and 3.0 < float(wait) <= 8.0
    assert 3.0 < runs[-1].retry_in <= 8.0 and not runs[-1].more
    # and the SQL twin of scoring.backoff_seconds stays inside [d/2, d] as attempts grow, capped
    for n, (low, high) in {1: (8, 16), 2: (16, 32), 3: (30, 60), 6: (30, 60)}.items():
        with unit_of_work(engine) as conn:
            conn.execute(text("UPDATE write_intents SET attempts = :n WHERE id = :i"), {"n": n, "i": head})
            intake.mark_failed(conn, intent_id=head, error="x", max_attempts=100, backoff_base_s=8, backoff_max_s=60)
            wait = conn.execute(
                text("SELECT extract(epoch FROM next_attempt_at - now()) FROM write_intents WHERE id = :i"), {"i": head}
            ).scalar_one()
        assert low - 0.01 <= float(wait) <= high + 0.01, (n, wait)


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
        assert intake.next_work(checker, tenant_id=t, butler="general") == (True, None)
        # when the key's next holder applies it meanwhile
        summary = apply_pending(rt, tenant_id=t, butler="general", actor=ACTOR)
    # then it applied every intent, the oldest first (a re-check that row-locked the oldest made the holder's
    # SKIP LOCKED claim apply the later ones first, and the oldest after them)
    assert summary.counts["episode"] == 3 and not summary.more
    order = rows(
        engine,
        "SELECT (payload->>'seq')::int FROM memory_events WHERE tenant_id = :t "
        "AND event_type = 'episode.stored' ORDER BY id",
        t=t,
    )
    assert [s for (s,) in order] == [a.seq for a in accepted]
    assert rows(engine, "SELECT count(*) FROM write_intents WHERE tenant_id = :t AND status = 'pending'", t=t) == [(0,)]


# ---- through a real Celery worker ---------------------------------------------------------------------


@contextlib.contextmanager
def running_worker(settings: Settings, rt: Runtime) -> Iterator[Runtime]:
    """An in-process worker (solo pool) on every shard queue of the test Redis, using ``rt``."""
    from celery.contrib.testing.worker import start_worker

    worker_app.configure(worker_app.app, settings)
    install_runtime(rt)
    handlers = logging.getLogger().handlers[:]  # the worker installs JSON logging on pytest's captured stderr
    try:
        with start_worker(
            worker_app.app,
            pool="solo",
            perform_ping_check=False,
            queues=shard_queues(settings.workers.shard_count),
            loglevel="WARNING",
        ):
            yield rt
    finally:
        install_runtime(None)
        worker_app.configure(worker_app.app, get_settings())
        logging.getLogger().handlers[:] = handlers


@pytest.fixture()
def celery_worker(settings, engine, model) -> Iterator[Runtime]:
    with running_worker(settings, make_runtime(settings, engine, model)) as rt:
        yield rt


@contextlib.contextmanager
def refusing_facts(engine: Any, tenant_id: str) -> Iterator[Callable[[], None]]:
    """The database refuses this tenant's fact inserts until the returned ``heal()`` is called (a transient fault:
    a real trigger, not a mock). Other tenants are untouched."""
    name = f"refuse_{uuid.uuid4().hex[:8]}"
    with unit_of_work(engine) as conn:
        conn.execute(text(f"CREATE TABLE {name} (tenant_id text)"))
        conn.execute(text(f"INSERT INTO {name} VALUES (:t)"), {"t": tenant_id})
        conn.execute(
            text(f"""CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
            IF EXISTS (SELECT 1 FROM {name} WHERE tenant_id = NEW.tenant_id) THEN
                RAISE EXCEPTION 'transient fault' USING ERRCODE = '40001'; END IF;
            RETURN NEW; END $$""")
        )
        conn.execute(text(f"CREATE TRIGGER {name} BEFORE INSERT ON facts FOR EACH ROW EXECUTE FUNCTION {name}()"))

    def heal() -> None:
        with unit_of_work(engine) as conn:
            conn.execute(text(f"DELETE FROM {name}"))

    try:
        yield heal
    finally:
        with unit_of_work(engine) as conn:
            conn.execute(text(f"DROP TRIGGER IF EXISTS {name} ON facts"))
            conn.execute(text(f"DROP FUNCTION IF EXISTS {name}()"))
            conn.execute(text(f"DROP TABLE IF EXISTS {name}"))


def test_a_worker_retries_a_failed_intent_with_backoff_and_applies_the_key_in_order(
    database_url, redis_url, engine, model
):
    # given a worker whose failed intents wait 0.5-1 s, then 1-2 s, 2-4 s ... (5 attempts), and a key whose
    # first write (a fact) the database refuses for now, followed by an episode and a correcting fact
    slow = load_settings(
        database_url=database_url,
        redis_url=redis_url,
        consolidation={"max_attempts": 5, "after_apply": False},
        workers={"shard_count": 4, "apply_backoff_base_seconds": 1.0, "apply_backoff_max_seconds": 4.0},
    )
    t = new_tenant(engine)
    with running_worker(slow, make_runtime(slow, engine, model)), refusing_facts(engine, t) as heal:
        ids = [a.id for a in accept(engine, t, [fact("Lives in Berlin")])]
        ids += [a.id for a in accept(engine, t, [episode("Moved house today."), fact("Lives in Paris")])]
        wake_apply(t, "general", settings=slow)
        # when the first write has failed twice (the second try came from the worker's own delayed wake-up)
        poll(
            lambda: rows(engine, "SELECT attempts >= 2 FROM write_intents WHERE id = :i", i=ids[0])[0][0],
            deadline_s=30,
            what="the worker to retry the refused intent after its backoff",
        )
        # then the attempts were spread out, not spent at once, and the later writes wait behind it
        [(attempts, status, wait)] = rows(
            engine,
            "SELECT attempts, status, extract(epoch FROM next_attempt_at - "
            "created_at) FROM write_intents WHERE id = :i",
            i=ids[0],
        )
        assert status == "pending" and attempts < 5 and float(wait) >= 0.5 + 0.5
        assert [_status(engine, t)[i] for i in ids[1:]] == ["pending", "pending"]
        assert rows(engine, "SELECT count(*) FROM episodes WHERE tenant_id = :t", t=t) == [(0,)]
        # when the fault clears, the key applies in the order it was accepted: Paris supersedes Berlin
        heal()
        poll(
            lambda: set(_status(engine, t).values()) == {"applied"},
            deadline_s=30,
            what="the key to apply once the fault cleared",
        )
    facts = dict(rows(engine, "SELECT content, validity FROM facts WHERE tenant_id = :t", t=t))
    assert facts == {"Lives in Berlin": "superseded", "Lives in Paris": "active"}
    applied_at = dict(rows(engine, "SELECT id, applied_at FROM write_intents WHERE tenant_id = :t", t=t))
    assert applied_at[ids[0]] <= applied_at[ids[1]] <= applied_at[ids[2]]


def test_a_woken_worker_applies_the_writes_and_then_consolidates_them(settings, engine, celery_worker):
    t = new_tenant(engine)
    accept(engine, t, [episode("My name is Ana."), episode("Always answer in Spanish.")])

    wake_apply(t, "general", settings=settings)

    poll(
        lambda: rows(
            engine,
            "SELECT count(*) = 2 FROM episodes WHERE tenant_id = :t AND consolidation_status = 'consolidated'",
            t=t,
        )[0][0],
        deadline_s=30,
        what="the episodes to be applied and consolidated",
    )
    assert rows(engine, "SELECT subject, predicate FROM facts WHERE tenant_id = :t", t=t) == [("user", "name")]
    assert rows(engine, "SELECT content FROM rules WHERE tenant_id = :t", t=t) == [("Always answer in Spanish",)]
    [(worker,)] = rows(
        engine, "SELECT DISTINCT actor FROM memory_events WHERE tenant_id = :t AND event_type = 'episode.stored'", t=t
    )
    assert worker.startswith("worker:")


def test_a_key_whose_lock_holder_died_is_consolidated_once_postgres_frees_the_lock(
    settings, engine, redis_url, celery_worker
):
    """The holder of a key's lock re-checks the key when it lets go; one whose host died never does, and
    PostgreSQL frees its lock only after dead_client_timeout_seconds. The wake-up that found the key busy then
    comes back once, after that timeout, instead of leaving the key to the stuck-episode sweep (minutes)."""
    client = redis_lib.Redis.from_url(redis_url)
    t = new_tenant(engine)
    marker = f"{RECHECK_PREFIX}{CONSOLIDATE_TASK}:{t}:general"
    consolidated = "SELECT count(*) FROM episodes WHERE tenant_id = :t AND consolidation_status = 'consolidated'"
    with key_lock(engine, tenant_id=t, butler="general") as held:  # a holder that will never wake the key
        assert held
        accept(engine, t, [episode("My name is Ana."), episode("Always answer in Spanish.")])
        wake_apply(t, "general", settings=settings)
        poll(lambda: client.exists(marker), deadline_s=30, what="the busy consolidation to schedule its re-check")
        assert 0 < client.ttl(marker) <= DEAD_CLIENT_S + BUSY_RECHECK_MARGIN_S
        # a second busy run within the window sends nothing more
        assert recheck_busy(t, "general", task_name=CONSOLIDATE_TASK, settings=settings) is False
        assert rows(engine, consolidated, t=t) == [(0,)]
    # the lock is freed as PostgreSQL frees a dead session's: nothing else wakes the key
    poll(lambda: rows(engine, consolidated, t=t) == [(2,)], deadline_s=40, what="the re-check to consolidate the key")


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


def test_a_key_gets_one_apply_wake_up_while_one_waits_and_another_once_a_worker_took_it(settings, redis_url):
    # given no worker consuming, and a front (its Publisher) accepting write after write for one key
    client = redis_lib.Redis.from_url(redis_url)
    t = f"t-{uuid.uuid4().hex[:12]}"
    queue = queue_for(t, "general", settings.workers.shard_count)

    def sent() -> int:
        return sum(t in json.loads(m)["headers"]["kwargsrepr"] for m in client.lrange(queue, 0, -1))

    publisher = Publisher(settings)
    try:
        for _ in range(30):  # flushed one by one: the publisher's own coalescing of a round is not what is tested
            publisher.wake_apply(t, "general")
            assert publisher.flush(10)
        # then one wake-up waits in the queue: the others found it marked as waiting
        assert sent() == 1 and publisher.snapshot()["coalesced"] >= 29
        assert 0 < client.ttl(woken_marker(t, "general")) <= WOKEN_TTL_S
        # when a worker takes it (clearing the marker before it claims the key's intents)
        apply_wakeup_taken(t, "general", settings=settings)
        # then the key's next write wakes it again
        publisher.wake_apply(t, "general")
        assert publisher.flush(10)
        assert sent() == 2
    finally:
        publisher.close()
        client.delete(queue, woken_marker(t, "general"))


def test_a_kept_broker_connection_survives_a_killed_client_and_a_flushed_binding(settings, redis_url):
    # given a worker process's kept broker connection (one per process and Redis URL), used once
    client = redis_lib.Redis.from_url(redis_url)
    t = f"t-{uuid.uuid4().hex[:12]}"
    queue = queue_for(t, "general", settings.workers.shard_count)
    wake_apply(t, "general", settings=settings)
    # when Redis drops every other client's connection (as a restart does) and loses its queue bindings
    client.client_kill_filter(_type="normal", skipme=True)
    client.flushdb()
    # then the next wake-up still reaches the key's queue: the connection is replaced, the queue declared again
    wake_apply(t, "general", settings=settings)
    messages = [json.loads(m) for m in client.lrange(queue, 0, -1)]
    client.delete(queue)
    assert [m["headers"]["task"] for m in messages if t in m["headers"]["kwargsrepr"]] == ["memory.apply_writes"]
