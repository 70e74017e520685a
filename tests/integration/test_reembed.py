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
        conn.execute(text(
            "INSERT INTO facts (id, tenant_id, subject, predicate, content, embedding, embedding_version_id) "
            "VALUES (:i, :t, 'user', 'home_city', 'Lives in Lisbon', CAST(:e AS vector), :v)"),
            {"i": fid, "t": tenant, "e": "[" + ",".join(["0.01"] * 384) + "]", "v": old_id})
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
