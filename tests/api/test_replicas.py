"""The read plane for real: a PostgreSQL primary and its streaming replica (physical replication, pg_basebackup, the
embedded server's own binaries), a front with DATABASE_READ_URL, the real MCP client and the dashboard over HTTP.

Where a read was served is shown, not assumed: with the replica's replay paused (``pg_wal_replay_pause()``), a
write on the primary is invisible to reads the replica serves and visible to reads that must see it. The pair is
this module's own (tests/replication.py) and is stopped at the end, also when a test fails.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, create_engine, text

from memory_workers.extractors import build_extractor
from memory_workers.tasks import Runtime
from memory_workers.tasks.ingest import apply_pending
from shared import replicas
from shared.config import Settings, load_settings
from shared.embedding import get_embedder
from shared.writes import Actor
from tests.api.conftest import Butler, Front, TcpProxy, new_tenant, new_token
from tests.api.dashboard_client import Dash
from tests.polling import poll
from tests.replication import ReplicaPair

BUTLER = "health"


@pytest.fixture(scope="module")
def pair() -> Iterator[ReplicaPair]:
    servers = ReplicaPair()
    try:
        yield servers.start()
    finally:
        servers.stop()
    assert servers.running() == [], "a server of the pair is still running"


@pytest.fixture(scope="module")
def primary(pair: ReplicaPair) -> Iterator[Engine]:
    engine = create_engine(pair.primary_url)
    yield engine
    engine.dispose()


@pytest.fixture()
def paused(pair: ReplicaPair) -> Iterator[ReplicaPair]:
    """The replica stops replaying WAL (it keeps receiving it) until the test ends."""
    pair.wait_replayed()
    pair.replica_sql("SELECT pg_wal_replay_pause()")
    poll(
        lambda: pair.replica_sql("SELECT pg_get_wal_replay_pause_state()") == "paused",
        deadline_s=30,
        what="replay paused",
    )
    try:
        yield pair
    finally:
        pair.replica_sql("SELECT pg_wal_replay_resume()")


def settings_for(pair: ReplicaPair, redis_url: str, *, max_lag_s: float) -> Settings:
    return load_settings(
        database_url=pair.primary_url,
        database_read_url=pair.replica_url,
        redis_url=redis_url,
        replicas={"max_lag_seconds": max_lag_s, "check_interval_seconds": 0.1},
    )


def apply_writes(settings: Settings, engine: Engine, tenant: str, butler: str = BUTLER) -> None:
    """What the shard's worker does: apply the key's accepted writes (on the primary)."""
    rt = Runtime(settings, engine, get_embedder(), build_extractor(settings.consolidation))
    apply_pending(rt, tenant_id=tenant, butler=butler, actor=Actor("worker:test"))


def store_fact(butler: Butler, content: str, **extra: Any) -> str:
    out = butler.ok(
        "memory_store_fact",
        subject="user",
        predicate=f"p_{uuid.uuid4().hex[:8]}",
        content=content,
        scope=BUTLER,
        **extra,
    )
    return out["id"]


def recalled(butler: Butler, topic: str, **extra: Any) -> list[str]:
    out = butler.ok("memory_recall", topic=topic, min_confidence=0, **extra)
    assert out["degraded"] is False, out
    return [hit["id"] for hit in out["results"]]


def gauges(front: Front, token: str) -> dict[str, dict[str, float]]:
    """The front's /metrics replica gauges: {metric: {replica label: value}}."""
    body = httpx.get(front.base + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10).text
    found: dict[str, dict[str, float]] = {}
    for name, label, value in re.findall(r'^(memory_butler_replica_\w+)\{replica="([^"]+)"\} (\S+)$', body, re.M):
        found.setdefault(name, {})[label] = float(value)
    return found


def on_replica(pair: ReplicaPair, fact_id: str) -> int:
    return int(pair.replica_sql(f"SELECT count(*) FROM facts WHERE id = '{fact_id}'"))


