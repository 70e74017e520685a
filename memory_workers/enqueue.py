"""The only surface the front imports: wake the worker of a shard key, by task name, never waiting long on Redis.

A wake-up carries only the shard key (``{"tenant_id", "butler"}``); the work itself is already durable in
Postgres. A lost wake-up is therefore harmless: the redelivery and backlog sweeps send it again. That is why
:func:`wake_apply` may fail fast with :class:`Unavailable`, and why :class:`Publisher` may drop wake-ups when
Redis is down instead of making a caller wait.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

import redis
from kombu import Connection
from kombu.exceptions import KombuError

from memory_workers.app import APPLY_TASK, CONSOLIDATE_TASK, app, current_settings, redis_url
from memory_workers.schedule import maintenance_periods  # noqa: F401 - re-exported for the front's /metrics
from shared import telemetry
from shared import tracing
from shared.config import Settings
from shared.errors import Unavailable
from shared.sharding import MAINTENANCE_QUEUE, queue_for, shard_queues

log = logging.getLogger(__name__)

# A local Redis answers in well under a millisecond; these bound the wait when it is down or unreachable.
CONNECT_TIMEOUT_S = 1.0
SOCKET_TIMEOUT_S = 2.0
# Distinct keys a Publisher holds while Redis is down; more are dropped (the sweeps re-send them).
MAX_PENDING = 100_000
MAX_BACKOFF_S = 30.0
# The least time between two publishing rounds. Under load the wake-ups that arrive meanwhile coalesce into the next
# round: one Redis round trip per gap instead of one per accept, which cost the front ~15 % of its CPU at 400-500
# accepts/s (BENCHMARKS.md, issue 14). A lone write after a quiet spell is still published at once.
ROUND_GAP_S = 0.05
# A busy key is woken again this long after PostgreSQL would have ended a dead lock holder's session.
BUSY_RECHECK_MARGIN_S = 5.0
RECHECK_PREFIX = "memory-butler:recheck:"
# A key's apply wake-up that the front sent and no worker has taken yet: while it waits, the front sends no other.
# A worker that takes one deletes the marker before it claims the key's intents, so its run applies every write
# committed before the delete, and a write committed after it sends a wake-up of its own. Without this, a key
# written while its worker was away queued a wake-up per write (13,500 of one key after a stopped worker, which
# then held every other key of that shard queue back). The TTL bounds how long a marker whose wake-up was lost (a
# worker killed after it reserved the message, before it ran it) keeps the key's writes from waking it; a key that
# waits longer than that gets one more wake-up per TTL; the sweeps re-send the wake-ups of whatever still waits.
WOKEN_PREFIX = "memory-butler:woken:"
WOKEN_TTL_S = 15


# kombu's Redis transport keeps a queue's prioritised messages in sibling lists: name + "\x06\x16" + priority.
PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")


def _kept_redis(settings: Settings) -> redis.Redis:
    """This process's kept client of the broker's Redis, which gives up within the timeouts above (thread-safe; a
    dropped connection is replaced on the next command; never crosses a fork)."""
    key = (os.getpid(), redis_url(settings))
    with _kept_lock:
        client = _kept_clients.get(key)
        if client is None:
            client = _kept_clients[key] = redis.Redis.from_url(
                redis_url(settings), socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S
            )
        return client


def woken_marker(tenant_id: str, butler: str) -> str:
    return f"{WOKEN_PREFIX}{tenant_id}:{butler}"


def apply_wakeup_taken(tenant_id: str, butler: str, *, settings: Settings | None = None) -> None:
    """A worker took the key's apply wake-up (call it before claiming the key's intents): the next write sends
    another. Raises Unavailable; the marker then expires on its own."""
    try:
        _kept_redis(settings or current_settings()).delete(woken_marker(tenant_id, butler))
    except (redis.RedisError, OSError) as exc:
        raise Unavailable(f"broker unavailable, wake-up marker of {tenant_id}/{butler} not cleared: {exc}") from exc


def queue_depths(settings: Settings) -> dict[str, int]:
    """Messages waiting in each shard queue and the maintenance queue (LLEN; one round trip), or Unavailable."""
    queues = [*shard_queues(settings.workers.shard_count), MAINTENANCE_QUEUE]
    try:
        with _kept_redis(settings).pipeline(transaction=False) as pipe:
            for queue in queues:
                for suffix in PRIORITY_SUFFIXES:
                    pipe.llen(queue + suffix)
            lengths = pipe.execute()
    except (redis.RedisError, OSError) as exc:
        raise Unavailable(f"broker unavailable: {exc}") from exc
    n = len(PRIORITY_SUFFIXES)
    return {queue: sum(lengths[i * n : (i + 1) * n]) for i, queue in enumerate(queues)}


def payload(tenant_id: str, butler: str) -> dict[str, str]:
    """The whole message body of a per-key task: ids only, JSON-safe (HOUSE_RULES rule 4)."""
    return {"tenant_id": tenant_id, "butler": butler}


def connect(settings: Settings) -> Connection:
    """A broker connection for publishing that gives up after about a second instead of retrying."""
    return app.connection_for_write(
        url=redis_url(settings),
        connect_timeout=CONNECT_TIMEOUT_S,
        transport_options={
            "socket_connect_timeout": CONNECT_TIMEOUT_S,
            "socket_timeout": SOCKET_TIMEOUT_S,
            "max_retries": 0,
        },
    )


def publish(
    task_name: str, tenant_id: str, butler: str, *, settings: Settings | None = None, countdown: float | None = None
) -> None:
    """Send ``task_name`` for one shard key to its shard queue, once (run no sooner than ``countdown`` seconds
    from now, if given), on this process's kept broker connection, or raise Unavailable."""
    settings = settings or current_settings()
    key = (os.getpid(), redis_url(settings))  # a connection never crosses a fork
    with _kept_lock:
        kept = _kept.get(key)
        if kept is None:
            kept = _kept[key] = KeptConnection(settings)
        kept.publish(task_name, tenant_id, butler, settings.workers.shard_count, countdown=countdown)


