"""memory_events partitioned by month (issue 17 §4): the migration converts a populated table, the append-only
trigger still allows exactly the scrub and the purge, and the beat's task creates months ahead and drops whole
months past the retention."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from shared import db, maintenance, partitions
from shared.config import load_settings

NOW = datetime(2026, 11, 25, 3, 0, tzinfo=UTC)


def _migration_before_partitions(url: str) -> str:
    """The revision just before the partitioning one (found by its file, so a re-chained history still works)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(db.alembic_config(url))
    rev = next(r for r in script.walk_revisions() if "_partitioned_events" in r.path)
    return rev.down_revision


def _partitions(conn) -> dict[str, str]:
    return dict(
        conn.execute(
            text(
                "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c "
                "ON c.oid = i.inhrelid WHERE i.inhparent = 'memory_events'::regclass"
            )
        ).all()
    )


def test_the_migration_converts_a_populated_table_keeping_ids_and_the_trigger(empty_database_url):
    # given a database at the revision before partitioning, holding events of three past months and a scrub
    before = _migration_before_partitions(empty_database_url)
    db.migrate(empty_database_url, before)
    engine = create_engine(db.normalise_url(empty_database_url))
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES ('acme'), ('other')"))
        conn.execute(
            text(
                "INSERT INTO memory_events (tenant_id, event_type, entity_type, entity_id, occurred_at, actor, payload) "
                "SELECT CASE WHEN g % 3 = 0 THEN 'other' ELSE 'acme' END, 'fact.stored', 'fact', gen_random_uuid(), "
                "timestamptz '2026-08-10 12:00+00' + (g % 90) * interval '1 day', 'test', "
                "jsonb_build_object('content', 'secret ' || g, 'seq', g) FROM generate_series(1, 900) g"
            )
        )
        conn.execute(text("UPDATE memory_events SET payload = memory_events_scrubbed(payload) WHERE id = 1"))
        old = conn.execute(text("SELECT id, tenant_id, occurred_at, payload FROM memory_events ORDER BY id")).all()
    # when the partitioning migration runs
    db.migrate(empty_database_url, "head")
    with engine.begin() as conn:
        # then every row is there with its id, tenant, time and payload, each in its month's partition
        assert (
            conn.execute(text("SELECT id, tenant_id, occurred_at, payload FROM memory_events ORDER BY id")).all() == old
        )
        parts = _partitions(conn)
        assert {
            "memory_events_p2026_08",
            "memory_events_p2026_09",
            "memory_events_p2026_10",
            "memory_events_default",
        } <= set(parts)
        assert conn.execute(text("SELECT count(*) FROM memory_events_default")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM memory_events_p2026_09")).scalar_one() == 300
        conn.execute(text("SET LOCAL TIME ZONE 'UTC'"))  # pg_get_expr prints bounds in the session's zone
        assert (
            _partitions(conn)["memory_events_p2026_09"]
            == "FOR VALUES FROM ('2026-09-01 00:00:00+00') TO ('2026-10-01 00:00:00+00')"
        )
        # and three months ahead of now exist
        ahead = partitions.partition_name(partitions.add_months(partitions.month_start(datetime.now(UTC)), 3))
        assert ahead in parts
        # and a new event continues the ids after the largest copied one
        new_id = conn.execute(
            text(
                "INSERT INTO memory_events (tenant_id, event_type, entity_type, actor) "
                "VALUES ('acme', 'x', 'fact', 'test') RETURNING id"
            )
        ).scalar_one()
        assert new_id == 901
        # and every index has the tenant first
        defs = conn.execute(text("SELECT indexdef FROM pg_indexes WHERE tablename = 'memory_events'")).scalars().all()
        assert len(defs) == 2 and all("(tenant_id," in d for d in defs), defs
    # and the trigger still refuses an edit and a delete, on every partition
    for sql in (
        "UPDATE memory_events SET actor = 'evil' WHERE id = 2",
        "DELETE FROM memory_events WHERE id = 2",
        "DELETE FROM memory_events_p2026_08 WHERE id = 2",
    ):
        with pytest.raises(IntegrityError, match="append-only"), engine.begin() as conn:
            conn.execute(text(sql))
    # and the scrub passes
    with engine.begin() as conn:
        assert (
            conn.execute(
                text("UPDATE memory_events SET payload = memory_events_scrubbed(payload) WHERE id = 2")
            ).rowcount
            == 1
        )
        assert conn.execute(text("SELECT payload FROM memory_events WHERE id = 2")).scalar_one() == {
            "seq": 2,
            "scrubbed": True,
        }
    # when it is downgraded again, then the rows come back into one table, ids going on from the largest
    db.downgrade(empty_database_url, before)
    with engine.begin() as conn:
        assert conn.execute(text("SELECT count(*), max(id) FROM memory_events")).one() == (901, 901)
        assert _partitions(conn) == {}
        assert (
            conn.execute(
                text(
                    "INSERT INTO memory_events (tenant_id, event_type, entity_type, actor) "
                    "VALUES ('acme', 'x', 'fact', 'test') RETURNING id"
                )
            ).scalar_one()
            == 902
        )
    engine.dispose()


def test_month_arithmetic_and_the_retention_rule():
    # given partitions of several months
    names = ["memory_events_p2025_10", "memory_events_p2025_11", "memory_events_p2025_12", "memory_events_default"]
    now = datetime(2026, 1, 15, 12, tzinfo=UTC)
    # then a month goes only when its last instant is older than the retention, and 0 keeps everything
    assert partitions.expired(names, now=now, retention_days=45) == ["memory_events_p2025_10", "memory_events_p2025_11"]
    assert partitions.expired(names, now=now, retention_days=46) == ["memory_events_p2025_10"]
    assert partitions.expired(names, now=now, retention_days=0) == []
    assert partitions.months_ahead(now=datetime(2026, 11, 30, 23, 59, tzinfo=UTC), ahead=2) == [
        datetime(2026, 11, 1, tzinfo=UTC),
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    ]
    assert partitions.partition_month("memory_events_default") is None


def _event(conn, tenant: str, at: datetime) -> int:
    return conn.execute(
        text(
            "INSERT INTO memory_events (tenant_id, event_type, entity_type, occurred_at, actor) "
            "VALUES (:t, 'x', 'fact', :at, 'test') RETURNING id"
        ),
        {"t": tenant, "at": at},
    ).scalar_one()


def test_the_task_creates_months_ahead_and_drops_whole_months_past_the_retention(empty_database_url):
    # given a partitioned database whose events reach back to a month created by hand, with rows in it
    db.migrate(empty_database_url, "head")
    engine = db.make_engine(empty_database_url)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    old_month = datetime(2025, 6, 1, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant})
        assert partitions.create_month(conn, month=old_month) == "created"
        partitions.create_month(conn, month=datetime(2025, 7, 1, tzinfo=UTC))
        _event(conn, tenant, datetime(2025, 6, 30, 23, 59, tzinfo=UTC))
        _event(conn, tenant, datetime(2025, 7, 31, 23, 0, tzinfo=UTC))
    # when the task runs six months later with a retention that covers June but not all of July
    later = datetime(2026, 1, 20, tzinfo=UTC)
    cutoff_days = (later - datetime(2025, 7, 15, tzinfo=UTC)).days
    settings = load_settings(schedule={"events_retention_days": cutoff_days, "events_partitions_ahead_months": 4})
    result = maintenance.event_partitions(engine, now=later, settings=settings)
    # then June is dropped whole, July (partly younger than the retention) stays with its row
    assert result["dropped"] == ["memory_events_p2025_06"] and result["blocked"] == []
    with engine.begin() as conn:
        names = set(_partitions(conn))
        assert "memory_events_p2025_06" not in names and "memory_events_p2025_07" in names
        assert (
            conn.execute(text("SELECT count(*) FROM memory_events WHERE tenant_id = :t"), {"t": tenant}).scalar_one()
            == 1
        )
        # and January 2026 to May 2026 exist (this month and four ahead), each with the tenant-first indexes
        for month in ("2026_01", "2026_02", "2026_03", "2026_04", "2026_05"):
            assert f"memory_events_p{month}" in names
        defs = (
            conn.execute(text("SELECT indexdef FROM pg_indexes WHERE tablename = 'memory_events_p2026_05'"))
            .scalars()
            .all()
        )
        assert len(defs) == 2 and all("(tenant_id," in d for d in defs)
        # and the new partition refuses edits like the others
        _event(conn, tenant, datetime(2026, 5, 2, tzinfo=UTC))
    with pytest.raises(IntegrityError, match="append-only"), engine.begin() as conn:
        conn.execute(text("DELETE FROM memory_events_p2026_05"))
    # when it runs again, then there is nothing left to do
    again = maintenance.event_partitions(engine, now=later, settings=settings)
    assert again["created"] == [] and again["dropped"] == []
    engine.dispose()


def test_a_month_whose_rows_fell_into_the_default_partition_is_reported_not_created(empty_database_url):
    # given an event far beyond the months created ahead: it lands in the DEFAULT partition
    db.migrate(empty_database_url, "head")
    engine = db.make_engine(empty_database_url)
    far = partitions.add_months(partitions.month_start(datetime.now(UTC)), 8)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES ('acme')"))
        _event(conn, "acme", far + timedelta(days=3))
        assert conn.execute(text("SELECT count(*) FROM memory_events_default")).scalar_one() == 1
    # when the task runs in that month
    result = maintenance.event_partitions(engine, now=far + timedelta(days=10), settings=load_settings())
    # then that month is reported blocked, the next ones are created, and the row stays readable
    assert result["blocked"] == [partitions.partition_name(far)]
    assert partitions.partition_name(partitions.add_months(far, 1)) in result["created"]
    with engine.begin() as conn:
        assert conn.execute(text("SELECT count(*) FROM memory_events WHERE tenant_id = 'acme'")).scalar_one() == 1
    engine.dispose()
