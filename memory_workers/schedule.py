"""Celery beat's schedule (from Settings), the redbeat configuration, and the tick id of each scheduled run.

Two beat processes may run (a standby for failover). redbeat's Redis lock keeps one of them sending;
the tick id makes a duplicate send harmless anyway: every scheduled message is stamped with its
publish time, the task floors it to its schedule's period, and ``maintenance_runs(task, tick)`` is unique.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.schedules import crontab, schedule
from celery.signals import before_task_publish

from shared.config import Settings
from shared.cron import period_seconds
from shared.sharding import MAINTENANCE_QUEUE

CONSOLIDATE_ALL = "memory.consolidate_all"
DECAY_SWEEP = "memory.decay_sweep"
EPISODE_CLEANUP = "memory.episode_cleanup"
EVENT_PARTITIONS = "memory.event_partitions"
BACKLOG_TRIGGER = "memory.backlog_trigger"
REDELIVERY_SWEEP = "memory.redelivery_sweep"
CRON_TASKS = (CONSOLIDATE_ALL, DECAY_SWEEP, EPISODE_CLEANUP, EVENT_PARTITIONS)
INTERVAL_TASKS = (BACKLOG_TRIGGER, REDELIVERY_SWEEP)
MAINTENANCE_TASKS = CRON_TASKS + INTERVAL_TASKS
PUBLISHED_AT_HEADER = "memory_butler_published_at"

# Static redbeat/beat settings; beat_config(settings) adds the Redis URL. A standby beat polls the lock
# every beat_max_loop_interval and takes over once the holder has not extended it for redbeat_lock_timeout.
BEAT_CONFIG: dict[str, Any] = {
    "beat_scheduler": "redbeat.RedBeatScheduler",
    "beat_max_loop_interval": 5,  # also how often the lock holder extends its lock
    "redbeat_lock_timeout": 30,  # failover within 30 s of a dead holder (6 missed extensions)
    "redbeat_key_prefix": "memory-butler:redbeat:",
}


def beat_config(settings: Settings) -> dict[str, Any]:
    """BEAT_CONFIG plus ``redbeat_redis_url`` from the settings (omitted when unset: redbeat uses broker_url)."""
    config = dict(BEAT_CONFIG)
    if settings.redis_url:
        config["redbeat_redis_url"] = settings.redis_url
    return config


def parse_cron(expr: str) -> crontab:
    """A 5-field cron string (minute hour day-of-month month day-of-week) as a Celery crontab."""
    fields = expr.split()
    if len(fields) != 5:
        raise ValueError(f"cron must have 5 fields (minute hour day month weekday), got {expr!r}")
    minute, hour, day_of_month, month_of_year, day_of_week = fields
    return crontab(
        minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month_of_year, day_of_week=day_of_week
    )


def interval_seconds(settings: Settings) -> dict[str, float]:
    """The period of each interval task."""
    return {
        BACKLOG_TRIGGER: settings.schedule.backlog_trigger_seconds,
        REDELIVERY_SWEEP: settings.schedule.redelivery_sweep_seconds,
    }


def maintenance_periods(settings: Settings) -> dict[str, float]:
    """Each maintenance task's longest gap between scheduled runs, in seconds (/metrics' period gauges)."""
    s = settings.schedule
    crons = {
        CONSOLIDATE_ALL: s.consolidate.cron,
        DECAY_SWEEP: s.decay_sweep.cron,
        EPISODE_CLEANUP: s.episode_cleanup.cron,
        EVENT_PARTITIONS: s.event_partitions.cron,
    }
    return {**{task: period_seconds(cron) for task, cron in crons.items()}, **interval_seconds(settings)}


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """Every maintenance task on its schedule, routed to the maintenance queue; stale interval sends expire."""
    s = settings.schedule
    crons = {
        CONSOLIDATE_ALL: s.consolidate.cron,
        DECAY_SWEEP: s.decay_sweep.cron,
        EPISODE_CLEANUP: s.episode_cleanup.cron,
        EVENT_PARTITIONS: s.event_partitions.cron,
    }
    entries: dict[str, dict[str, Any]] = {
        task: {"task": task, "schedule": parse_cron(cron), "options": {"queue": MAINTENANCE_QUEUE}}
        for task, cron in crons.items()
    }
    for task, period in interval_seconds(settings).items():
        # A trigger older than its period is superseded by the next one; no point running a backlog of them.
        entries[task] = {
            "task": task,
            "schedule": schedule(run_every=timedelta(seconds=period)),
            "options": {"queue": MAINTENANCE_QUEUE, "expires": max(1.0, period)},
        }
    return entries


def tick_id(task: str, *, published_at: float, settings: Settings) -> str:
    """The run a message belongs to: its publish minute (UTC) for cron tasks, floor(t / period) for interval ones."""
    if task in CRON_TASKS:
        return datetime.fromtimestamp(published_at, UTC).strftime("%Y-%m-%dT%H:%MZ")
    period = interval_seconds(settings)[task]
    return f"{int(published_at // period)}x{period:g}s"


@before_task_publish.connect
def stamp_published_at(sender: str | None = None, headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Maintenance messages carry their publish time (any publisher, beat included) for tick_id."""
    if sender in MAINTENANCE_TASKS and headers is not None:
        headers.setdefault(PUBLISHED_AT_HEADER, time.time())
