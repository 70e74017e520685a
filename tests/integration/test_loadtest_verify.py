"""The load test's verification against real rows: written through the intake (the front's accept) and the
worker's apply path, then damaged on purpose to show each check catches what it promises to."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pytest
from sqlalchemy import Engine, text

from memory_api.loadtest import generator, verify
from memory_api.loadtest.burst import make_tenants
from memory_api.loadtest.metrics import Accept
from memory_workers.extractors.heuristic import HeuristicExtractor
from memory_workers.tasks import Runtime
from memory_workers.tasks.ingest import apply_pending
from shared import intake
from shared.config import load_settings
from shared.db import unit_of_work
from shared.embedding import model_version
from shared.intake import WriteRequest
from shared.schemas import EpisodeWrite
from shared.writes import Actor

EPISODES_PER_CLIENT = 12


class RandomEmbedder:
    """Unit vectors without the model: verification never looks at them."""

    version = model_version()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vectors = np.random.default_rng(len(texts)).normal(size=(len(texts), 384)).astype(np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


@pytest.fixture()
def run(engine: Engine, database_url: str) -> dict:
    """Two tenants, one client each, every episode accepted one call at a time and applied by the worker path."""
    run_id = generator.new_run_id()
    tenants = generator.plan_tenants(run_id, count=2, butlers=2)
    tokens = make_tenants(engine, tenants, run_id)
    accepts: list[Accept] = []
    for client, tenant in enumerate(tenants):
        for e in generator.client_episodes(run_id, client=client, count=EPISODES_PER_CLIENT, tenant=tenant, seed=3):
            accepts.append(
                Accept(
                    e.tenant_id,
                    e.butler,
                    client,
                    e.position,
                    _accept(engine, e.tenant_id, e.butler, e.content, e.idempotency_key),
                    e.idempotency_key,
                    0.0,
                    0.0,
                    1.0,
                    1.0,
                    1,
                    False,
                )
            )
    runtime = Runtime(load_settings(database_url=database_url), engine, RandomEmbedder(), HeuristicExtractor())
    pending = verify.drain_state(engine, [t.tenant_id for t in tenants])
    for tenant in tenants:
        for butler in tenant.butlers:
            apply_pending(runtime, tenant_id=tenant.tenant_id, butler=butler, actor=Actor("worker:test"))
    return {"run_id": run_id, "tenants": tenants, "accepts": accepts, "tokens": tokens, "pending_before": pending}


def _accept(engine: Engine, tenant_id: str, butler: str, content: str, key: str) -> str:
    """One episode accepted as the front accepts it (a pending write intent); its id."""
    payload = EpisodeWrite(content=content, butler=butler).model_dump(mode="json")
    with unit_of_work(engine) as conn:
        (a,) = intake.accept(
            conn,
            tenant_id=tenant_id,
            actor=butler,
            request_id=None,
            writes=[WriteRequest("episode", butler, payload, key)],
        )
    return str(a.id)


def _check(engine: Engine, run: dict, accepts: Sequence[Accept] | None = None) -> dict:
    return verify.check_database(
        engine,
        accepts=run["accepts"] if accepts is None else accepts,
        tenants=run["tenants"],
        run_tag=f"lt{run['run_id']}t",
    )


def _episode(engine: Engine, tenant_id: str, content: str, seq: int) -> None:
    """A row written behind the front's back (what a bug would leave)."""
    with unit_of_work(engine) as conn:
        conn.execute(
            text(
                "INSERT INTO episodes (id, tenant_id, butler, seq, content, embedding, expires_at) "
                "VALUES (:id, :t, 'health', :seq, :c, CAST(:v AS vector), now() + interval '1 day')"
            ),
            {"id": uuid.uuid4(), "t": tenant_id, "seq": seq, "c": content, "v": "[" + ",".join(["0.05"] * 384) + "]"},
        )


