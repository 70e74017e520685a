"""After the burst: wait for the backlog to drain, then prove from the database (and through MCP) that nothing
was lost, duplicated, reordered or shown to another tenant.

The checks, for the run's episodes (the rows carrying the run's marker tag):
- lost: an id the front answered "accepted" for that is not in ``episodes`` and whose intent is not waiting in the
  outbox (its intent's status says why); one still ``pending`` there is durable but not applied yet: "unapplied"
  (a run whose backlog did not drain, e.g. the front measured alone with the worker paused);
- duplicated: two rows with one text (every generated text is unique), or one id accepted for two writes;
- out of order: within one client's writes to one (tenant, butler), ``seq`` must grow with the send order;
- not terminal: once drained, every episode is consolidated or dead-lettered (or failed with a retry scheduled);
- cross-tenant: no row of tenant A carries B's marker, and A's token finds none of B's markers through
  memory_search / memory_context (while finding its own: otherwise the probe proves nothing).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Engine, text

from memory_api.loadtest.client import ToolFailed, call_tool, open_session
from memory_api.loadtest.generator import TenantPlan
from memory_api.loadtest.metrics import Accept

DRAIN_POLL_S = 1.0
PROBE_ATTEMPTS = 4

DRAIN_SQL = text("""
SELECT
  (SELECT count(*) FROM write_intents WHERE tenant_id = ANY(:t) AND status = 'pending') AS pending_intents,
  (SELECT count(*) FROM episodes WHERE tenant_id = ANY(:t) AND forgotten_at IS NULL
     AND (consolidation_status = 'pending'
          OR (consolidation_status = 'failed' AND next_consolidation_retry_at <= now()))) AS due
""")

EPISODES_SQL = text("""
SELECT id::text AS id, tenant_id, butler, seq, md5(content) AS digest, consolidation_status AS status,
       next_consolidation_retry_at IS NOT NULL AS retry_scheduled
FROM episodes WHERE tenant_id = ANY(:t) AND strpos(content, :tag) > 0
""")

INTENT_STATUS_SQL = text("SELECT id::text AS id, status FROM write_intents WHERE id = ANY(CAST(:ids AS uuid[]))")

# Rows of one tenant that carry another tenant's marker, per table (facts and rules come from consolidation).
CROSS_TENANT_SQL = text("""
WITH m(tenant_id, marker) AS (SELECT * FROM unnest(CAST(:t AS text[]), CAST(:m AS text[])))
SELECT 'episodes' AS tbl, count(*) AS n FROM episodes x JOIN m ON x.tenant_id <> m.tenant_id
  AND strpos(x.content, m.marker) > 0 WHERE x.tenant_id = ANY(:t)
UNION ALL
SELECT 'facts', count(*) FROM facts x JOIN m ON x.tenant_id <> m.tenant_id
  AND strpos(x.content, m.marker) > 0 WHERE x.tenant_id = ANY(:t)
UNION ALL
SELECT 'rules', count(*) FROM rules x JOIN m ON x.tenant_id <> m.tenant_id
  AND strpos(x.content, m.marker) > 0 WHERE x.tenant_id = ANY(:t)
""")


def drain_state(engine: Engine, tenant_ids: list[str]) -> dict[str, int] | None:
    try:
        with engine.connect() as conn:
            return dict(conn.execute(DRAIN_SQL, {"t": tenant_ids}).mappings().one())
    except Exception:  # noqa: BLE001 - the database may be coming back after a drill: poll again
        return None


def wait_for_drain(
    engine: Engine,
    tenant_ids: list[str],
    *,
    timeout_s: float,
    on_poll: Callable[[dict[str, int] | None], None] | None = None,
) -> bool:
    """Poll until no intent is pending and no episode is due for consolidation; False at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = drain_state(engine, tenant_ids)
        if on_poll is not None:
            on_poll(state)
        if state is not None and state["pending_intents"] == 0 and state["due"] == 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(DRAIN_POLL_S)


def check_database(
    engine: Engine, *, accepts: Sequence[Accept], tenants: Sequence[TenantPlan], run_tag: str
) -> dict[str, Any]:
    """Lost, duplicated, out-of-order, not-terminal and cross-tenant counts for the run's episodes."""
    tenant_ids = [t.tenant_id for t in tenants]
    with engine.connect() as conn:
        rows = conn.execute(EPISODES_SQL, {"t": tenant_ids, "tag": run_tag}).mappings().all()
        seq_of = {r["id"]: r["seq"] for r in rows}
        absent = sorted({a.id for a in accepts} - seq_of.keys())
        intent_status = {r["id"]: r["status"] for r in conn.execute(INTENT_STATUS_SQL, {"ids": absent}).mappings()}
        cross = {
            r["tbl"]: r["n"]
            for r in conn.execute(CROSS_TENANT_SQL, {"t": tenant_ids, "m": [t.marker for t in tenants]}).mappings()
        }
    digests = Counter(r["digest"] for r in rows)
    statuses = Counter(r["status"] for r in rows)
    non_terminal = sum(
        1 for r in rows if r["status"] == "pending" or (r["status"] == "failed" and not r["retry_scheduled"])
    )
    ids = Counter(a.id for a in accepts)
    lost_ids = [i for i in absent if intent_status.get(i) != "pending"]
    lost_status = Counter(intent_status.get(i, "missing") for i in lost_ids)
    return {
        "accepted": len(accepts),
        "stored": len(rows),
        "lost": len(lost_ids),
        "lost_by_intent_status": dict(lost_status),
        "lost_sample": lost_ids[:10],
        "unapplied": len(absent) - len(lost_ids),
        "duplicated": sum(n - 1 for n in digests.values() if n > 1) + sum(n - 1 for n in ids.values() if n > 1),
        "unacknowledged": len(seq_of.keys() - ids.keys()),
        "out_of_order": out_of_order(accepts, seq_of),
        "consolidation_status": dict(statuses),
        "non_terminal": non_terminal,
        "cross_tenant_rows": cross,
        "cross_tenant_sql": sum(cross.values()),
    }


