"""`memory-butler dead-letters drop` (issue 16, item 8): a dead letter nobody redrives is dropped on purpose."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from tests.factories import insert_episode

NOW = datetime.now(UTC)


def test_the_cli_drops_dead_letters_by_id_and_all_needs_yes(engine, database_url, redis_url, monkeypatch, capsys):
    from memory_api.cli.main import main

    # given a tenant with two dead-lettered episodes and a pending one
    tenant = f"t-{uuid.uuid4().hex[:12]}"
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant})
        dead = [
            insert_episode(
                conn, tenant, butler="health", status="dead_letter", created_at=NOW, expires_at=NOW + timedelta(days=7)
            )
            for _ in range(2)
        ]
        pending = insert_episode(
            conn, tenant, butler="health", status="pending", created_at=NOW, expires_at=NOW + timedelta(days=7)
        )
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("REDIS_URL", redis_url)
    handlers = logging.getLogger().handlers[:]
    try:
        # when one is dropped by id, and the pending one is named too
        code = main(["dead-letters", "drop", str(dead[0]), str(pending)])
        by_id = capsys.readouterr()
        # when --all is asked without --yes, then nothing is dropped
        refused = main(["dead-letters", "drop", "--all", "--tenant", tenant])
        refusal = capsys.readouterr().err
        assert main(["dead-letters", "drop", "--all", "--tenant", tenant, "--yes"]) == 0
        everything = capsys.readouterr().out
    finally:
        logging.getLogger().handlers[:] = handlers
    # then only dead letters went; the pending episode is no dead letter and stays
    assert code == 1 and "dropped: 1 episode(s), 0 write intent(s)" in by_id.out
    assert f"not a dead letter (or unknown): {pending}" in by_id.err
    assert refused == 2 and "add --yes" in refusal
    assert "dropped: 1 episode(s)" in everything
    with engine.connect() as conn:
        left = set(conn.execute(text("SELECT id FROM episodes WHERE tenant_id = :t"), {"t": tenant}).scalars())
    assert left == {pending}
