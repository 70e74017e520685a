"""The beat schedule from Settings, cron parsing, redbeat settings and tick ids (no broker, no database)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from celery.schedules import crontab

from memory_workers import schedule
from shared.config import load_settings


def test_cron_strings_become_crontabs_field_by_field():
    # given the seed's consolidate cron, when parsed, then each field lands in its crontab slot
    c = schedule.parse_cron("0 */6 * * *")
    assert c.minute == {0} and c.hour == {0, 6, 12, 18}
    assert c.day_of_month == set(range(1, 32)) and c.month_of_year == set(range(1, 13))
    assert c.day_of_week == set(range(7))
    weekly = schedule.parse_cron("15 4 1-7 */3 1")
    assert (weekly.minute, weekly.hour, weekly.day_of_month) == ({15}, {4}, set(range(1, 8)))
    assert weekly.month_of_year == {1, 4, 7, 10} and weekly.day_of_week == {1}


@pytest.mark.parametrize("bad", ["0 3 * *", "0 3 * * * *", ""])
def test_a_cron_without_five_fields_is_refused(bad):
    with pytest.raises(ValueError, match="5 fields"):
        schedule.parse_cron(bad)


def test_the_schedule_has_every_task_on_its_configured_period():
    # given settings with the seed's crons and overridden intervals
    settings = load_settings(
        schedule={"decay_sweep": {"cron": "30 2 * * *"}, "redelivery_sweep_seconds": 1, "backlog_trigger_seconds": 7}
    )
    # when the beat schedule is built
    entries = schedule.beat_schedule(settings)
    # then every maintenance task is scheduled once, by its explicit name, on the maintenance queue
    assert sorted(e["task"] for e in entries.values()) == sorted(schedule.MAINTENANCE_TASKS)
    assert all(e["options"]["queue"] == "maintenance" for e in entries.values())
    by_task = {e["task"]: e for e in entries.values()}
    assert by_task["memory.decay_sweep"]["schedule"] == crontab(minute="30", hour="2")
    assert by_task["memory.episode_cleanup"]["schedule"] == crontab(minute="0", hour="4")
    assert by_task["memory.consolidate_all"]["schedule"] == crontab(minute="0", hour="*/6")
    assert by_task["memory.redelivery_sweep"]["schedule"].run_every == timedelta(seconds=1)
    assert by_task["memory.backlog_trigger"]["schedule"].run_every == timedelta(seconds=7)
    assert by_task["memory.backlog_trigger"]["options"]["expires"] == 7


def test_intervals_follow_the_environment(monkeypatch):
    monkeypatch.setenv("MEMORY_BUTLER_SCHEDULE__REDELIVERY_SWEEP_SECONDS", "1")
    entries = schedule.beat_schedule(load_settings())
    assert entries["memory.redelivery_sweep"]["schedule"].run_every == timedelta(seconds=1)


def test_cron_tick_is_the_publish_minute_in_utc():
    settings = load_settings()
    at = datetime(2026, 6, 1, 3, 0, 0, 50_000, tzinfo=UTC).timestamp()
    tick = schedule.tick_id("memory.decay_sweep", published_at=at, settings=settings)
    # the same run published twice within its minute gets the same id; the next day's run another
    assert tick == "2026-06-01T03:00Z"
    assert schedule.tick_id("memory.decay_sweep", published_at=at + 59.9, settings=settings) == tick
    assert schedule.tick_id("memory.decay_sweep", published_at=at + 86_400, settings=settings) != tick


def test_interval_tick_is_the_floored_period():
    settings = load_settings(schedule={"redelivery_sweep_seconds": 15})
    ticks = [
        schedule.tick_id("memory.redelivery_sweep", published_at=t, settings=settings)
        for t in (1_800_000_000.0, 1_800_000_014.9, 1_800_000_015.0)
    ]
    assert ticks[0] == ticks[1] != ticks[2]
    # stable across processes: a pure function of the publish time and the period
    assert ticks[0] == f"{1_800_000_000 // 15}x15s"


def test_publish_time_is_stamped_only_on_maintenance_messages():
    headers: dict = {}
    schedule.stamp_published_at(sender="memory.decay_sweep", headers=headers)
    assert isinstance(headers[schedule.PUBLISHED_AT_HEADER], float)
    stamped = dict(headers)
    schedule.stamp_published_at(sender="memory.decay_sweep", headers=headers)
    assert headers == stamped  # a re-publish keeps the original stamp
    other: dict = {}
    schedule.stamp_published_at(sender="memory.apply_writes", headers=other)
    assert other == {}


def test_task_payloads_round_trip_through_json():
    payload = {"tick": "2026-06-01T03:00Z"}
    assert json.loads(json.dumps(payload)) == payload


def test_beat_config_names_redbeat_and_the_redis_url():
    config = schedule.beat_config(load_settings(redis_url="redis://127.0.0.1:6379/11"))
    assert config["beat_scheduler"] == "redbeat.RedBeatScheduler"
    assert config["redbeat_redis_url"] == "redis://127.0.0.1:6379/11"
    # a dead holder's lock expires well before the next minute's cron tick could be missed twice
    assert config["beat_max_loop_interval"] < config["redbeat_lock_timeout"] <= 60
    assert "redbeat_redis_url" not in schedule.beat_config(load_settings(redis_url=None))


def test_redbeat_can_store_every_entry():
    # redbeat serialises schedules to JSON in Redis; an entry it cannot encode would be dropped at beat start
    from redbeat.decoder import RedBeatJSONDecoder, RedBeatJSONEncoder

    for entry in schedule.beat_schedule(load_settings()).values():
        encoded = json.dumps(entry, cls=RedBeatJSONEncoder)
        assert json.loads(encoded, cls=RedBeatJSONDecoder)["task"] == entry["task"]