def out_of_order(accepts: Sequence[Accept], seq_of: dict[str, int]) -> int:
    """Adjacent pairs of one client's writes to one key whose seq does not grow with the send order."""
    streams: dict[tuple[str, str, int], list[tuple[int, str]]] = defaultdict(list)
    for a in accepts:
        streams[(a.tenant_id, a.butler, a.client)].append((a.position, a.id))
    bad = 0
    for stream in streams.values():
        seqs = [seq_of[i] for _, i in sorted(stream) if i in seq_of]
        bad += sum(1 for before, after in zip(seqs, seqs[1:]) if after <= before)
    return bad


async def probe_isolation(
    url: str, tenants: Sequence[TenantPlan], tokens: dict[str, str], *, timeout_s: float = 30.0
) -> dict[str, Any]:
    """Through MCP with each tenant's token: its own marker is found, no other tenant's marker ever is."""
    markers = {t.tenant_id: t.marker for t in tenants}
    leaks, control, probes, degraded = 0, {}, 0, 0
    for tenant in tenants:
        foreign = [m for tid, m in markers.items() if tid != tenant.tenant_id]
        async with open_session(url, tokens[tenant.tenant_id], timeout_s=timeout_s) as session:
            own = await _search(session, tenant.marker, timeout_s)
            control[tenant.tenant_id] = sum(tenant.marker in hit["content"] for hit in own["results"])
            for marker in foreign:
                found = await _search(session, marker, timeout_s)
                block = await _probe(
                    session,
                    "memory_context",
                    {"trigger_prompt": f"What do you know about {marker}?", "butler": tenant.butlers[0]},
                    timeout_s,
                )
                texts = [hit["content"] for hit in found["results"]] + [block.get("context", "")]
                leaks += sum(1 for t in texts for m in foreign if m in t)
                degraded += bool(found.get("degraded")) + bool(block.get("degraded"))
                probes += 2
    return {"probes": probes, "leaks": leaks, "degraded": degraded, "own_marker_hits": control}


async def _search(session: Any, marker: str, timeout_s: float) -> dict[str, Any]:
    return await _probe(session, "memory_search", {"query": marker, "mode": "keyword", "limit": 20}, timeout_s)


async def _probe(session: Any, tool: str, arguments: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One read; a degraded answer (the database was slow: empty, not absent) is asked again a few times."""
    body: dict[str, Any] = {}
    for attempt in range(PROBE_ATTEMPTS):
        try:
            body = await call_tool(session, tool, arguments, timeout_s=timeout_s)
        except ToolFailed as exc:
            body = {"results": [], "context": "", "degraded": True, "error": exc.code}
        if not body.get("degraded"):
            return body
        await asyncio.sleep(0.5 * (attempt + 1))
    return body


def verdict(figures: dict[str, Any]) -> list[str]:
    """Every broken promise, in words; empty when the run passed."""
    db, iso, counts = figures.get("database") or {}, figures.get("isolation") or {}, figures.get("counts") or {}
    failures = []
    checks = [
        (figures.get("drained") is False, f"backlog not drained within {figures.get('drain_timeout_s')}s"),
        (db.get("lost", 0) > 0, f"{db.get('lost')} accepted episodes lost ({db.get('lost_by_intent_status')})"),
        (
            db.get("unapplied", 0) > 0,
            f"{db.get('unapplied')} accepted episodes still waiting in the outbox, not applied",
        ),
        (db.get("duplicated", 0) > 0, f"{db.get('duplicated')} duplicated episodes"),
        (db.get("out_of_order", 0) > 0, f"{db.get('out_of_order')} episodes out of order"),
        (db.get("non_terminal", 0) > 0, f"{db.get('non_terminal')} episodes not in a terminal consolidation state"),
        (db.get("cross_tenant_sql", 0) > 0, f"{db.get('cross_tenant_sql')} rows carry another tenant's marker"),
        (
            db.get("unacknowledged", 0) > counts.get("gave_up", 0),
            f"{db.get('unacknowledged')} stored episodes were never acknowledged (only {counts.get('gave_up', 0)} "
            "writes were given up)",
        ),
        (iso.get("leaks", 0) > 0, f"{iso.get('leaks')} cross-tenant hits through MCP"),
        (iso.get("degraded", 0) > 0, f"{iso.get('degraded')} isolation probes answered degraded: inconclusive"),
        (
            bool(iso) and not all(iso.get("own_marker_hits", {}).values()),
            "the isolation probe found a tenant's own marker nowhere: it proves nothing",
        ),
        (
            counts.get("gave_up", 0) + counts.get("not_sent", 0) > 0,
            f"{counts.get('gave_up', 0)} writes given up and {counts.get('not_sent', 0)} never sent",
        ),
        (counts.get("replay_mismatch", 0) > 0, f"{counts.get('replay_mismatch')} replays answered a different id"),
        (
            bool(figures.get("dead_parts")),
            f"stack parts not running after the run: {', '.join(figures.get('dead_parts') or [])}",
        ),
        (
            figures.get("accepted_while_db_down", 0) > 0,
            f"{figures.get('accepted_while_db_down')} writes answered 'accepted' while PostgreSQL was down",
        ),
    ]
    failures += [message for broken, message in checks if broken]
    failures += [
        f"{n} writes rejected ({k[len('rejected_') :]})" for k, n in counts.items() if k.startswith("rejected_")
    ]
    return failures
