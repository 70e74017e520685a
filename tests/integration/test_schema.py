"""The database enforces the contract's invariants (seed 001 §5), whatever the application does."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from shared import db
from shared.models import metadata

ZERO_VEC = "[" + ",".join(["0.1"] * 384) + "]"


def _fact(conn, tenant: str, *, subject="user", predicate="name", content="John", validity="active", scope="global"):
    fid = uuid.uuid4()
    conn.execute(
        text(
            "INSERT INTO facts (id, tenant_id, subject, predicate, content, embedding, validity, scope) "
            "VALUES (:id, :t, :s, :p, :c, CAST(:e AS vector), :v, :sc)"
        ),
        {"id": fid, "t": tenant, "s": subject, "p": predicate, "c": content, "e": ZERO_VEC, "v": validity, "sc": scope},
    )
    return fid


def _episode(conn, tenant: str, *, seq: int = 1, status: str = "pending"):
    eid = uuid.uuid4()
    conn.execute(
        text(
            "INSERT INTO episodes (id, tenant_id, butler, seq, content, embedding, consolidation_status, expires_at) "
            "VALUES (:id, :t, 'health', :seq, 'hello', CAST(:e AS vector), :st, now() + interval '7 days')"
        ),
        {"id": eid, "t": tenant, "seq": seq, "e": ZERO_VEC, "st": status},
    )
    return eid


def test_second_active_fact_for_same_key_is_rejected(conn, tenant):
    # given an active fact for (tenant, global, user, name)
    _fact(conn, tenant)
    # when a second active fact for the same key is inserted
    # then the partial unique index rejects it
    with pytest.raises(IntegrityError, match="uq_facts_active_key"):
        with conn.begin_nested():
            _fact(conn, tenant, content="Jack")
    # but a superseded one, another scope, or another tenant's is fine
    _fact(conn, tenant, content="Jack", validity="superseded")
    _fact(conn, tenant, content="Jack", scope="health")


@pytest.mark.parametrize(
    "table,column,value",
    [
        ("facts", "validity", "forgotten"),
        ("facts", "permanence", "forever"),
        ("episodes", "consolidation_status", "done"),
    ],
)
def test_unknown_enum_values_are_rejected(conn, tenant, table, column, value):
    row = _fact(conn, tenant) if table == "facts" else _episode(conn, tenant)
    with pytest.raises(IntegrityError, match="check"):
        with conn.begin_nested():
            conn.execute(text(f"UPDATE {table} SET {column} = :v WHERE id = :id"), {"v": value, "id": row})


@pytest.mark.parametrize(
    "sql",
    [
        "UPDATE facts SET confidence = 1.5",
        "UPDATE facts SET importance = 11",
        "UPDATE facts SET decay_rate = -0.1",
        "UPDATE facts SET reference_count = -1",
    ],
)
def test_ranges_are_checked(conn, tenant, sql):
    _fact(conn, tenant)
    with pytest.raises(IntegrityError):
        with conn.begin_nested():
            conn.execute(text(sql + " WHERE tenant_id = :t"), {"t": tenant})


def test_rule_maturity_and_counters_are_checked(conn, tenant):
    rid = uuid.uuid4()
    insert = (
        "INSERT INTO rules (id, tenant_id, content, embedding, maturity, effectiveness_score, success_count) "
        "VALUES (:id, :t, 'Always confirm', CAST(:e AS vector), :m, 0, :s)"
    )
    conn.execute(text(insert), {"id": rid, "t": tenant, "e": ZERO_VEC, "m": "candidate", "s": 0})
    for params in ({"m": "expert", "s": 0}, {"m": "candidate", "s": -1}):
        with pytest.raises(IntegrityError):
            with conn.begin_nested():
                conn.execute(text(insert), {"id": uuid.uuid4(), "t": tenant, "e": ZERO_VEC, **params})


def test_consolidated_follows_the_status(conn, tenant):
    eid = _episode(conn, tenant)
    read = text("SELECT consolidated FROM episodes WHERE id = :id")
    assert conn.execute(read, {"id": eid}).scalar() is False
    conn.execute(text("UPDATE episodes SET consolidation_status = 'consolidated' WHERE id = :id"), {"id": eid})
    assert conn.execute(read, {"id": eid}).scalar() is True
    # and it cannot be written directly: it is a projection, not a second source of truth
    with pytest.raises(DBAPIError, match="generated"):
        with conn.begin_nested():
            conn.execute(text("UPDATE episodes SET consolidated = false WHERE id = :id"), {"id": eid})


def test_memory_events_refuse_update_and_delete(conn, tenant):
    conn.execute(
        text("INSERT INTO memory_events (tenant_id, event_type, entity_type, actor) VALUES (:t, 'x', 'fact', 'test')"),
        {"t": tenant},
    )
    for sql in (
        "UPDATE memory_events SET actor = 'evil' WHERE tenant_id = :t",
        "DELETE FROM memory_events WHERE tenant_id = :t",
    ):
        with pytest.raises(IntegrityError, match="append-only"):
            with conn.begin_nested():
                conn.execute(text(sql), {"t": tenant})


def test_tsvector_is_kept_current_by_the_database(conn, tenant):
    fid = _fact(conn, tenant, content="Allergic to peanuts")
    conn.execute(text("UPDATE facts SET content = 'Loves strawberries' WHERE id = :id"), {"id": fid})
    hit = text("SELECT count(*) FROM facts WHERE id = :id AND search_vector @@ plainto_tsquery('english', :q)")
    assert conn.execute(hit, {"id": fid, "q": "strawberry"}).scalar() == 1
    assert conn.execute(hit, {"id": fid, "q": "peanuts"}).scalar() == 0


def test_vector_indexes_are_hnsw_cosine(conn):
    rows = conn.execute(  # a partition's own copy of its parent's index is not listed (episodes are partitioned)
        text(
            "SELECT indexname, indexdef FROM pg_indexes i JOIN pg_class c ON c.relname = i.tablename "
            "WHERE indexdef LIKE '%vector_cosine_ops%' AND NOT c.relispartition"
        )
    ).all()
    assert {r.indexname for r in rows} == {
        "idx_episodes_embedding",
        "idx_facts_embedding",
        "idx_rules_embedding",
        "idx_episode_vectors_embedding",
    }
    assert all("USING hnsw" in r.indexdef for r in rows)


def test_models_mirror_the_migrated_schema(database_url):
    engine = create_engine(db.normalise_url(database_url))
    insp = inspect(engine)
    for table in metadata.sorted_tables:
        live = {c["name"] for c in insp.get_columns(table.name)}
        assert set(table.c.keys()) == live, table.name
        assert "tenant_id" in live or table.name in {"embedding_versions", "maintenance_runs", "tenants"}
    engine.dispose()


def test_migration_round_trip_on_an_empty_database(empty_database_url):
    from alembic.script import ScriptDirectory

    db.migrate(empty_database_url)
    head = ScriptDirectory.from_config(db.alembic_config(empty_database_url)).get_current_head()  # one head only
    assert head is not None and db.current_revision(empty_database_url) == head
    db.downgrade(empty_database_url, "base")
    engine = create_engine(db.normalise_url(empty_database_url))
    assert "facts" not in inspect(engine).get_table_names()
    engine.dispose()
    db.migrate(empty_database_url)
    assert db.current_revision(empty_database_url) is not None


def test_fact_and_rule_vectors_index_only_live_rows_and_reads_still_use_them(conn):
    # given the schema: the facts' and rules' HNSW indexes hold only active and fading rows, so a row the decay
    # sweep expires (or a supersession, a retraction) is not inserted into the graph again
    for table in ("facts", "rules"):
        indexdef = conn.execute(
            text("SELECT indexdef FROM pg_indexes WHERE indexname = :n"), {"n": f"idx_{table}_embedding"}
        ).scalar_one()
        assert "USING hnsw" in indexdef and "WHERE (validity = ANY (ARRAY['active'::text, 'fading'::text]))" in indexdef
        # when a nearest-neighbour search filters on live rows, as every read and dedup lookup does (their tenant
        # filter is left out here: on an empty test table the planner would rather scan the tenant's btree)
        conn.execute(text("SET LOCAL enable_sort = off"))  # only an ordered index scan can serve it then
        plan = "\n".join(
            conn.execute(
                text(
                    f"EXPLAIN SELECT id FROM {table} x WHERE x.validity IN ('active', 'fading') "
                    f"ORDER BY x.embedding <=> CAST(:v AS vector) LIMIT 5"
                ),
                {"v": ZERO_VEC},
            ).scalars()
        )
        # then the planner proves the index's predicate and uses it
        assert f"idx_{table}_embedding" in plan, plan


@pytest.mark.parametrize("words", [5, 20, 40, 300])
def test_an_episode_keeps_its_vector_in_the_row(conn, tenant, words):
    # given an episode of a chat turn's width (with the EXTERNAL storage pgvector declares, a 20-word turn and its
    # preceding turn push the vector out of line: measured, not assumed)
    eid = _episode(conn, tenant)
    turn = " ".join(uuid.uuid4().hex for _ in range(words))
    conn.execute(text("UPDATE episodes SET content = :c, preceding = :c WHERE id = :id"), {"c": turn, "id": eid})
    # then its vector is in the row, where the read path's exact sort reads it
    out_of_line = conn.execute(
        text("SELECT pg_column_toast_chunk_id(embedding) IS NOT NULL FROM episodes WHERE id = :id"), {"id": eid}
    ).scalar_one()
    assert out_of_line is False
    # and a lexeme's postings carry their counts in the key's index (an index-only scan)
    assert (
        "INCLUDE (tf, ctf)" in conn.execute(text("SELECT pg_get_indexdef('episode_terms_pkey'::regclass)")).scalar_one()
    )


def test_an_episodes_postings_carry_its_butler_first_in_the_key(conn, tenant):
    # given an episode of one butler, its terms changed after the insert (a preceding turn set)
    eid = _episode(conn, tenant)
    conn.execute(text("UPDATE episodes SET preceding = 'goodbye moon' WHERE id = :id"), {"id": eid})
    # then every posting, the inserted and the rewritten, carries the episode's butler
    butlers = conn.execute(text("SELECT DISTINCT butler FROM episode_terms WHERE episode_id = :id"), {"id": eid})
    assert butlers.scalars().all() == ["health"]
    # and a read of one butler's postings descends the key by tenant, butler and lexeme (another butler's are
    # never read)
    key = conn.execute(text("SELECT pg_get_indexdef('episode_terms_pkey'::regclass)")).scalar_one()
    assert "(tenant_id, butler, lexeme, episode_id) INCLUDE (tf, ctf)" in key
