"""episodes partitioned by month of accept time (migration 0018, issue 17 §4): the migration converts a populated
table keeping ids, postings and references; the triggers keep the dropped foreign keys' actions; the beat's
partition task creates months ahead; the cleanup drops a month all of whose episodes expired, handling their
references as the row-by-row cleanup does, and keeps a month holding a live episode or a waiting dead letter."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import IntegrityError

from shared import candidates, db, episode_partitions, maintenance, partitions
from shared.config import load_settings
from tests.factories import VEC

EPISODES = partitions.EPISODES
NOW = datetime(2026, 1, 20, 3, 0, tzinfo=UTC)


def _revision_before_partitioned_episodes(url: str) -> str:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(db.alembic_config(url))
    return next(r for r in script.walk_revisions() if "_partitioned_episodes" in r.path).down_revision


def _partition_of(conn, eid: uuid.UUID) -> str:
    return conn.execute(text("SELECT tableoid::regclass::text FROM episodes WHERE id = :i"), {"i": eid}).scalar_one()


def _episode(conn, tenant: str, *, seq: int, at: datetime, content: str, ttl_days: float = 7.0, status="consolidated"):
    eid = uuid.uuid4()
    conn.execute(
        text(
            "INSERT INTO episodes (id, tenant_id, butler, seq, content, embedding, consolidation_status, created_at, "
            "occurred_at, expires_at) VALUES (:id, :t, 'health', :seq, :c, CAST(:e AS vector), :st, :at, :at, :x)"
        ),
        {
            "id": eid,
            "t": tenant,
            "seq": seq,
            "c": content,
            "e": VEC,
            "st": status,
            "at": at,
            "x": at + timedelta(ttl_days),
        },
    )
    return eid


def _vector(conn, tenant: str, eid: uuid.UUID) -> None:
    conn.execute(
        text(
            "INSERT INTO episode_vectors (episode_id, n, tenant_id, butler, embedding) "
            "VALUES (:e, 0, :t, 'health', CAST(:v AS vector))"
        ),
        {"e": eid, "t": tenant, "v": VEC},
    )


def _sourced(conn, table: str, tenant: str, eid: uuid.UUID | None) -> uuid.UUID:
    """A fact or rule learned from episode ``eid``."""
    rid = uuid.uuid4()
    cols = "subject, predicate, " if table == "facts" else ""
    vals = "'user', 'p-' || :id, " if table == "facts" else ""
    conn.execute(
        text(
            f"INSERT INTO {table} (id, tenant_id, {cols}content, embedding, source_episode_id) "
            f"VALUES (:id, :t, {vals}'learned', CAST(:e AS vector), :src)"
        ),
        {"id": rid, "t": tenant, "e": VEC, "src": eid},
    )
    return rid


def _source(conn, table: str, rid: uuid.UUID) -> uuid.UUID | None:
    return conn.execute(text(f"SELECT source_episode_id FROM {table} WHERE id = :i"), {"i": rid}).scalar_one()


def _count(conn, sql: str, **params) -> int:
    return int(conn.execute(text(sql), params).scalar_one())


def _references(conn, eid: uuid.UUID) -> tuple[int, int]:
    """(vectors, postings) of episode ``eid``."""
    return (
        _count(conn, "SELECT count(*) FROM episode_vectors WHERE episode_id = :e", e=eid),
        _count(conn, "SELECT count(*) FROM episode_terms WHERE episode_id = :e", e=eid),
    )


def test_the_migration_converts_populated_episodes_keeping_ids_references_and_triggers(empty_database_url):
    # given a database at the revision before 0018 with episodes over three months, their vectors and postings,
    # and facts and rules learned from them
    before = _revision_before_partitioned_episodes(empty_database_url)
    db.migrate(empty_database_url, before)
    engine = create_engine(db.normalise_url(empty_database_url))
    start = datetime(2025, 8, 3, 12, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES ('acme'), ('other')"))
        ids = [
            _episode(
                conn, "acme" if i % 3 else "other", seq=i + 1, at=start + timedelta(days=i), content=f"turn {i} pie"
            )
            for i in range(80)
        ]
        for eid in ids[::10]:
            _vector(conn, "acme" if ids.index(eid) % 3 else "other", eid)
        fact = _sourced(conn, "facts", "acme", ids[1])
        rule = _sourced(conn, "rules", "acme", ids[2])
        old = conn.execute(
            text("SELECT id, tenant_id, seq, created_at, content, embedding::text FROM episodes ORDER BY id")
        ).all()
        postings = conn.execute(
            text("SELECT tenant_id, lexeme, episode_id, tf, ctf FROM episode_terms ORDER BY episode_id, lexeme")
        ).all()
        vectors = _count(conn, "SELECT count(*) FROM episode_vectors")
    assert len(postings) > 80 and vectors == 8
    # when 0018 runs
    db.migrate(empty_database_url, "head")
    with engine.begin() as conn:
        # then every episode is there with its id and columns, each in its accept month's partition
        assert (
            conn.execute(
                text("SELECT id, tenant_id, seq, created_at, content, embedding::text FROM episodes ORDER BY id")
            ).all()
            == old
        )
        for eid, at in conn.execute(text("SELECT id, created_at FROM episodes")).all():
            assert _partition_of(conn, eid) == partitions.partition_name(partitions.month_start(at), EPISODES)
        assert _count(conn, "SELECT count(*) FROM episodes_default") == 0
        assert {"episodes_p2025_08", "episodes_p2025_09", "episodes_p2025_10"} <= set(
            partitions.existing(conn, EPISODES)
        )
        ahead = partitions.add_months(partitions.month_start(datetime.now(UTC)), 3)
        assert partitions.partition_name(ahead, EPISODES) in partitions.existing(conn, EPISODES)
        # and the postings, vectors and sources are untouched
        assert (
            conn.execute(
                text("SELECT tenant_id, lexeme, episode_id, tf, ctf FROM episode_terms ORDER BY episode_id, lexeme")
            ).all()
            == postings
        )
        assert _count(conn, "SELECT count(*) FROM episode_vectors") == vectors
        assert _source(conn, "facts", fact) == ids[1] and _source(conn, "rules", rule) == ids[2]
        # and every btree index leads with the tenant (the vector graph and the GIN index have one column)
        defs = conn.execute(text("SELECT indexdef FROM pg_indexes WHERE tablename = 'episodes'")).scalars().all()
        btrees = [d for d in defs if "USING btree" in d]
        assert len(btrees) == 6 and all("(tenant_id," in d for d in btrees), defs
        assert len(defs) == 8
        # and the postings triggers still work: a new episode gets its postings, an edit rewrites them
        new = _episode(conn, "acme", seq=500, at=datetime(2025, 9, 9, tzinfo=UTC), content="strawberry jam")
        assert {
            r
            for r in conn.execute(text("SELECT lexeme FROM episode_terms WHERE episode_id = :e"), {"e": new}).scalars()
        } == {"strawberri", "jam"}
        conn.execute(text("UPDATE episodes SET content = 'plum' WHERE id = :e"), {"e": new})
        assert conn.execute(
            text("SELECT lexeme FROM episode_terms WHERE episode_id = :e"), {"e": new}
        ).scalars().all() == ["plum"]
        # and a delete takes the episode's vectors and postings and clears its learners' source (the old FKs' actions)
        _vector(conn, "acme", ids[1])
        conn.execute(text("DELETE FROM episodes WHERE id = ANY(:ids)"), {"ids": [ids[1], ids[2]]})
        assert _references(conn, ids[1]) == (0, 0) and _references(conn, ids[2]) == (0, 0)
        assert _source(conn, "facts", fact) is None and _source(conn, "rules", rule) is None
    # and a source that is not an episode of the writer's tenant is refused, as the foreign key refused it
    for table, tenant, source in (
        ("facts", "acme", uuid.uuid4()),
        ("rules", "acme", ids[0]),
        ("facts", "other", ids[1]),
    ):
        with pytest.raises(IntegrityError, match="source episode"), engine.begin() as conn:
            _sourced(conn, table, tenant, source)
    with engine.begin() as conn:
        kept = _sourced(conn, "facts", "other", ids[0])  # ids[0] is the other tenant's
    # when it is downgraded, then one table holds every row again under the foreign keys
    db.downgrade(empty_database_url, before)
    with engine.begin() as conn:
        assert _count(conn, "SELECT count(*) FROM episodes") == 79
        assert partitions.existing(conn, EPISODES) == []
        fks = set(
            conn.execute(
                text("SELECT conname FROM pg_constraint WHERE contype = 'f' AND confrelid = 'episodes'::regclass")
            ).scalars()
        )
        assert fks == {
            "facts_source_episode_id_fkey",
            "rules_source_episode_id_fkey",
            "episode_vectors_episode_id_fkey",
            "episode_terms_episode_id_fkey",
        }
        conn.execute(text("DELETE FROM episodes WHERE id = :e"), {"e": ids[0]})
        assert _source(conn, "facts", kept) is None
    engine.dispose()


def test_the_partition_task_creates_episode_months_ahead_with_keys_and_triggers(empty_database_url):
    # given a partitioned database
    db.migrate(empty_database_url, "head")
    engine = db.make_engine(empty_database_url)
    later = partitions.add_months(partitions.month_start(datetime.now(UTC)), 6) + timedelta(days=2)
    settings = load_settings(schedule={"episodes_partitions_ahead_months": 2})
    # when the beat's partition task runs six months on
    result = maintenance.event_partitions(engine, now=later, settings=settings)
    # then this month and two ahead exist for episodes, with the tenant-first keys and the row trigger
    months = [partitions.partition_name(partitions.add_months(later, i), EPISODES) for i in range(3)]
    assert set(months) <= set(result["created"]) and result["blocked"] == []
    with engine.begin() as conn:
        assert set(months) <= set(partitions.existing(conn, EPISODES))
        defs = (
            conn.execute(text("SELECT indexdef FROM pg_indexes WHERE tablename = :t"), {"t": months[2]}).scalars().all()
        )
        assert len(defs) == 8 and all("(tenant_id," in d for d in defs if "USING btree" in d)
        assert (
            conn.execute(
                text(
                    "SELECT attstorage FROM pg_attribute WHERE attrelid = CAST(:t AS regclass) AND attname = 'embedding'"
                ),
                {"t": months[2]},
            ).scalar_one()
            == "p"
        )
        # and an episode accepted then lands there, with its postings (the parent's statement trigger)
        conn.execute(text("INSERT INTO tenants (id) VALUES ('acme')"))
        eid = _episode(conn, "acme", seq=1, at=later + timedelta(days=40), content="quince")
        assert _partition_of(conn, eid) == months[1]
        assert _references(conn, eid) == (0, 1)
        conn.execute(text("UPDATE episodes SET content = 'fig and quince' WHERE id = :e"), {"e": eid})
        assert _references(conn, eid) == (0, 2)
    # when it runs again, then nothing is left to create
    assert maintenance.event_partitions(engine, now=later, settings=settings)["created"] == []
    engine.dispose()


def _month_ended_scenario(conn) -> dict[str, uuid.UUID]:
    """June 2025: three episodes, all expired; July: one expired, one alive; August: a dead letter past its TTL but
    within its own retention. Each has learners, vectors or links."""
    conn.execute(text("INSERT INTO tenants (id) VALUES ('acme'), ('other')"))
    for month in (6, 7, 8):
        assert partitions.create_month(conn, month=datetime(2025, month, 1, tzinfo=UTC), table=EPISODES) == "created"
    june = datetime(2025, 6, 10, tzinfo=UTC)
    ids = {
        "june_a": _episode(conn, "acme", seq=1, at=june, content="apple pie"),
        "june_b": _episode(conn, "acme", seq=2, at=june + timedelta(days=5), content="banana bread"),
        "june_other": _episode(conn, "other", seq=1, at=june, content="cherry tart"),
        "july_gone": _episode(conn, "acme", seq=3, at=datetime(2025, 7, 2, tzinfo=UTC), content="apple crumble"),
        "july_alive": _episode(
            conn, "acme", seq=4, at=datetime(2025, 7, 3, tzinfo=UTC), content="apple sauce", ttl_days=400
        ),
        "august_dead": _episode(
            conn, "acme", seq=5, at=NOW - timedelta(days=9) - timedelta(days=140), content="pear", status="dead_letter"
        ),
    }
    for key in ("june_a", "june_other", "july_gone", "july_alive"):
        _vector(conn, "other" if key == "june_other" else "acme", ids[key])
    for key in ("june_a", "july_gone", "july_alive"):
        ids[f"fact_{key}"] = _sourced(conn, "facts", "acme", ids[key])
    ids["rule_june_b"] = _sourced(conn, "rules", "acme", ids["june_b"])
    conn.execute(
        text(
            "INSERT INTO memory_links (tenant_id, source_type, source_id, target_type, target_id, relation) "
            "VALUES ('acme', 'fact', :f, 'episode', :e, 'derived_from'), "
            "('acme', 'fact', :g, 'episode', :j, 'derived_from')"
        ),
        {"f": ids["fact_june_a"], "e": ids["june_a"], "g": ids["fact_july_gone"], "j": ids["july_gone"]},
    )
    return ids


def test_a_month_whose_episodes_all_expired_is_dropped_with_its_references_as_the_row_cleanup_does(empty_database_url):
    # given episodes in three past months, and a dead-letter retention under which the August dead letter (accepted
    # 149 days ago) still waits for a redrive
    db.migrate(empty_database_url, "head")
    engine = db.make_engine(empty_database_url)
    with engine.begin() as conn:
        ids = _month_ended_scenario(conn)
    settings = load_settings(schedule={"dead_letters_retention_days": 200})
    # when the episode cleanup runs
    result = maintenance.episode_cleanup(engine, now=NOW, settings=settings)
    # then June went as a partition, the expired July episode row by row, and July and August stay
    assert result["expired_months_dropped"] == ["episodes_p2025_06"] and result["expired_month_rows"] == 3
    assert result["expired_deleted"] == 1
    with engine.begin() as conn:
        names = set(partitions.existing(conn, EPISODES))
        assert "episodes_p2025_06" not in names and {"episodes_p2025_07", "episodes_p2025_08"} <= names
        assert episode_partitions.detached(conn) == []
        assert _count(conn, "SELECT count(*) FROM pg_class WHERE relname LIKE 'episodes%2025_06%'") == 0
        remaining = set(conn.execute(text("SELECT id FROM episodes")).scalars())
        assert remaining == {ids["july_alive"], ids["august_dead"]}
        # and the dropped month's references ended as the row-by-row cleanup leaves the July one's: vectors and
        # postings gone, learners kept with their source cleared, links kept (the cleanup never touches links)
        for key in ("june_a", "june_b", "june_other", "july_gone"):
            assert _references(conn, ids[key]) == (0, 0), key
        for key in ("june_a", "july_gone"):
            assert _source(conn, "facts", ids[f"fact_{key}"]) is None
        assert _source(conn, "rules", ids["rule_june_b"]) is None
        assert _count(conn, "SELECT count(*) FROM memory_links WHERE target_type = 'episode'") == 2
        # and the live episode keeps everything
        assert _references(conn, ids["july_alive"])[0] == 1 and _references(conn, ids["july_alive"])[1] > 0
        assert _source(conn, "facts", ids["fact_july_alive"]) == ids["july_alive"]
        # and the drop is audited like the row cleanup: one event per tenant, with the month
        events = conn.execute(
            text(
                "SELECT tenant_id, payload FROM memory_events WHERE event_type = 'episodes.cleaned' "
                "ORDER BY tenant_id, payload->>'partition' NULLS LAST"
            )
        ).all()
        assert [(t, p) for t, p in events] == [
            ("acme", {"count": 2, "reason": "expired", "partition": "episodes_p2025_06"}),
            ("acme", {"count": 1, "reason": "expired"}),
            ("other", {"count": 1, "reason": "expired", "partition": "episodes_p2025_06"}),
        ]
    # when it runs again with the dead letter's retention back to 30 days, August goes too; July never while alive
    again = maintenance.episode_cleanup(engine, now=NOW, settings=load_settings())
    assert again["expired_months_dropped"] == ["episodes_p2025_08"] and again["expired_deleted"] == 0
    with engine.begin() as conn:
        assert set(conn.execute(text("SELECT id FROM episodes")).scalars()) == {ids["july_alive"]}
    engine.dispose()


def test_a_month_detached_by_a_stopped_run_is_finished_by_the_next(empty_database_url):
    # given a month detached from episodes whose references were not cleaned yet (the run stopped there)
    db.migrate(empty_database_url, "head")
    engine = db.make_engine(empty_database_url)
    with engine.begin() as conn:
        ids = _month_ended_scenario(conn)
        dead_before = NOW - timedelta(days=30)
        assert episode_partitions.detach_month(conn, name="episodes_p2025_06", now=NOW, dead_before=dead_before) == (
            "episodes_expired_p2025_06"
        )
        # and a month with a live episode is never detached
        assert episode_partitions.detach_month(conn, name="episodes_p2025_07", now=NOW, dead_before=dead_before) is None
    with engine.begin() as conn:
        assert episode_partitions.detached(conn) == ["episodes_expired_p2025_06"]
        assert _source(conn, "facts", ids["fact_june_a"]) == ids["june_a"]  # dangling until the references step
        # and a new learner of a detached episode is refused
        with pytest.raises(IntegrityError, match="source episode"), conn.begin_nested():
            _sourced(conn, "facts", "acme", ids["june_b"])
    # when the cleanup runs
    result = maintenance.episode_cleanup(engine, now=NOW, settings=load_settings())
    # then it finishes that month first: references cleaned, table dropped
    assert "episodes_p2025_06" in result["expired_months_dropped"]
    with engine.begin() as conn:
        assert episode_partitions.detached(conn) == []
        assert _source(conn, "facts", ids["fact_june_a"]) is None and _references(conn, ids["june_a"]) == (0, 0)
    engine.dispose()


def test_a_search_reads_each_episode_from_its_own_month(empty_database_url):
    # given two episodes at the same tuple id (each the first row of its month's partition)
    db.migrate(empty_database_url, "head")
    engine = db.make_engine(empty_database_url)
    now = datetime.now(UTC)
    this_month = partitions.month_start(now)
    tenant = f"t-{uuid.uuid4().hex[:8]}"  # the read path caches scope sizes per tenant id, process-wide
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant})
        a = _episode(conn, tenant, seq=1, at=this_month + timedelta(hours=1), content="apple orchard", ttl_days=3000)
        b = _episode(
            conn, tenant, seq=2, at=partitions.add_months(this_month, 1) + timedelta(hours=1), content="apple cider"
        )
        tids = conn.execute(text("SELECT ctid::text FROM episodes WHERE id = ANY(:i)"), {"i": [a, b]}).scalars().all()
        assert tids[0] == tids[1]
    # when a keyword and vector search gathers the tenant's episodes
    with engine.begin() as conn:
        conn.execute(text(candidates.read_settings(pool=10, timeout_ms=10_000)))
        f = candidates.Filter(tenant, None, None, None, now)
        found = candidates.gather(conn, kinds=("episode",), f=f, query="apple", query_vec=VEC, pool=10)["episode"]
    # then each id comes with its own content, once
    assert sorted((r["id"], r["content"]) for r in found) == sorted([(a, "apple orchard"), (b, "apple cider")])
    engine.dispose()


def test_ended_months_are_past_months_only():
    names = [
        "episodes_p2025_11",
        "episodes_p2025_12",
        "episodes_p2026_01",
        "episodes_default",
        "memory_events_p2025_01",
    ]
    assert episode_partitions.ended_months(names, now=datetime(2026, 1, 1, tzinfo=UTC)) == [
        "episodes_p2025_11",
        "episodes_p2025_12",
    ]
    assert episode_partitions.ended_months(names, now=datetime(2025, 12, 31, 23, tzinfo=UTC)) == ["episodes_p2025_11"]
    assert episode_partitions.detached_name("episodes_p2025_11") == "episodes_expired_p2025_11"
