"""Fail-open reads and honest write failures when the database goes away or hangs.

A second front reaches PostgreSQL through a TCP proxy the test controls: ``refuse`` closes it (connections
refused), ``stall`` swallows traffic (the database hangs). A table lock makes the real database slower than the
read timeout. Reads then answer empty with ``degraded: true`` within a bounded time; writes answer the
retryable ``unavailable`` error and nothing is accepted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import Engine, text

from memory_api.tools.runtime import READ_GRACE_S, WRITE_DEADLINE_S
from shared.config import Settings
from shared.db import POOL_RECONNECT_TIMEOUT_S
from tests.api.conftest import READ_TIMEOUT_MS, Butler, Front, TcpProxy, count_rows, new_token, poll

READ_BOUND_S = READ_TIMEOUT_MS / 1000 + READ_GRACE_S + 1.0  # + the MCP round trip


@pytest.fixture()
def proxied(api_settings: Settings) -> Iterator[tuple[Front, TcpProxy]]:
    proxy = TcpProxy(api_settings.database_url).start()
    try:
        with Front(api_settings.model_copy(update={"database_url": proxy.url})) as front:
            yield front, proxy
            proxy.restore()  # let the front close its pool cleanly
    finally:
        proxy.close()


def timed(fn, *args, **kwargs):  # noqa: ANN001, ANN201
    started = time.monotonic()
    out = fn(*args, **kwargs)
    return out, time.monotonic() - started


def assert_reads_degrade(butler: Butler) -> None:
    calls = [
        ("memory_search", {"query": "anything"}),
        ("memory_search", {"query": "x", "mode": "keyword"}),
        ("memory_recall", {"topic": "anything"}),
        ("memory_context", {"trigger_prompt": "hello", "butler": "health"}),
        (
            "memory_context_batch",
            {"requests": [{"trigger_prompt": "a", "butler": "health"}, {"trigger_prompt": "b", "butler": "health"}]},
        ),
        ("memory_stats", {}),
        ("memory_activity_stream", {"since": 0}),
        ("memory_get", {"type": "fact", "id": "6a1c0f9e-1d7e-4a39-9a55-0b2b2e5c2f10"}),
    ]
    for tool, args in calls:
        out, elapsed = timed(butler.ok, tool, **args)
        assert out["degraded"] is True and out["reason"], (tool, out)
        assert elapsed < READ_BOUND_S * (2 if tool == "memory_context_batch" else 1), (tool, elapsed)
    assert butler.ok("memory_search", query="anything")["results"] == []
    assert butler.ok("memory_context", trigger_prompt="hello", butler="health")["context"] == ""
    assert butler.ok("memory_get", type="fact", id="6a1c0f9e-1d7e-4a39-9a55-0b2b2e5c2f10")["status"] == "degraded"


def test_database_refusing_connections(proxied, engine: Engine, tenant_a: str) -> None:
    front, proxy = proxied
    butler = Butler(front.url, new_token(engine, tenant_a, ["health"], role="admin"))
    assert butler.ok("memory_search", query="warm up")["degraded"] is False  # the token is now cached
    # when the database goes away
    proxy.refuse()
    # then reads answer empty and degraded, quickly
    assert_reads_degrade(butler)
    # writes are not accepted: a retryable unavailable error, nothing written
    err = butler.error("memory_store_episode", content="lost?", butler="health", idempotency_key="down-1")
    assert err["error"] == "unavailable" and err["retryable"] is True
    assert (
        butler.error("memory_confirm", type="fact", id="6a1c0f9e-1d7e-4a39-9a55-0b2b2e5c2f10")["error"] == "unavailable"
    )
    assert count_rows(engine, "write_intents", tenant_a) == 0
    # the health check says why; a token the front has not seen cannot be checked (503, retryable)
    health = httpx.get(f"{front.base}/healthz", timeout=10)
    assert health.status_code == 503 and health.json()["reason"]
    metrics = httpx.get(f"{front.base}/metrics", headers={"Authorization": f"Bearer {butler.token}"}, timeout=10)
    assert metrics.status_code == 200 and "memory_butler_database_up 0.0" in metrics.text
    fresh = httpx.post(
        front.url, json={}, headers={"Authorization": f"Bearer {new_token(engine, tenant_a, ['x'])}"}, timeout=10
    )
    assert fresh.status_code == 503 and fresh.json()["retryable"] is True
    # when it comes back, so do the answers
    proxy.restore()
    poll(lambda: not butler.ok("memory_search", query="back")["degraded"], timeout=15)
    assert httpx.get(f"{front.base}/healthz", timeout=10).status_code == 200


def test_database_that_hangs(proxied, engine: Engine, tenant_a: str) -> None:
    front, proxy = proxied
    butler = Butler(front.url, new_token(engine, tenant_a, ["health"]))
    assert butler.ok("memory_recall", topic="warm up")["degraded"] is False
    # when the database swallows every request and never answers
    proxy.stall()
    out, elapsed = timed(butler.ok, "memory_search", query="anything")
    assert out["degraded"] is True and elapsed < READ_BOUND_S
    out, elapsed = timed(butler.ok, "memory_context", trigger_prompt="hello", butler="health")
    assert out["degraded"] is True and out["context"] == "" and elapsed < READ_BOUND_S
    # a write gives up after its deadline instead of hanging (retry with the same idempotency_key)
    err, elapsed = timed(butler.error, "memory_store_episode", content="stuck", butler="health", idempotency_key="k")
    assert err["error"] == "unavailable" and err["retryable"] is True and elapsed < WRITE_DEADLINE_S + 2
    assert httpx.get(f"{front.base}/healthz", timeout=10).status_code == 503
    # when it answers again, the retry is accepted: the abandoned statement's connection and the idle ones the
    # stall broke are replaced (an accept runs on the event loop; its cancelled statement is cleaned up aside)
    proxy.restore()
    poll(
        lambda: not butler.call("memory_store_episode", content="stuck", butler="health", idempotency_key="k").is_error,
        timeout=30,
    )
    with engine.connect() as conn:
        keyed = conn.execute(
            text("SELECT count(*) FROM write_intents WHERE tenant_id = :t AND idempotency_key = 'k'"), {"t": tenant_a}
        ).scalar_one()
    assert keyed == 1


def test_accepts_come_back_within_seconds_of_a_long_outage(proxied, engine: Engine, tenant_a: str) -> None:
    front, proxy = proxied
    butler = Butler(front.url, new_token(engine, tenant_a, ["health"]))
    assert butler.ok("memory_store_episode", content="before", butler="health")["status"] == "accepted"
    # given the database gone for four times the pool's reconnect timeout, an accept having found its connection dead
    proxy.refuse()
    err = butler.error("memory_store_episode", content="during", butler="health")
    assert err["error"] == "unavailable" and err["retryable"] is True
    time.sleep(4 * POOL_RECONNECT_TIMEOUT_S)
    # when it comes back, the first accept is answered at once: the pool connects when a caller waits, rather
    # than on a back-off that has doubled through the outage (its next try could come ~10 s later here)
    proxy.restore()
    out, elapsed = timed(butler.ok, "memory_store_episode", content="after", butler="health")
    assert out["status"] == "accepted" and elapsed < 3.0, (out, elapsed)


def test_database_slower_than_the_read_timeout(front: Front, engine: Engine, health: Butler) -> None:
    assert health.ok("memory_search", query="warm up", types=["fact"])["degraded"] is False
    # given another session holding an exclusive lock on the facts table
    with engine.connect() as locker:
        locker.execute(text("BEGIN"))
        locker.execute(text("LOCK TABLE facts IN ACCESS EXCLUSIVE MODE"))
        try:
            # when a read needs facts, it waits on the lock until the statement timeout, then degrades
            out, elapsed = timed(health.ok, "memory_search", query="anything", types=["fact"])
            assert out["degraded"] is True and out["reason"] and out["results"] == []
            assert READ_TIMEOUT_MS / 1000 <= elapsed < READ_BOUND_S
            block, elapsed = timed(health.ok, "memory_context", trigger_prompt="hello", butler="health")
            assert block["degraded"] is True and elapsed < READ_BOUND_S
        finally:
            locker.execute(text("ROLLBACK"))
    assert health.ok("memory_search", query="after", types=["fact"])["degraded"] is False
