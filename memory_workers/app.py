"""The Celery app: Redis as the broker (no result backend), at-least-once delivery, routing by shard key.

Delivery is at-least-once and never lossy: a message is acknowledged only after its task ran
(``task_acks_late``), a worker process that dies puts its message back (``task_reject_on_worker_lost``), and
Redis hands an unacknowledged message to another worker only after ``visibility_timeout``, which is longer
than any task may run. Duplicates are harmless because every task is idempotent in Postgres.

The configuration is built from :class:`shared.config.Settings` by :func:`celery_config`; tests (and
``memory-butler up``) point it elsewhere with ``REDIS_URL``/``DATABASE_URL`` or :func:`configure`.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.signals import celeryd_init, setup_logging, worker_init, worker_process_init, worker_process_shutdown

from shared import heap, tracing
from shared.config import Settings, get_settings
from shared.logs import configure_logging, flush_logs
from shared.sharding import MAINTENANCE_QUEUE, queue_for

log = logging.getLogger(__name__)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
APPLY_TASK = "memory.apply_writes"
CONSOLIDATE_TASK = "memory.consolidate"
# Tasks whose payload is one shard key {tenant_id, butler}: they run on that key's shard queue.
PER_KEY_TASKS = frozenset({APPLY_TASK, CONSOLIDATE_TASK})
TASK_MODULES = ("memory_workers.tasks.ingest", "memory_workers.tasks.consolidate", "memory_workers.tasks.maintenance")
SCHEDULE_MODULE = "memory_workers.schedule"
# A fresh pool process imports torch and loads the embedding model: 5-15 s on 2 cores with 4 workers starting
# (measured in tests/e2e/test_workers.py). Celery's default (4 s) would kill it as "not up" while it loads.
PROCESS_UP_TIMEOUT_S = 120.0
# Logged by a pool process once its model is loaded: the first moment the node can run a task.
POOL_READY_MSG = "pool process ready"
# On a cold shutdown, running tasks get this long to finish before they are cancelled (and requeued).
SOFT_SHUTDOWN_S = 30.0

_settings: Settings | None = None


def redis_url(settings: Settings) -> str:
    return settings.redis_url or DEFAULT_REDIS_URL


def soft_time_limit(hard_limit: int) -> int:
    """The soft limit leaves a task a tenth of its time (at least 5 s) to stop cleanly."""
    return max(hard_limit - max(5, hard_limit // 10), 1)


def visibility_timeout(hard_limit: int) -> int:
    """Redis redelivers an unacknowledged message after this: longer than any task may run, with a margin."""
    return hard_limit * 2 + 60


def shard_router(shard_count: int) -> Callable[..., dict[str, str]]:
    """A Celery router: per-key tasks to their shard queue (from the payload), everything else to maintenance."""

    def route(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **_: Any) -> dict[str, str]:
        if name in PER_KEY_TASKS:
            key = dict(kwargs or {})
            if "tenant_id" not in key and args and len(args) >= 2:
                key = {"tenant_id": args[0], "butler": args[1]}
            return {"queue": queue_for(key["tenant_id"], key["butler"], shard_count)}
        return {"queue": MAINTENANCE_QUEUE}

    return route


def schedule_config(settings: Settings) -> dict[str, Any]:
    """Beat's schedule and scheduler settings from memory_workers.schedule; none while that module is absent."""
    try:
        module = importlib.import_module(SCHEDULE_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != SCHEDULE_MODULE:
            raise
        log.warning("no beat schedule: %s is not installed", SCHEDULE_MODULE)
        return {}
    beat_config = getattr(module, "beat_config", None)
    return {**(beat_config(settings) if beat_config else {}), "beat_schedule": module.beat_schedule(settings)}


def celery_config(settings: Settings) -> dict[str, Any]:
    """The whole Celery configuration for ``settings``."""
    limit = settings.workers.task_time_limit_seconds
    return {
        "broker_url": redis_url(settings),
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {
            "visibility_timeout": visibility_timeout(limit),
            # Bounded socket waits: a half-open broker connection is noticed instead of hanging a publish.
            "socket_connect_timeout": 3,
            "socket_timeout": 15,
        },
        "result_backend": None,
        "task_ignore_result": True,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_time_limit": limit,
        "task_soft_time_limit": soft_time_limit(limit),
        "task_serializer": "json",
        "accept_content": ["json"],
        "event_serializer": "json",
        "task_routes": (shard_router(settings.workers.shard_count),),
        "task_default_queue": MAINTENANCE_QUEUE,
        # No "task-sent" event per message: it was a second Redis publish on every accept's wake-up, for a state
        # Flower shows anyway from the worker's own events (received, started, succeeded) a moment later.
        "task_send_sent_event": False,
        "worker_send_task_events": True,
        # One message per process at a time: a long consolidation never sits on messages others could run.
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "worker_soft_shutdown_timeout": SOFT_SHUTDOWN_S,
        "worker_proc_alive_timeout": PROCESS_UP_TIMEOUT_S,
        "include": list(TASK_MODULES),
        "timezone": "UTC",
        "enable_utc": True,
        **schedule_config(settings),
    }


def configure(celery_app: Celery, settings: Settings) -> None:
    """(Re)configure the app for ``settings``; call it before the app opens broker connections."""
    global _settings
    _settings = settings
    celery_app.conf.update(celery_config(settings))
    # Drop pooled broker connections made for an earlier configuration (tests reconfigure the app).
    celery_app._pool = None  # type: ignore[attr-defined]  # noqa: SLF001 - private, so celery-types does not declare it
    amqp = celery_app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None  # noqa: SLF001


def current_settings() -> Settings:
    """The settings the app was configured with."""
    return _settings if _settings is not None else get_settings()


app = Celery("memory_butler")
configure(app, get_settings())


@setup_logging.connect
def _json_logs(**_: Any) -> None:
    """Worker logs as JSON lines like the rest of the project (Celery does not install its own format)."""
    configure_logging(current_settings().log_level)


@worker_process_init.connect
def _init_process(**_: Any) -> None:
    """Each pool process sets up tracing and builds its engine, embedder and extractor once (never inherited
    across fork: an exporter's thread and a pooled connection do not survive it)."""
    from memory_workers.tasks import build_runtime, install_runtime

    started = time.monotonic()
    tracing.setup(current_settings().tracing, role="worker")
    install_runtime(build_runtime(current_settings()))
    heap.settle()  # the model, its libraries and the pools out of the collector's sight (shared.heap)
    # The node answers pings (and reserves a task) before this: only from here does it apply anything.
    log.info(POOL_READY_MSG, extra={"pid": os.getpid(), "load_s": round(time.monotonic() - started, 2)})


@celeryd_init.connect
def _serve_metrics(sender: str | None = None, **_: Any) -> None:
    """A worker node with ``workers.metrics_port`` serves its pool processes' metrics, summed, on that port.

    celeryd_init runs in the node's main process before the task modules are imported and the pool forks, so
    every sample a pool process records goes to the node's directory (prometheus_client multiprocess mode).
    """
    settings = current_settings()
    if not settings.workers.metrics_port:
        return
    from shared import telemetry

    directory = settings.workers.metrics_dir or settings.data_dir / "worker-metrics" / (sender or "worker")
    telemetry.enable_multiprocess(directory)
    telemetry.serve_worker_metrics(
        host=settings.workers.metrics_host, port=settings.workers.metrics_port, directory=directory
    )
    log.info(
        "worker metrics served",
        extra={"host": settings.workers.metrics_host, "port": settings.workers.metrics_port, "dir": str(directory)},
    )


@worker_init.connect
def _init_worker(sender: Any = None, **_: Any) -> None:
    """Pools that run tasks in the worker's own process (solo, threads) get no worker_process_init: trace here."""
    pool = getattr(sender, "pool_cls", "prefork")  # a name or a class: worker_init comes before it is resolved
    if "prefork" not in (pool if isinstance(pool, str) else getattr(pool, "__module__", "prefork")):
        tracing.setup(current_settings().tracing, role="worker")


@worker_process_shutdown.connect
def _pool_process_gone(pid: int | None = None, **_: Any) -> None:
    """A pool process may exit without running atexit handlers: export its buffered spans and logs first."""
    from shared import telemetry

    tracing.flush()
    flush_logs()
    telemetry.process_exited(pid or os.getpid())