class KeptConnection:
    """One broker connection kept for publishing (not thread-safe: one publisher at a time).

    Connecting and declaring the queue cost more than the publish itself (measured in a worker during the contract
    burst: a fresh connection per wake-up was ~10 % of its busy time), so the connection is kept; one that went
    stale while idle (Redis restarted) is replaced once, then the failure is Unavailable."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._conn: Connection | None = None

    def publish(
        self, task_name: str, tenant_id: str, butler: str, shards: int, *, countdown: float | None = None
    ) -> None:
        """Send ``task_name`` for the key to its queue among ``shards`` (now, or in ``countdown`` seconds)."""
        queue = queue_for(tenant_id, butler, shards)
        while True:
            fresh = self._conn is None
            conn = self._conn = self._conn or connect(self._settings)
            try:
                _send(conn, task_name, tenant_id, butler, queue, countdown)
                return
            except (KombuError, redis.RedisError, OSError) as exc:
                self.drop()
                if fresh:
                    raise Unavailable(
                        f"broker unavailable, {task_name} for {tenant_id}/{butler} not sent: {exc}"
                    ) from exc

    def drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.release()
            except Exception:  # noqa: BLE001 - a broken connection may fail to close; it is garbage either way
                log.debug("closing a broken broker connection failed", exc_info=True)


_kept: dict[tuple[int, str], KeptConnection] = {}
_kept_clients: dict[tuple[int, str], redis.Redis] = {}
_kept_lock = threading.Lock()


def _send(
    conn: Connection, task_name: str, tenant_id: str, butler: str, queue: str, countdown: float | None = None
) -> None:
    app.send_task(
        task_name,
        kwargs=payload(tenant_id, butler),
        queue=queue,
        producer=app.amqp.Producer(conn),
        retry=False,
        ignore_result=True,
        countdown=countdown,
    )


def register_tasks() -> None:
    """Import the task modules, so Celery's tracing finds a task by the name it is sent under (the front sends
    by name; unregistered, the instrumentation would leave its publish span open)."""
    app.loader.import_default_modules()


def wake_apply(
    tenant_id: str, butler: str, *, settings: Settings | None = None, countdown: float | None = None
) -> None:
    """Ask a worker to apply the key's pending write intents (after the intents committed), now or in
    ``countdown`` seconds (a key waiting out a retry backoff). A lost delayed wake-up is re-sent by the sweep."""
    publish(APPLY_TASK, tenant_id, butler, settings=settings, countdown=countdown)


def wake_consolidate(tenant_id: str, butler: str, *, settings: Settings | None = None) -> None:
    """Ask a worker to consolidate the key's eligible episodes."""
    publish(CONSOLIDATE_TASK, tenant_id, butler, settings=settings)


def recheck_busy(tenant_id: str, butler: str, *, task_name: str, settings: Settings | None = None) -> bool:
    """Send ``task_name`` for a key that was busy once more, after its lock holder would be declared dead.

    A live holder re-checks the key when it lets go, so a refused wake-up is not lost; a holder whose host died
    keeps the lock until PostgreSQL ends its session (``dead_client_timeout_seconds``), and wake-ups refused
    meanwhile would wait for the redelivery sweep's stuck pass (minutes). At most one such delayed wake-up per
    (task, key) and window, deduplicated by a Redis marker that expires with it; True if this call sent it.
    Raises Unavailable.
    """
    settings = settings or current_settings()
    delay = settings.dead_client_timeout_seconds + BUSY_RECHECK_MARGIN_S
    marker = f"{RECHECK_PREFIX}{task_name}:{tenant_id}:{butler}"
    try:
        if not _kept_redis(settings).set(marker, 1, nx=True, ex=int(delay)):
            return False
    except (redis.RedisError, OSError) as exc:
        raise Unavailable(f"broker unavailable, {task_name} re-check for {tenant_id}/{butler} not sent: {exc}") from exc
    publish(task_name, tenant_id, butler, settings=settings, countdown=delay)
    return True


