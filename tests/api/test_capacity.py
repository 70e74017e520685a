"""The front under concurrent load: concurrent reads (whose query embeddings share model calls) still get their
own right answers, and an accept is answered at once while every read thread is busy; a read beyond the bounded
read queue answers degraded at once instead of waiting."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy import Engine, event, text

from shared.config import Settings
from tests.api.conftest import Butler, Front, applied, new_token, poll

TOPICS = {
    "allergy": ("The user is allergic to penicillin.", "Which antibiotic is the user allergic to?"),
    "car": ("The user drives a blue Volvo estate.", "What car does the user drive?"),
    "sister": ("The user's sister Ana lives in Porto.", "Where does the user's sister live?"),
    "coffee": ("The user takes oat milk in coffee.", "How does the user take coffee?"),
    "gym": ("The user goes to the gym on Tuesdays and Fridays.", "Which days does the user go to the gym?"),
    "cat": ("The user's cat is called Miso.", "What is the cat's name?"),
}


async def _timed_call(butler: Butler, tool: str, arguments: dict[str, Any]) -> tuple[Any, float]:
    started = time.monotonic()
    result = await butler._session_call(lambda s: s.call_tool(tool, arguments))
    return result, time.monotonic() - started


async def _all(calls: list[tuple[Butler, str, dict[str, Any]]]) -> list[tuple[Any, float]]:
    """Every call at once, each in its own MCP session; results in order."""
    out: list[Any] = [None] * len(calls)

    async def one(i: int, butler: Butler, tool: str, arguments: dict[str, Any]) -> None:
        out[i] = await _timed_call(butler, tool, arguments)

    async with anyio.create_task_group() as group:
        for i, (butler, tool, arguments) in enumerate(calls):
            group.start_soon(one, i, butler, tool, arguments)
    return out


def test_concurrent_reads_each_get_their_own_answers(
    front: Front, worker: None, engine: Engine, tenant_a: str, admin: Butler
) -> None:
    # given one fact per topic, applied
    ids = {}
    for topic, (content, _) in TOPICS.items():
        ids[topic] = admin.ok("memory_store_fact", subject="user", predicate=topic, content=content)["id"]
    for topic, fact_id in ids.items():
        applied(admin, "fact", fact_id)
    health = Butler(front.url, new_token(engine, tenant_a, ["health"]))
    batcher = front.app.state.services.batcher
    embedded_before = batcher.embedded
    # when 24 reads run at once: a search and a context block per question, each question twice
    calls = []
    for topic, (_, question) in TOPICS.items():
        for _ in range(2):
            calls.append((health, "memory_search", {"query": question, "types": ["fact"], "limit": 3}))
            calls.append((health, "memory_context", {"trigger_prompt": question, "butler": "health"}))
    results = anyio.run(_all, calls)
    # then every read answered, not degraded, with its own question's fact first
    for (_, tool, arguments), (result, _) in zip(calls, results):
        assert not result.is_error, result.content
        body = result.structured_content
        assert body["degraded"] is False, body
        asked = arguments.get("query") or arguments.get("trigger_prompt")
        topic = next(t for t, (_, q) in TOPICS.items() if q == asked)
        if tool == "memory_search":
            assert body["results"][0]["id"] == ids[topic], (topic, body["results"])
        else:
            assert ids[topic] == body["included"]["facts"][0], (topic, body["included"])
    # and the 24 reads' query embeddings came from the front's micro-batcher, each distinct question embedded once
    assert batcher.embedded - embedded_before == len(TOPICS)
    # which /metrics reports (model calls and texts embedded)
    metrics = httpx.get(f"{front.base}/metrics", headers={"Authorization": f"Bearer {admin.token}"}, timeout=10).text
    assert f"memory_butler_query_embedding_texts_total {float(batcher.embedded)}" in metrics
    assert f"memory_butler_query_embedding_batches_total {float(batcher.batches)}" in metrics


@pytest.fixture()
def slow_front(api_settings: Settings) -> Iterator[Front]:
    """A front whose reads may wait 4 s in the database, running 24 at once (as many threads as the front has for
    all its database work) and admitting 2 more."""
    settings = api_settings.model_copy(
        update={
            "memory": api_settings.memory.model_copy(
                update={"retrieval": api_settings.memory.retrieval.model_copy(update={"read_timeout_ms": 4000})}
            ),
            "api": api_settings.api.model_copy(update={"read_threads": 24, "read_queue": 2}),
        }
    )
    with Front(settings) as running:
        yield running


def test_an_accept_is_answered_at_once_while_every_read_thread_waits(
    slow_front: Front, engine: Engine, tenant_a: str
) -> None:
    services = slow_front.app.state.services
    butler = Butler(slow_front.url, new_token(engine, tenant_a, ["health"]))
    assert butler.ok("memory_search", query="warm up")["degraded"] is False  # token cached, plans warm
    # given the memory tables locked, so every read waits in the database (up to its 4 s statement timeout)
    with engine.connect() as locker:
        locker.execute(text("BEGIN; LOCK TABLE facts, rules, episodes IN ACCESS EXCLUSIVE MODE"))

        async def scenario() -> tuple[list[tuple[Any, float]], tuple[Any, float], tuple[Any, float]]:
            readers: list[tuple[Any, float]] = []
            async with anyio.create_task_group() as group:

                async def read(i: int) -> None:
                    readers.append(await _timed_call(butler, "memory_search", {"query": f"question {i}"}))

                for i in range(26):  # 24 running + 2 queued: the read queue is full
                    group.start_soon(read, i)
                await anyio.to_thread.run_sync(lambda: poll(lambda: services.reads_in_flight == 26, timeout=30))
                # when an episode is stored and one more read comes
                accept = await _timed_call(
                    butler, "memory_store_episode", {"content": "Booked the dentist.", "butler": "health"}
                )
                extra = await _timed_call(butler, "memory_context", {"trigger_prompt": "dentist", "butler": "health"})
                await anyio.to_thread.run_sync(lambda: locker.execute(text("ROLLBACK")))
            return readers, accept, extra

        readers, (accepted, accept_s), (context, context_s) = anyio.run(scenario)
    # then the accept was answered at once, on its own threads and connections
    assert not accepted.is_error, accepted.content
    assert accepted.structured_content["status"] == "accepted"
    assert accept_s < 2.0, f"accept took {accept_s:.2f}s behind the reads"
    # and the read beyond the queue answered degraded at once (fail open), saying why
    assert context.structured_content["degraded"] is True
    assert "saturated" in context.structured_content["reason"]
    assert context_s < 2.0, f"the refused read took {context_s:.2f}s"
    # and the admitted reads all answered once the lock went away
    assert len(readers) == 26 and all(not r.is_error for r, _ in readers)
    assert services.reads_in_flight == 0


def test_the_front_keeps_the_connections_its_bursts_open(front: Front) -> None:
    # SQLAlchemy closes an overflow connection when it comes back to a full pool: a load above the pool's size then
    # started and ended a PostgreSQL backend per call (~2 ms of the database's CPU per accept, BENCHMARKS.md)
    services = front.app.state.services
    pools = {
        "write": (services.write_engine, services.write_limiter, services.write),
        "read": (services.read_engine, services.read_limiter, services.read),
    }
    for name, (engine, limiter, run) in pools.items():
        opened: list[object] = []

        def count(dbapi: object, record: object, opened: list[object] = opened) -> None:
            opened.append(dbapi)

        event.listen(engine, "connect", count)
        threads = int(limiter.total_tokens)
        together = threading.Barrier(threads)

        def hold(engine: Engine = engine, together: threading.Barrier = together) -> int:
            with engine.connect() as conn:  # every thread holds a connection at once
                together.wait(timeout=10)
                return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())

        async def waves(run: Any = run, threads: int = threads) -> set[int]:
            backends: set[int] = set()
            for _ in range(3):  # when the front's threads all use their connections at once, three times over
                results = [0] * threads

                async def one(i: int) -> None:
                    results[i] = await run(hold, deadline=20)

                async with anyio.create_task_group() as group:
                    for i in range(threads):
                        group.start_soon(one, i)
                backends.update(results)
            return backends

        try:
            backends = anyio.run(waves)
        finally:  # the front is the session's: leave its engines as they were
            event.remove(engine, "connect", count)
        # then the second and third waves ran on the connections the first opened
        assert len(opened) <= threads, f"{name}: {len(opened)} connections opened for {threads} threads"
        assert len(backends) <= threads, f"{name}: {len(backends)} backends served {threads} threads"


def test_a_front_moves_what_it_loaded_at_start_out_of_the_collectors_sight(api_settings: Settings) -> None:
    # a full collection then scans only what calls made since, not the model and its libraries (a stall of
    # 130-180 ms every few seconds under load before: BENCHMARKS.md, "The contract's burst")
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    with Front(api_settings):
        assert gc.get_freeze_count() > 10_000