def test_reads_are_served_by_the_replica_and_read_your_writes_fall_back_to_the_primary(
    pair, primary, paused, redis_url
):
    # given a front reading from the replica (the bound is far: the paused replica stays in use)
    settings = settings_for(pair, redis_url, max_lag_s=600)
    tenant = new_tenant(primary)
    writer = Butler("", new_token(primary, tenant, [BUTLER]))
    other = Butler("", new_token(primary, tenant, [BUTLER]))
    label = replicas.replica_label(pair.replica_url)
    with Front(settings) as front:
        writer.url = other.url = front.url
        # when a fact is accepted under a request_id and applied on the primary while the replica does not replay
        fact_id = store_fact(
            writer, "The user's favourite tea is a smoky lapsang souchong", request_context={"request_id": "rw-tea-1"}
        )
        apply_writes(settings, primary, tenant)
        assert on_replica(pair, fact_id) == 0
        # then a read carrying that request_context sees it (the replica has not replayed it: the primary answers)
        assert fact_id in recalled(writer, "favourite tea", request_context={"request_id": "rw-tea-1"})
        # and memory_get of the id this front accepted reads it too
        got = writer.ok("memory_get", type="fact", id=fact_id)
        assert got["status"] == "ok" and got["memory"]["content"].startswith("The user's favourite tea")
        # while reads that name no recent write are served by the replica, which does not have it yet
        assert fact_id not in recalled(writer, "favourite tea")
        assert fact_id not in recalled(other, "favourite tea")
        search = other.ok("memory_search", query="lapsang souchong", min_confidence=0)
        assert fact_id not in [h["id"] for h in search["results"]] and search["degraded"] is False
        # and the replica's lag shows in the gauge, in /metrics and in the function the metrics module calls
        operator = new_token(primary, tenant, ["*"], role="operator")  # replica gauges are fleet-wide
        poll(
            lambda: gauges(front, operator).get("memory_butler_replica_lag_seconds", {}).get(label, 0) > 0.3,
            deadline_s=20,
            what="the paused replica's lag in /metrics",
        )
        assert gauges(front, operator)["memory_butler_replica_up"][label] == 1
        assert replicas.replica_lag_seconds()[label] > 0.3
        # when replay resumes, the replica serves the fact and its lag falls back to zero
        pair.replica_sql("SELECT pg_wal_replay_resume()")
        poll(lambda: fact_id in recalled(other, "favourite tea"), deadline_s=30, what="the replica replaying")
        poll(
            lambda: gauges(front, operator)["memory_butler_replica_lag_seconds"][label] == 0,
            deadline_s=30,
            what="the lag back at zero once the replica has replayed everything",
        )
        # and the front's reads really ran on the replica (its connections are there, under the front's name)
        assert (
            int(
                pair.replica_sql(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                    "'memory-butler' AND backend_type = 'client backend'"
                )
            )
            >= 1
        )


def test_memory_get_of_an_accepted_id_reads_the_primary_until_the_replica_has_the_intent(
    pair, primary, paused, redis_url
):
    # given a front on the paused replica
    settings = settings_for(pair, redis_url, max_lag_s=600)
    tenant = new_tenant(primary)
    with Front(settings) as front:
        writer = Butler(front.url, new_token(primary, tenant, [BUTLER]))
        # when a fact is accepted (not applied yet: no worker runs)
        fact_id = store_fact(writer, "The user is allergic to penicillin")
        assert int(pair.replica_sql(f"SELECT count(*) FROM write_intents WHERE id = '{fact_id}'")) == 0
        # then memory_get answers from the primary: the write is known and pending, not "not found"
        assert writer.ok("memory_get", type="fact", id=fact_id)["status"] == "pending"
    # and a fresh front, which accepted nothing, reads the replica: there the id is unknown yet
    with Front(settings) as fresh:
        stranger = Butler(fresh.url, new_token(primary, tenant, [BUTLER]))
        assert stranger.error("memory_get", type="fact", id=fact_id)["error"] == "not_found"


def test_a_replica_lagging_past_the_bound_degrades_reads_to_the_primary(pair, primary, paused, redis_url):
    # given a front whose replicas may lag one second at most, and a fact the paused replica lacks
    settings = settings_for(pair, redis_url, max_lag_s=1.0)
    tenant = new_tenant(primary)
    with Front(settings) as front:
        butler = Butler(front.url, new_token(primary, tenant, [BUTLER]))
        operator = new_token(primary, tenant, ["*"], role="operator")  # replica gauges are fleet-wide
        label = replicas.replica_label(pair.replica_url)
        fact_id = store_fact(butler, "The user's cat is called Miso")
        apply_writes(settings, primary, tenant)
        # when the replica falls further behind than the bound
        poll(
            lambda: gauges(front, operator)["memory_butler_replica_lag_seconds"][label] > 1.0,
            deadline_s=20,
            what="the lag past the bound",
        )
        # then reads, with no request_context, go to the primary and see the fact (not degraded: fail open)
        assert fact_id in recalled(butler, "the cat's name")
        assert on_replica(pair, fact_id) == 0  # still paused: the answer cannot have come from the replica
        context = butler.ok("memory_context", trigger_prompt="what is my cat called", butler=BUTLER)
        assert "Miso" in context["context"] and context["degraded"] is False
        stats = butler.ok("memory_stats", scope=BUTLER)
        assert stats["degraded"] is False


def test_a_dead_replica_degrades_reads_to_the_primary_and_is_used_again_when_back(pair, primary, redis_url):
    # given a front on a replica that has everything, and a fact
    settings = settings_for(pair, redis_url, max_lag_s=600)
    tenant = new_tenant(primary)
    label = replicas.replica_label(pair.replica_url)
    with Front(settings) as front:
        butler = Butler(front.url, new_token(primary, tenant, [BUTLER]))
        operator = new_token(primary, tenant, ["*"], role="operator")  # replica gauges are fleet-wide
        fact_id = store_fact(butler, "The user's bicycle is a green Brompton")
        apply_writes(settings, primary, tenant)
        pair.wait_replayed()
        assert fact_id in recalled(butler, "bicycle")
        # when the replica dies
        pair.stop_server("replica")
        try:
            # then reads keep answering, from the primary, not degraded
            assert fact_id in recalled(butler, "bicycle")
            search = butler.ok("memory_search", query="Brompton", min_confidence=0)
            assert fact_id in [h["id"] for h in search["results"]] and search["degraded"] is False
            assert butler.ok("memory_get", type="fact", id=fact_id)["status"] == "ok"
            poll(
                lambda: gauges(front, operator)["memory_butler_replica_up"][label] == 0,
                deadline_s=20,
                what="the dead replica reported down",
            )
        finally:
            pair.start_server("replica")
        # and when it is back, it is used again
        poll(
            lambda: gauges(front, operator)["memory_butler_replica_up"][label] == 1,
            deadline_s=30,
            what="the replica back up",
        )
        assert fact_id in recalled(butler, "bicycle")


