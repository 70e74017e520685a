"""Bounds on what a caller can make the front do (issue 16, item 16): malformed tokens cost no database work,
token look-ups have threads of their own, memory_context_batch's total work and time are capped, and per-token
rate and concurrency limits answer rate_limited (retryable)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy import Engine

from memory_api.tools.services import AUTH_THREADS
from shared.config import Settings
from tests.api.conftest import Butler, Front, TcpProxy, new_tenant, new_token, poll

INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
}


def _post(front: Front, token: str, timeout: float = 15) -> httpx.Response:
    return httpx.post(
        front.url,
        json=INIT,
        timeout=timeout,
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"},
    )


def _front(settings: Settings, **api: object) -> Front:
    return Front(settings.model_copy(update={"api": settings.api.model_copy(update=api)}))


@pytest.fixture()
def stalled(api_settings: Settings) -> Iterator[tuple[Front, TcpProxy]]:
    """A front whose database swallows every request (never answers)."""
    proxy = TcpProxy(api_settings.database_url).start()
    try:
        with Front(api_settings.model_copy(update={"database_url": proxy.url})) as front:
            proxy.stall()
            yield front, proxy
            proxy.restore()
    finally:
        proxy.close()


def test_a_malformed_token_is_refused_without_touching_the_database(stalled) -> None:
    front, _ = stalled
    for junk in ("mb_not-a-real-token", "garbage", "mb_" + "x" * 44, "x" * 5_000):
        started = time.monotonic()
        response = _post(front, junk)
        # refused at once: a look-up would have waited for the stalled database and answered 503
        assert response.status_code == 401 and time.monotonic() - started < 1.0, junk
    assert front.app.state.services.auth_limiter.statistics().borrowed_tokens == 0


def test_unknown_tokens_are_looked_up_on_their_own_few_threads(stalled) -> None:
    # given a stalled database and a flood of well-formed unknown tokens
    front, _ = stalled
    services = front.app.state.services
    answers: list[int] = []
    flood = [
        threading.Thread(target=lambda n=n: answers.append(_post(front, "mb_" + f"{n:043d}").status_code))
        for n in range(3 * AUTH_THREADS)
    ]
    for thread in flood:
        thread.start()
    # then at most AUTH_THREADS look-ups run at a time, the rest wait, and no tool thread is taken
    poll(lambda: services.auth_limiter.statistics().tasks_waiting > 0, timeout=10)
    assert services.auth_limiter.statistics().borrowed_tokens == AUTH_THREADS
    assert services.limiter.statistics().borrowed_tokens == 0
    for thread in flood:
        thread.join(30)
    assert answers and set(answers) == {503}  # "cannot check the token", retryable


def test_context_batch_total_work_is_capped(front: Front, health: Butler) -> None:
    one = {"trigger_prompt": "plan the week", "butler": "health"}
    err = health.error("memory_context_batch", requests=[one] * 65)
    assert err["error"] == "invalid_input" and err["field"] == "requests" and "at most 64" in err["message"]
    err = health.error("memory_context_batch", requests=[{**one, "token_budget": 32_000}] * 7)
    assert err["error"] == "invalid_input" and err["field"] == "requests" and "224000" in err["message"]
    assert len(health.ok("memory_context_batch", requests=[one] * 3)["results"]) == 3


def test_context_batch_answers_within_its_deadline(api_settings: Settings, engine: Engine) -> None:
    # 64 blocks take far longer than 0.05 s (each embeds its prompt and runs its statement: ~5 ms or more)
    with _front(api_settings, context_batch_deadline_seconds=0.05) as front:
        butler = Butler(front.url, new_token(engine, new_tenant(engine), ["health"]))
        requests = [{"trigger_prompt": f"what happened on day {n}", "butler": "health"} for n in range(64)]
        started = time.monotonic()
        out = butler.ok("memory_context_batch", requests=requests)
        elapsed = time.monotonic() - started
    assert out["degraded"] is True and "deadline (0.05s) passed" in out["reason"]
    assert len(out["results"]) == 64 and out["results"][-1]["degraded"] is True
    assert elapsed < 0.05 + 2.0  # the deadline plus one MCP round trip, not 64 blocks' worth


def test_per_token_rate_and_concurrency_limits_answer_rate_limited(api_settings: Settings, engine: Engine) -> None:
    with _front(api_settings, token_rate_per_second=0.2, token_burst=2, token_max_concurrent=4) as front:
        tenant = new_tenant(engine)
        mine, other = (Butler(front.url, new_token(engine, tenant, ["health"])) for _ in range(2))
        assert mine.ok("memory_stats")["request_id"] and mine.ok("memory_stats")
        err = mine.error("memory_stats")
        assert err["error"] == "rate_limited" and err["retryable"] is True and "retry in" in err["message"]
        assert other.ok("memory_stats")  # another token is not limited by this one