class Publisher:
    """Publishes wake-ups from a background thread so the accept path never waits on Redis.

    Wake-ups for one (task, key) coalesce while they wait: a burst of 500 writes to one key sends one or two
    messages. An apply wake-up is not sent either while one sent before waits in its queue, from any front (a
    marker per key, WOKEN_PREFIX). Rounds are at least ``round_gap_s`` apart, so a steady stream of accepts costs a
    round per gap, not one per accept. When Redis fails, the round's remaining wake-ups are dropped and logged, and
    the thread backs off; the redelivery sweep re-sends what was lost.
    """

    def __init__(
        self, settings: Settings | None = None, *, max_pending: int = MAX_PENDING, round_gap_s: float = ROUND_GAP_S
    ) -> None:
        self._settings = settings or current_settings()
        self._max_pending = max_pending
        self._round_gap_s = round_gap_s
        # Oldest wake-up first, each with the trace context of the call that first asked for it (None: untraced).
        self._pending: dict[tuple[str, str, str], dict[str, str] | None] = {}
        self._cond = threading.Condition()
        self._busy = False
        self._closed = False
        self._backoff = 0.0
        self._kept = KeptConnection(self._settings)
        self.stats = {"published": 0, "coalesced": 0, "dropped": 0, "failed": 0, "rounds": 0}
        if tracing.enabled():
            register_tasks()
        self._thread = threading.Thread(target=self._run, name="memory-wake-publisher", daemon=True)
        self._thread.start()

    def _count(self, result: str, n: int = 1) -> None:
        self.stats[result] += n
        telemetry.WAKEUPS.labels(result).inc(n)

    def wake_apply(self, tenant_id: str, butler: str) -> None:
        """Queue an apply wake-up for the key; returns at once."""
        self._offer((APPLY_TASK, tenant_id, butler))

    def wake_consolidate(self, tenant_id: str, butler: str) -> None:
        """Queue a consolidation wake-up for the key; returns at once."""
        self._offer((CONSOLIDATE_TASK, tenant_id, butler))

    def _offer(self, item: tuple[str, str, str]) -> None:
        with self._cond:
            if item in self._pending:
                self._count("coalesced")
            elif self._closed or len(self._pending) >= self._max_pending:
                self._count("dropped")
            else:
                self._pending[item] = tracing.current_carrier()
                self._cond.notify()

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued wake-up was published (or dropped); False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Publish what is queued (within ``timeout``), then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if not self._pending:
                    break
                batch = list(self._pending.items())
                self._pending.clear()
                self._busy = True
            self._publish_round(batch)
            with self._cond:
                self._busy = False
                self.stats["rounds"] += 1
                self._cond.notify_all()
                if self._backoff:
                    self._cond.wait_for(lambda: self._closed, self._backoff)
            if not self._closed:
                time.sleep(self._round_gap_s)  # not a wait on the condition, which every offer meanwhile would wake
        self._kept.drop()

    def _publish_round(self, batch: list[tuple[tuple[str, str, str], dict[str, str] | None]]) -> None:
        waiting = self._still_waiting([item for item, _ in batch])
        if waiting:
            self._count("coalesced", len(waiting))
            batch = [(item, context) for item, context in batch if item not in waiting]
        for done, (item, trace_context) in enumerate(batch):
            try:
                with tracing.attached(trace_context):  # the publish span joins the accepting call's trace
                    self._kept.publish(*item, self._settings.workers.shard_count)
            except Unavailable as exc:
                lost = len(batch) - done
                self._count("failed", lost)
                self._unmark([item for item, _ in batch[done:]])
                self._backoff = min(max(self._backoff * 2, 0.5), MAX_BACKOFF_S)
                log.warning(
                    "wake-ups not published; the redelivery sweep will re-send them",
                    extra={"lost": lost, "retry_in_s": self._backoff, "error": str(exc)},
                )
                return
            self._count("published")
            self._backoff = 0.0

    def _still_waiting(self, items: list[tuple[str, str, str]]) -> set[tuple[str, str, str]]:
        """The apply wake-ups among ``items`` whose key has one waiting already; marks the others' (one round trip).
        If Redis fails here, the publish fails too and reports it: all are sent."""
        applies = [item for item in items if item[0] == APPLY_TASK]
        if not applies:
            return set()
        try:
            with _kept_redis(self._settings).pipeline(transaction=False) as pipe:
                for _, tenant_id, butler in applies:
                    pipe.set(woken_marker(tenant_id, butler), 1, nx=True, ex=WOKEN_TTL_S)
                marked = pipe.execute()
        except (redis.RedisError, OSError):
            return set()
        return {item for item, fresh in zip(applies, marked, strict=True) if not fresh}

    def _unmark(self, items: list[tuple[str, str, str]]) -> None:
        """Best effort: the markers of apply wake-ups that were not sent (else the key's next writes send none
        until the markers expire)."""
        keys = [woken_marker(tenant_id, butler) for task, tenant_id, butler in items if task == APPLY_TASK]
        with contextlib.suppress(redis.RedisError, OSError):
            if keys:
                _kept_redis(self._settings).delete(*keys)

    def snapshot(self) -> dict[str, Any]:
        """Counters for /metrics and tests."""
        with self._cond:
            return {**self.stats, "pending": len(self._pending)}