def test_an_honest_run_passes_once_consolidated(engine: Engine, run: dict):
    # given every accepted episode applied by the worker path (the intents were pending before it ran)
    tenant_ids = [t.tenant_id for t in run["tenants"]]
    assert run["pending_before"]["pending_intents"] == 2 * EPISODES_PER_CLIENT

    # when the checks run before consolidation, then only "not terminal" is reported
    before = _check(engine, run)
    assert (before["lost"], before["duplicated"], before["out_of_order"], before["cross_tenant_sql"]) == (0, 0, 0, 0)
    assert before["stored"] == 2 * EPISODES_PER_CLIENT and before["unacknowledged"] == 0
    assert before["non_terminal"] == 2 * EPISODES_PER_CLIENT
    assert not verify.wait_for_drain(engine, tenant_ids, timeout_s=0)

    # when every episode reaches a terminal state, then the backlog is drained and nothing is reported
    with unit_of_work(engine) as conn:
        conn.execute(
            text("UPDATE episodes SET consolidation_status = 'consolidated' WHERE tenant_id = ANY(:t)"),
            {"t": tenant_ids},
        )
    after = _check(engine, run)
    assert verify.wait_for_drain(engine, tenant_ids, timeout_s=0)
    assert after["non_terminal"] == 0 and after["consolidation_status"] == {"consolidated": 2 * EPISODES_PER_CLIENT}
    assert verify.verdict({"drained": True, "database": after, "counts": {}}) == []


def test_a_lost_episode_is_reported_with_its_intent_status(engine: Engine, run: dict):
    ghost = replace(run["accepts"][0], id=str(uuid.uuid4()), position=999)
    report = _check(engine, run, [*run["accepts"], ghost])
    assert report["lost"] == 1 and report["lost_by_intent_status"] == {"missing": 1}
    assert report["lost_sample"] == [ghost.id]


def test_an_accepted_episode_still_in_the_outbox_is_unapplied_not_lost(engine: Engine, run: dict):
    # given one more write accepted by the intake after the worker ran: durable, but not applied
    first = run["accepts"][0]
    content = f"Waiting (ref {run['tenants'][0].marker})"
    waiting = replace(first, id=_accept(engine, first.tenant_id, first.butler, content, "waiting-1"), position=998)

    # then it is counted apart from the lost, and the verdict says where it is
    report = _check(engine, run, [*run["accepts"], waiting])
    assert (report["lost"], report["unapplied"], report["lost_by_intent_status"]) == (0, 1, {})
    failures = verify.verdict({"drained": False, "drain_timeout_s": 1, "database": report, "counts": {}})
    assert "1 accepted episodes still waiting in the outbox, not applied" in failures
    assert not any("lost" in f for f in failures)


def test_sends_answered_out_of_seq_order_are_reported(engine: Engine, run: dict):
    # given a client whose 2nd and 3rd writes to one butler got their seqs the other way round (swap the ids)
    accepts = list(run["accepts"])
    first, *rest = [i for i, a in enumerate(accepts) if a.client == 0 and a.butler == accepts[0].butler]
    second, third = rest[:2]
    accepts[second], accepts[third] = (
        replace(accepts[second], id=accepts[third].id),
        replace(accepts[third], id=accepts[second].id),
    )
    assert _check(engine, run, accepts)["out_of_order"] == 1


def test_duplicates_and_cross_tenant_rows_are_reported(engine: Engine, run: dict):
    # given a second copy of a stored text, and a row of tenant A carrying tenant B's marker
    a, b = run["tenants"]
    copied = run["accepts"][1]
    with engine.connect() as conn:
        content = conn.execute(text("SELECT content FROM episodes WHERE id = :id"), {"id": copied.id}).scalar_one()
    _episode(engine, copied.tenant_id, content, seq=10_001)
    _episode(engine, a.tenant_id, f"Planted by a bug (ref {b.marker} c999-00000)", seq=10_002)

    # then both are reported: the copy as a duplicate, both as never acknowledged, the plant as cross-tenant
    report = _check(engine, run)
    assert report["duplicated"] == 1
    assert report["unacknowledged"] == 2
    assert report["cross_tenant_rows"] == {"episodes": 1, "facts": 0, "rules": 0}
    failures = "\n".join(verify.verdict({"drained": True, "database": report, "counts": {}}))
    assert "1 duplicated" in failures and "another tenant's marker" in failures
