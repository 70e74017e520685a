"""The re-embed backfill: rows from another model version get the current model's vectors, once."""

from __future__ import annotations

import json
import uuid

import numpy as np
from sqlalchemy import text

from shared.consolidation_plan import fact_text
from shared.embedding import ModelVersion, get_embedder
from shared.reembed import reembed, stale_count
from shared.repository import embedding_version_id


def test_reembed_backfills_stale_rows_and_a_second_run_finds_nothing(engine):
    # given a fact embedded by an "old model" (a zero-ish vector tagged with another version)
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    old = ModelVersion("old-model", f"v-{uuid.uuid4().hex[:6]}", 384)
    fid = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant})
        old_id = embedding_version_id(conn, old)
        conn.execute(
            text(
                "INSERT INTO facts (id, tenant_id, subject, predicate, content, embedding, embedding_version_id) "
                "VALUES (:i, :t, 'user', 'home_city', 'Lives in Lisbon', CAST(:e AS vector), :v)"
            ),
            {"i": fid, "t": tenant, "e": "[" + ",".join(["0.01"] * 384) + "]", "v": old_id},
        )
    embedder = get_embedder()
    # when the backfill runs for the current model
    done = sum(n for _, n in reembed(engine, embed=embedder.embed, version=embedder.version, batch=64))
    # then the row carries the current version and the current model's vector of its text
    with engine.begin() as conn:
        current = embedding_version_id(conn, embedder.version)
        row = conn.execute(text("SELECT embedding, embedding_version_id FROM facts WHERE id = :i"), {"i": fid}).one()
    assert done >= 1 and row.embedding_version_id == current
    expected = embedder.embed_one(fact_text("user", "home_city", "Lives in Lisbon"))
    assert float(np.dot(np.array(json.loads(row.embedding)), expected)) > 0.999
    assert stale_count(engine, current) == 0
    assert sum(n for _, n in reembed(engine, embed=embedder.embed, version=embedder.version)) == 0


def test_reembed_rebuilds_an_episodes_contextual_and_window_vectors(engine):
    # given an old-model episode with a preceding turn and a text longer than the model reads, and no other vectors
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    old = ModelVersion("old-model", f"v-{uuid.uuid4().hex[:6]}", 384)
    eid, long = uuid.uuid4(), "Assistant: " + " ".join(f"item {i} goes on the packing list." for i in range(100))
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant})
        conn.execute(
            text(
                "INSERT INTO episodes (id, tenant_id, butler, seq, content, preceding, embedding, embedding_version_id, "
                "expires_at) VALUES (:i, :t, 'general', 1, :c, 'User: what do I pack?', CAST(:e AS vector), :v, "
                "now() + interval '1 day')"
            ),
            {
                "i": eid,
                "t": tenant,
                "c": long,
                "e": "[" + ",".join(["0.01"] * 384) + "]",
                "v": embedding_version_id(conn, old),
            },
        )
    embedder = get_embedder()
    # when the backfill runs
    list(reembed(engine, embed=embedder.embed, version=embedder.version, batch=64))
    # then the episode has its contextual vector (n = 0) and its windows (n >= 1), with its tenant and butler
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT n, tenant_id, butler, embedding FROM episode_vectors WHERE episode_id = :i ORDER BY n"),
            {"i": eid},
        ).all()
    assert rows[0].n == 0 and len(rows) >= 3 and {(r.tenant_id, r.butler) for r in rows} == {(tenant, "general")}
    expected = embedder.embed_one("User: what do I pack?\n" + long)
    assert float(np.dot(np.array(json.loads(rows[0].embedding)), expected)) > 0.999
