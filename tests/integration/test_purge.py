"""Tenant purge, the right to erasure (issue 16, item 7): `memory-butler tenants purge TENANT --yes` deletes every
row of the tenant, in every table that has a tenant_id, leaves other tenants whole, and leaves one tombstone; the
append-only audit trail lets exactly this path delete events. Tokens expire when they were told to."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from shared import writes
from shared.config import Settings, load_settings
from shared.db import unit_of_work
from shared.embedding import get_embedder
from shared.errors import NotFound
from shared import receipts
from shared.purge import purge_tenant
from shared.tenancy import create_token, resolve_token
from shared.writes import ALL, Actor
from tests.integration.test_consolidation import NOW, SpyEmbedder, consolidate, new_tenant, rows, store_episodes

# The tombstone table is keyed by tenant on purpose: it is what remains of a purged tenant.
OUTSIDE_THE_TENANT = {"tenant_purges"}


@pytest.fixture(scope="module")
def settings(database_url: str, redis_url: str) -> Settings:
    return load_settings(database_url=database_url, redis_url=redis_url)


@pytest.fixture(scope="module")
def embedder() -> SpyEmbedder:
    return SpyEmbedder(get_embedder())


def tenant_tables(engine: Any) -> list[str]:
    """Every table of the schema with a tenant_id column (a table added later is checked without editing this);
    a partitioned table counts once, through its parent (memory_events' monthly partitions)."""
    return [
        t
        for (t,) in rows(
            engine,
            "SELECT c.table_name FROM information_schema.columns c JOIN pg_class p ON "
            "p.relname = c.table_name AND p.relnamespace = 'public'::regnamespace "
            "WHERE c.table_schema = 'public' AND c.column_name = 'tenant_id' "
            "AND NOT p.relispartition ORDER BY c.table_name",
        )
        if t not in OUTSIDE_THE_TENANT
    ]


def counts(engine: Any, tenant: str) -> dict[str, int]:
    found = {
        t: rows(engine, f"SELECT count(*) FROM {t} WHERE tenant_id = :t", t=tenant)[0][0] for t in tenant_tables(engine)
    }
    return {**found, "tenants": rows(engine, "SELECT count(*) FROM tenants WHERE id = :t", t=tenant)[0][0]}


def seed(engine: Any, settings: Settings, embedder: SpyEmbedder) -> str:
    """A tenant with rows in every tenant-keyed table, made the way the service makes them."""
    t = new_tenant(engine)
    [episode, *_] = store_episodes(
        engine,
        settings,
        embedder,
        t,
        ["I live in Berlin.", "My name is Ana.", "Always confirm before sending outbound messages."],
    )
    consolidate(engine, settings, embedder, t)
    [(rule_id,)] = rows(engine, "SELECT id FROM rules WHERE tenant_id = :t", t=t)
    with unit_of_work(engine) as conn:
        writes.mark_rule(
            conn,
            tenant_id=t,
            rule_id=rule_id,
            outcome="helpful",
            reason=None,
            visibility=ALL,
            actor=Actor("test"),
            now=NOW,
            rules=settings.memory.rules,
        )
        create_token(conn, tenant_id=t, name="test", butlers=["*"], role="admin")
        receipts.claim(
            conn,
            receipt=receipts.Receipt(
                tenant_id=t,
                butler="general",
                key="k1",
                tool="memory_confirm",
                entity_id=rule_id,
                arguments={"type": "rule"},
            ),
        )
        conn.execute(
            text(
                "INSERT INTO episode_vectors (episode_id, n, tenant_id, butler, embedding) "
                "SELECT id, 0, tenant_id, butler, embedding FROM episodes WHERE id = :e"
            ),
            {"e": episode},
        )
    return t


def test_purge_deletes_every_row_of_the_tenant_and_leaves_one_tombstone(
    engine, settings, embedder, database_url, redis_url, monkeypatch, capsys
):
    from memory_api.cli.main import main

    # given two tenants with rows in every tenant-keyed table
    doomed, other = seed(engine, settings, embedder), seed(engine, settings, embedder)
    before, other_before = counts(engine, doomed), counts(engine, other)
    assert all(n > 0 for n in before.values()), before  # the test covers every table
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("REDIS_URL", redis_url)
    handlers = logging.getLogger().handlers[:]
    try:
        # when the purge is asked without --yes, then it is refused and nothing is deleted
        assert main(["tenants", "purge", doomed]) == 2
        assert "add --yes" in capsys.readouterr().err and counts(engine, doomed) == before
        # when it is confirmed
        assert main(["tenants", "purge", doomed, "--yes"]) == 0
        out = capsys.readouterr().out
        # and an unknown tenant is named
        assert main(["tenants", "purge", "no-such-tenant", "--yes"]) == 2
        unknown = capsys.readouterr().err
    finally:
        logging.getLogger().handlers[:] = handlers
    # then not one row of the tenant is left, anywhere, and the other tenant is whole
    assert set(counts(engine, doomed).values()) == {0}
    assert counts(engine, other) == other_before
    assert f"purged tenant {doomed!r}: {sum(before.values())} rows deleted" in out
    assert "no tenant 'no-such-tenant'" in unknown
    # and one tombstone outside the tenant records it, with what went
    [(who, finished, tombstone)] = rows(
        engine, "SELECT requested_by, finished_at IS NOT NULL, counts FROM tenant_purges WHERE tenant_id = :t", t=doomed
    )
    assert who.startswith("cli:") and finished and tombstone == before


def test_only_a_purge_deletes_audit_events(engine, settings, embedder):
    # given a tenant with events, and one that was purged before (its tombstone is finished)
    t = seed(engine, settings, embedder)
    with unit_of_work(engine) as conn:
        conn.execute(
            text("INSERT INTO tenant_purges (tenant_id, requested_by, finished_at) VALUES (:t, 'test', now())"),
            {"t": t},
        )
    # when a plain DELETE of its events is tried, then it is refused (a finished tombstone opens nothing)
    with pytest.raises(DBAPIError, match="append-only"), unit_of_work(engine) as conn:
        conn.execute(text("DELETE FROM memory_events WHERE tenant_id = :t"), {"t": t})
    # and deleting the tenant row outside a purge is refused too (its events would cascade)
    with pytest.raises(DBAPIError, match="append-only"), unit_of_work(engine) as conn:
        conn.execute(text("DELETE FROM tenants WHERE id = :t"), {"t": t})
    assert rows(engine, "SELECT count(*) > 0 FROM memory_events WHERE tenant_id = :t", t=t) == [(True,)]
    # when the purge runs, then the same events go
    with unit_of_work(engine) as conn:
        tombstone = purge_tenant(conn, tenant_id=t, actor="test")
    assert tombstone["counts"]["memory_events"] > 0
    assert rows(engine, "SELECT count(*) FROM memory_events WHERE tenant_id = :t", t=t) == [(0,)]
    with pytest.raises(NotFound), unit_of_work(engine) as conn:  # a second purge finds nothing to erase
        purge_tenant(conn, tenant_id=t, actor="test")


def test_a_token_stops_resolving_at_its_expiry(engine):
    t = new_tenant(engine)
    with unit_of_work(engine) as conn:
        _, lasting = create_token(
            conn,
            tenant_id=t,
            name="lasting",
            butlers=["health"],
            role="butler",
            expires_at=datetime.now(UTC) + timedelta(days=30),
        )
        _, expired = create_token(
            conn,
            tenant_id=t,
            name="expired",
            butlers=["health"],
            role="butler",
            expires_at=datetime.now(UTC) - timedelta(seconds=1),
        )
        _, forever = create_token(conn, tenant_id=t, name="forever", butlers=["health"], role="butler")
    with unit_of_work(engine) as conn:
        live = resolve_token(conn, token=lasting)
        assert live is not None and live.expires_at is not None and not live.expired(datetime.now(UTC))
        assert live.expired(datetime.now(UTC) + timedelta(days=31))  # a cached principal expires with its token
        assert resolve_token(conn, token=expired) is None
        assert resolve_token(conn, token=forever).expires_at is None


def test_tokens_create_takes_an_expiry(engine, database_url, redis_url, monkeypatch, capsys):
    from memory_api.cli.main import main

    t = f"t-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("REDIS_URL", redis_url)
    handlers = logging.getLogger().handlers[:]
    try:
        assert (
            main(["tokens", "create", "--tenant", t, "--name", "short", "--butler", "health", "--expires-in", "12h"])
            == 0
        )
        created = capsys.readouterr().out
        with pytest.raises(SystemExit):  # argparse refuses a bad duration, naming it
            main(["tokens", "create", "--tenant", t, "--name", "bad", "--butler", "health", "--expires-in", "soon"])
        assert "'soon': a positive duration" in capsys.readouterr().err
    finally:
        logging.getLogger().handlers[:] = handlers
    assert "expires   " in created
    [(expires_in,)] = rows(engine, "SELECT expires_at - now() FROM api_tokens WHERE tenant_id = :t", t=t)
    assert timedelta(hours=11, minutes=59) < expires_in <= timedelta(hours=12)
