"""Per-token limits and the token cache (issue 16, item 16), with plain values and a fake clock."""

from __future__ import annotations

import uuid

import pytest

from memory_api.server import TokenCache
from memory_api.tools.limits import TokenLimits
from shared.errors import RateLimited
from shared.tenancy import Principal, new_token, well_formed


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_limits_are_off_by_default_and_for_stdio() -> None:
    off = TokenLimits(rate=0, burst=0, concurrency=0)
    for _ in range(1_000):
        off.enter(uuid.uuid4())
    on = TokenLimits(rate=1, burst=1, concurrency=1)
    for _ in range(10):
        on.enter(None)  # the stdio caller has no token


def test_a_token_bucket_admits_its_burst_then_its_rate() -> None:
    clock, me, other = Clock(), uuid.uuid4(), uuid.uuid4()
    limits = TokenLimits(rate=2, burst=3, concurrency=0, clock=clock)
    for _ in range(3):
        limits.enter(me)
        limits.leave(me)
    with pytest.raises(RateLimited) as refused:
        limits.enter(me)
    assert refused.value.retryable and refused.value.code == "rate_limited"
    assert "retry in 0.50s" in refused.value.message
    limits.enter(other)  # another token has a bucket of its own
    clock.now += 0.5  # one call's worth refilled
    limits.enter(me)
    with pytest.raises(RateLimited):
        limits.enter(me)


def test_calls_in_flight_are_capped_per_token() -> None:
    me = uuid.uuid4()
    limits = TokenLimits(rate=0, burst=0, concurrency=2)
    limits.enter(me)
    limits.enter(me)
    with pytest.raises(RateLimited, match="2 calls in flight"):
        limits.enter(me)
    limits.leave(me)
    limits.enter(me)


def test_ten_thousand_junk_tokens_do_not_flush_the_valid_entries() -> None:
    cache = TokenCache(ttl=30, negative_ttl=5)
    principal = Principal(tenant_id="t", butlers=("health",), role="butler", token_id=uuid.uuid4())
    cache.put("valid", principal)
    for n in range(25_000):
        cache.put(f"junk-{n}", None)
    assert cache.get("valid") == (True, principal)
    assert cache.get("junk-24999") == (True, None)  # the newest junk is still remembered
    assert len(cache) <= 10_001


def test_only_well_formed_tokens_are_looked_up() -> None:
    assert well_formed(new_token())
    for junk in ("", "mb_", "mb_" + "x" * 42, "mb_" + "x" * 44, "garbage", "mb_" + "x" * 42 + "!", "Bearer mb_x"):
        assert not well_formed(junk), junk
