"""Every task payload is ids and the shard key, and round-trips through JSON (HOUSE_RULES rule 4)."""

from __future__ import annotations

import inspect
import json
import time

import pytest
from kombu.serialization import dumps, loads

import memory_workers.tasks.consolidate  # noqa: F401 - registers memory.consolidate
import memory_workers.tasks.ingest  # noqa: F401 - registers memory.apply_writes
from memory_workers import enqueue
from memory_workers.app import (
    APPLY_TASK,
    CONSOLIDATE_TASK,
    PER_KEY_TASKS,
    app,
    celery_config,
    shard_router,
    soft_time_limit,
    visibility_timeout,
)
from shared.config import load_settings
from shared.errors import Unavailable
from shared.sharding import MAINTENANCE_QUEUE, queue_for

KEYS = [("default", "general"), ("tenant-ü", "health.v2"), ("a" * 63, "b" * 63)]


@pytest.mark.parametrize(("tenant_id", "butler"), KEYS)
@pytest.mark.parametrize("task_name", sorted(PER_KEY_TASKS))
def test_a_per_key_payload_round_trips_through_json_and_fits_its_task(task_name, tenant_id, butler):
    payload = enqueue.payload(tenant_id, butler)

    assert json.loads(json.dumps(payload)) == payload
    inspect.signature(app.tasks[task_name].run).bind(**payload)  # the task accepts exactly this
    message = app.amqp.as_task_v2("task-id", task_name, args=(), kwargs=payload)
    content_type, encoding, data = dumps(message.body, serializer="json")
    args, kwargs, _ = loads(data, content_type, encoding, accept={"application/json"})
    assert (args, kwargs) == ([], payload)


def test_scheduled_payloads_round_trip_through_json():
    for entry in app.conf.beat_schedule.values():
        for part, empty in (("args", ()), ("kwargs", {})):
            value = entry.get(part, empty)
            assert json.loads(json.dumps(value)) == (list(value) if part == "args" else value)


def test_per_key_tasks_go_to_their_shard_queue_and_the_rest_to_maintenance():
    route = shard_router(8)
    for name in (APPLY_TASK, CONSOLIDATE_TASK):
        assert route(name, (), enqueue.payload("t1", "general"), {}) == {"queue": queue_for("t1", "general", 8)}
        assert route(name, ("t1", "general"), {}, {}) == {"queue": queue_for("t1", "general", 8)}
    assert route("memory.decay_sweep", (), {}, {}) == {"queue": MAINTENANCE_QUEUE}


def test_delivery_is_at_least_once_and_json_only():
    config = celery_config(load_settings(workers={"task_time_limit_seconds": 120}))
    assert config["task_acks_late"] and config["task_reject_on_worker_lost"]
    assert config["worker_prefetch_multiplier"] == 1 and config["task_ignore_result"]
    assert config["accept_content"] == ["json"] and config["task_serializer"] == "json"
    assert config["task_soft_time_limit"] == soft_time_limit(120) < config["task_time_limit"] == 120
    assert config["broker_transport_options"]["visibility_timeout"] == visibility_timeout(120) > 120
    assert config["task_default_queue"] == MAINTENANCE_QUEUE


def test_a_wake_up_fails_fast_when_redis_is_down():
    down = load_settings(redis_url="redis://127.0.0.1:1/0")  # nothing listens on port 1
    started = time.monotonic()
    with pytest.raises(Unavailable):
        enqueue.wake_apply("t1", "general", settings=down)
    assert time.monotonic() - started < 2


def test_the_publisher_never_makes_a_caller_wait_and_coalesces_wake_ups():
    publisher = enqueue.Publisher(load_settings(redis_url="redis://127.0.0.1:1/0"))
    try:
        started = time.monotonic()
        for n in range(1000):
            publisher.wake_apply("t1", f"butler-{n % 3}")
        assert time.monotonic() - started < 0.5
        assert publisher.flush(5)
    finally:
        publisher.close()
    stats = publisher.snapshot()
    assert stats["published"] == 0 and stats["pending"] == 0
    assert stats["failed"] + stats["coalesced"] + stats["dropped"] == 1000 and stats["failed"] >= 1
