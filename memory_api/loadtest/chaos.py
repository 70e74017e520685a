"""Fault drills on a :class:`~memory_api.loadtest.localstack.LocalStack`: bounded, self-stopping, loopback only.

A drill waits until a share of the burst was accepted, breaks one thing, waits ``outage_s``, and restores it:
- kill-worker: SIGKILL the worker's process group (main process and pool), then start a new worker;
- redis: stop the stack's dedicated Redis (its queues are lost: nothing persists), then start it again;
- postgres: fast-shutdown the embedded PostgreSQL, then start it again (accepts must answer ``unavailable``);
- front: SIGKILL the MCP front, then start a new one (clients reconnect and retry);
- replay: every write is sent twice (the runner turns replay on) and every key gets duplicate wake-ups
  (duplicate broker deliveries) until the backlog has drained;
- kill-host / partition-host (a fleet of several worker hosts only, see tests/e2e/test_hosts.py): SIGKILL every
  process of one worker host, then cut its link / only cut its link (its processes live on, unreachable); not
  restored: the surviving hosts must take over its keys.
Milestones go to the recorder as events: ``<drill>_break``, ``_down``, ``_restoring``, ``_restored``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

from memory_api.loadtest.metrics import Recorder

DRILLS = ("kill-worker", "redis", "postgres", "front", "replay")
# Drills that need a stack with several worker hosts and a ``kill_host()`` (not the single-host LocalStack).
FLEET_DRILLS = ("kill-host", "partition-host")
DUPLICATE_WAKEUP_EVERY_S = 0.5
REDIS_SUPERVISE_S = 10.0  # beat notices the lost lock within its 5 s loop


@dataclass
class Drill:
    """One fault, injected once a share of the burst was accepted, restored ``outage_s`` later."""

    name: str
    stack: Any  # a LocalStack, or a fleet of worker hosts (tests/e2e/fleet.py, which adds kill_host)
    outage_s: float = 5.0
    at_fraction: float = 0.3

    async def run(
        self,
        recorder: Recorder,
        *,
        target: int,
        done: asyncio.Event,
        drained: asyncio.Event,
        keys: list[tuple[str, str]],
    ) -> None:
        """``done``: the burst ended (a fault not injected by then is skipped); ``drained``: the backlog did."""
        if self.name == "replay":
            await self._duplicate_wakeups(recorder, keys, drained)
            return
        while len(recorder.accepts) < self.at_fraction * target:
            if done.is_set():
                return
            await asyncio.sleep(0.05)
        recorder.event(f"{self.name}_break")
        await asyncio.to_thread(self._break)
        recorder.event(f"{self.name}_down")
        await asyncio.sleep(self.outage_s)
        recorder.event(f"{self.name}_restoring")
        await asyncio.to_thread(self._restore)
        recorder.event(f"{self.name}_restored")
        if self.name == "redis":
            await self._supervise_after_redis(recorder)
        if self.name == "front":
            await asyncio.to_thread(self.stack.wait_front)
            recorder.event("front_ready")

    async def _supervise_after_redis(self, recorder: Recorder) -> None:
        """Beat exits when its Redis lock vanishes; restart what died, as `up`'s supervisor does by default
        (this stack runs with --no-restart so that the drills own every restart)."""
        for _ in range(int(REDIS_SUPERVISE_S)):
            await asyncio.sleep(1.0)
            revived = await asyncio.to_thread(self.stack.revive)
            if revived:
                recorder.event(f"restarted_after_redis:{','.join(revived)}")

    def _break(self) -> None:
        # Looked up lazily: a fleet (tests/e2e/fleet.py) has kill_host but no stop_redis, LocalStack the reverse.
        {
            "kill-worker": lambda: self.stack.kill("worker"),
            "front": lambda: self.stack.kill("front"),
            "redis": lambda: self.stack.stop_redis(),
            "postgres": lambda: self.stack.stop_postgres(),
            "kill-host": lambda: self.stack.kill_host(),
            "partition-host": lambda: self.stack.kill_host(partition=True),
        }[self.name]()

    def _restore(self) -> None:
        # A killed or cut-off host stays down: the other hosts own its keys now.
        {
            "kill-worker": lambda: self.stack.restart("worker"),
            "front": lambda: self.stack.restart("front"),
            "redis": lambda: self.stack.start_redis(),
            "postgres": lambda: self.stack.start_postgres(),
            "kill-host": lambda: None,
            "partition-host": lambda: None,
        }[self.name]()

    async def _duplicate_wakeups(self, recorder: Recorder, keys: list[tuple[str, str]], done: asyncio.Event) -> None:
        """Duplicate broker deliveries: every key is woken (apply and consolidate) again and again."""
        from memory_workers.enqueue import wake_apply, wake_consolidate
        from shared.config import load_settings

        settings = load_settings(redis_url=self.stack.redis_url)

        def wake_all() -> int:
            for tenant_id, butler in keys:
                wake_apply(tenant_id, butler, settings=settings)
                wake_consolidate(tenant_id, butler, settings=settings)
            return 2 * len(keys)

        while not done.is_set():
            recorder.counts["duplicate_wakeups"] += await asyncio.to_thread(wake_all)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), DUPLICATE_WAKEUP_EVERY_S)