def test_the_dashboard_reads_the_replica_and_a_person_sees_their_own_edit(pair, primary, paused, redis_url):
    # given a fact both replicas and primary have, then the replica paused
    settings = settings_for(pair, redis_url, max_lag_s=600)
    tenant = new_tenant(primary)
    with Front(settings) as front:
        butler = Butler(front.url, new_token(primary, tenant, [BUTLER]))
        pair.replica_sql("SELECT pg_wal_replay_resume()")
        fact_id = store_fact(butler, "The user prefers window seats on trains")
        apply_writes(settings, primary, tenant)
        pair.wait_replayed()
        pair.replica_sql("SELECT pg_wal_replay_pause()")
        poll(
            lambda: pair.replica_sql("SELECT pg_get_wal_replay_pause_state()") == "paused",
            deadline_s=30,
            what="replay paused",
        )
        editor = Dash(front.base, new_token(primary, tenant, ["*"], role="admin"))
        viewer = Dash(front.base, new_token(primary, tenant, ["*"], role="admin"))
        # when one person deletes the fact in the dashboard (on the primary)
        editor.ok("DELETE", f"/api/memory/facts/{fact_id}")
        # then they see it retracted at once (their reads need their own edit: the primary answers)
        assert editor.get(f"/api/memory/facts/{fact_id}")["fact"]["validity"] == "retracted"
        # while another person's reads are served by the replica, which has not replayed the delete yet
        assert viewer.get(f"/api/memory/facts/{fact_id}")["fact"]["validity"] == "active"
        listed = viewer.get("/api/memory/facts", scope=BUTLER)
        assert fact_id in [f["id"] for f in listed["items"]]


def test_a_butler_that_forgot_a_memory_does_not_recall_it_from_a_replica_behind(pair, primary, paused, redis_url):
    # given a fact the replica has, then the replica paused
    settings = settings_for(pair, redis_url, max_lag_s=600)
    tenant = new_tenant(primary)
    with Front(settings) as front:
        forgetter = Butler(front.url, new_token(primary, tenant, [BUTLER]))
        other = Butler(front.url, new_token(primary, tenant, [BUTLER]))
        pair.replica_sql("SELECT pg_wal_replay_resume()")
        fact_id = store_fact(forgetter, "The user's locker code is 4471")
        apply_writes(settings, primary, tenant)
        pair.wait_replayed()
        pair.replica_sql("SELECT pg_wal_replay_pause()")
        poll(
            lambda: pair.replica_sql("SELECT pg_get_wal_replay_pause_state()") == "paused",
            deadline_s=30,
            what="replay paused",
        )
        # when one butler forgets it (on the primary, at once)
        forgetter.ok("memory_forget", type="fact", id=fact_id)
        # then that butler's next reads do not return it (they need the forget: the primary answers)
        assert fact_id not in recalled(forgetter, "locker code")
        assert forgetter.ok("memory_get", type="fact", id=fact_id)["memory"]["validity"] == "retracted"
        # while another token's reads are served by the paused replica, where it is still active
        assert fact_id in recalled(other, "locker code")


def test_without_replicas_every_read_goes_to_the_primary(primary):
    # given a plane with no replica configured
    plane = replicas.ReadPlane(primary=primary)
    try:
        # then it notes nothing, needs nothing and reads on the primary
        plane.note_write(["id:x"])
        assert plane.floor(["id:x"]) is None
        with plane.connect(floor=None) as conn:
            assert conn.execute(text("SELECT pg_is_in_recovery()")).scalar() is False
        assert plane.statuses() == []
    finally:
        plane.close()


def test_a_replica_that_swallows_connections_holds_neither_the_start_nor_the_reads(engine, database_url):
    # given a replica URL whose server accepts connections and never answers
    proxy = TcpProxy(database_url).start()
    proxy.stall()
    plane = replicas.ReadPlane(primary=engine, replica_urls=[proxy.url], check_interval_s=0.1, connect_timeout_s=1)
    try:
        # when the front starts its read plane
        started = time.monotonic()
        plane.start()
        # then the start waits a bounded time, and reads go to the primary
        assert time.monotonic() - started < 3.0
        with plane.connect() as conn:
            assert conn.engine is engine and conn.execute(text("SELECT 1")).scalar() == 1
        poll(
            lambda: plane.statuses()[0].reason and plane.statuses()[0].reason.startswith("unreachable"),
            deadline_s=10,
            what="the stalled replica reported unreachable",
        )
    finally:
        plane.close()
        proxy.close()
