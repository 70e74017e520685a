"""Per-token limits on tool calls, in one front: a token bucket (rate, burst) and a cap on calls in flight.

Off by default (the embedded stack has one trusted caller); docker-compose turns them on for the shared front.
Each front limits on its own, so a fleet of N fronts behind a balancer admits up to N times the rate. Over a limit a
call answers ``rate_limited`` (retryable) at once: nothing was done. Only the event loop touches it (no lock).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from shared.config import ApiSettings
from shared.errors import RateLimited

# Buckets kept per front; past this the idle, full ones are dropped (they would admit the same calls anew).
MAX_TRACKED_TOKENS = 10_000


@dataclass
class _Bucket:
    tokens: float
    stamp: float
    in_flight: int = 0


class TokenLimits:
    """``enter(token_id)`` before a call (raises RateLimited), ``leave(token_id)`` after it, whatever happened."""

    def __init__(
        self, *, rate: float, burst: int, concurrency: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate, self.concurrency, self.clock = rate, concurrency, clock
        self.burst = float(burst or max(1.0, rate))
        self._buckets: dict[uuid.UUID, _Bucket] = {}

    @classmethod
    def from_settings(cls, api: ApiSettings) -> TokenLimits:
        return cls(rate=api.token_rate_per_second, burst=api.token_burst, concurrency=api.token_max_concurrent)

    @property
    def enabled(self) -> bool:
        return self.rate > 0 or self.concurrency > 0

    def enter(self, token_id: uuid.UUID | None) -> None:
        """Admit one call of ``token_id`` or raise RateLimited (stdio's caller, None, is never limited)."""
        if token_id is None or not self.enabled:
            return
        now = self.clock()
        bucket = self._buckets.get(token_id)
        if bucket is None:
            self._prune(now)
            bucket = self._buckets[token_id] = _Bucket(tokens=self.burst, stamp=now)
        if self.concurrency and bucket.in_flight >= self.concurrency:
            raise RateLimited(
                f"this token already has {bucket.in_flight} calls in flight (at most "
                f"{self.concurrency}); retry when one has finished"
            )
        if self.rate:
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.stamp) * self.rate)
            bucket.stamp = now
            if bucket.tokens < 1.0:
                wait = (1.0 - bucket.tokens) / self.rate
                raise RateLimited(
                    f"this token is over its rate of {self.rate:g} calls/s (burst {self.burst:g}); retry in {wait:.2f}s"
                )
            bucket.tokens -= 1.0
        bucket.in_flight += 1

    def leave(self, token_id: uuid.UUID | None) -> None:
        bucket = self._buckets.get(token_id) if token_id is not None else None
        if bucket is not None and bucket.in_flight > 0:
            bucket.in_flight -= 1

    def _prune(self, now: float) -> None:
        if len(self._buckets) < MAX_TRACKED_TOKENS:
            return
        idle = [
            k
            for k, b in self._buckets.items()
            if b.in_flight == 0 and (not self.rate or b.tokens + (now - b.stamp) * self.rate >= self.burst)
        ]
        for key in idle:
            del self._buckets[key]
