"""Dashboard stats and the Postgres-backed gauges, on crafted rows with an explicit `now`."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from shared import stats as stats_mod
from shared import telemetry
from shared.config import load_settings
from tests.factories import VEC, insert_episode, next_seq

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
SETTINGS = load_settings()


def _fact(conn, tenant, *, validity="active", permanence="standard", rate=0.0, age_days=0.0, conf=1.0, scope="global"):
    conn.execute(
        text(
            "INSERT INTO facts (id, tenant_id, subject, predicate, content, embedding, validity, permanence, decay_rate, "
            "confidence, scope, last_confirmed_at) VALUES (:id, :t, 's', :p, 'c', CAST(:e AS vector), :v, :perm, :r, :c, "
            ":sc, :at)"
        ),
        {
            "id": uuid.uuid4(),
            "t": tenant,
            "p": uuid.uuid4().hex,
            "e": VEC,
            "v": validity,
            "perm": permanence,
            "r": rate,
            "c": conf,
            "sc": scope,
            "at": NOW - timedelta(days=age_days),
        },
    )


def _rule(conn, tenant, *, maturity="candidate", success=0, harmful=0, eff=0.0, scope="global", validity="active"):
    conn.execute(
        text(
            "INSERT INTO rules (id, tenant_id, content, embedding, maturity, success_count, harmful_count, "
            "effectiveness_score, scope, validity) VALUES (:id, :t, 'r', CAST(:e AS vector), :m, :s, :h, :eff, :sc, :v)"
        ),
        {
            "id": uuid.uuid4(),
            "t": tenant,
            "e": VEC,
            "m": maturity,
            "s": success,
            "h": harmful,
            "eff": eff,
            "sc": scope,
            "v": validity,
        },
    )


def _episode(conn, tenant, *, butler="health", status="pending", age_seconds=0.0):
    insert_episode(
        conn,
        tenant,
        butler=butler,
        status=status,
        created_at=NOW - timedelta(seconds=age_seconds),
        expires_at=NOW + timedelta(days=7),
    )


def _intent(conn, tenant, *, butler="health", status="pending", age_seconds=0.0):
    seq = next_seq(conn, tenant, butler)
    conn.execute(
        text(
            "INSERT INTO write_intents (id, tenant_id, butler, seq, kind, payload, actor, status, created_at) "
            "VALUES (:id, :t, :b, :seq, 'episode', '{}', 'test', :st, :c)"
        ),
        {
            "id": uuid.uuid4(),
            "t": tenant,
            "b": butler,
            "seq": seq,
            "st": status,
            "c": NOW - timedelta(seconds=age_seconds),
        },
    )


def test_stats_counts_states_bands_and_backlog(conn, tenant):
    # given facts across states and confidence bands
    _fact(conn, tenant, permanence="permanent")  # 1.0
    _fact(conn, tenant, conf=0.6)  # 0.6
    _fact(conn, tenant, conf=0.8)  # 0.8 (upper bound inclusive)
    _fact(conn, tenant, rate=0.03, age_days=40, permanence="volatile")  # 0.30
    _fact(conn, tenant, rate=0.1, age_days=30, permanence="ephemeral")  # 0.05: active, not swept yet
    _fact(conn, tenant, validity="fading", permanence="stable")
    _fact(conn, tenant, validity="expired")
    _fact(conn, tenant, validity="superseded")
    # and rules: helping, not helping, unrated, an anti-pattern, a retracted one
    _rule(conn, tenant, maturity="established", success=8, eff=0.8)
    _rule(conn, tenant, success=1, harmful=1, eff=0.2)
    _rule(conn, tenant)
    _rule(conn, tenant, maturity="anti_pattern", harmful=4, eff=0.0)
    _rule(conn, tenant, validity="retracted", success=9, eff=0.9)
    # and episodes in every status
    _episode(conn, tenant, status="pending", age_seconds=600)
    _episode(conn, tenant, status="pending", age_seconds=60)
    _episode(conn, tenant, status="failed", age_seconds=9000)
    _episode(conn, tenant, status="dead_letter")
    _episode(conn, tenant, status="consolidated")
    _intent(conn, tenant, status="dead_letter")
    # when stats are read
    s = stats_mod.stats(conn, tenant_id=tenant, scope=None, now=NOW, settings=SETTINGS)
    # then counts are per state, zero-filled
    facts = s["facts"]
    assert facts["total"] == 8
    assert facts["by_validity"] == {"active": 5, "fading": 1, "superseded": 1, "expired": 1, "retracted": 0}
    assert facts["live_by_permanence"] == {"permanent": 1, "stable": 1, "standard": 2, "volatile": 1, "ephemeral": 1}
    assert facts["active_confidence_bands"] == {"above_0.8": 1, "0.5_to_0.8": 2, "0.2_to_0.5": 1, "below_0.2": 1}
    rules = s["rules"]
    assert rules["by_maturity"] == {"candidate": 3, "established": 1, "proven": 0, "anti_pattern": 1}
    assert rules["by_validity"] == {"active": 4, "fading": 0, "expired": 0, "retracted": 1}
    assert rules["effectiveness"] == {"rated": 2, "avg": 0.5, "helping": 1, "helping_share": 0.5, "anti_patterns": 1}
    episodes = s["episodes"]
    assert episodes["by_status"] == {"pending": 2, "consolidated": 1, "failed": 1, "dead_letter": 1}
    assert episodes["backlog"]["count"] == 3
    assert episodes["backlog"]["oldest_pending_age_seconds"] == 600
    assert s["dead_letters"] == {"episodes": 1, "write_intents": 1}


def test_stats_scope_narrows_to_global_plus_scope_and_the_butlers_episodes(conn, tenant):
    # given facts, rules and episodes in two scopes
    for scope in ("global", "health", "finance"):
        _fact(conn, tenant, scope=scope)
        _rule(conn, tenant, scope=scope)
    _episode(conn, tenant, butler="health")
    _episode(conn, tenant, butler="finance")
    # when stats are read for the health butler
    s = stats_mod.stats(conn, tenant_id=tenant, scope="health", now=NOW, settings=SETTINGS)
    # then finance's memories are not counted
    assert s["facts"]["total"] == 2 and s["rules"]["total"] == 2 and s["episodes"]["total"] == 1
    # and another tenant sees none of it
    other = f"t-{uuid.uuid4().hex[:12]}"
    conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": other})
    assert stats_mod.stats(conn, tenant_id=other, scope=None, now=NOW, settings=SETTINGS)["facts"]["total"] == 0


def _samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def test_the_last_run_of_each_maintenance_task_is_the_operators_not_a_tenants(conn, tenant):
    # given a task whose newest run died mid-run after an older one finished
    conn.execute(
        text(
            "INSERT INTO maintenance_runs (task, tick, started_at, finished_at, summary) VALUES "
            "('memory.t1', 'a', :day_ago, :day_ago, '{}'), "
            "('memory.t1', 'b', :hour_ago, NULL, '{\"batches\": 2}')"
        ),
        {"day_ago": NOW - timedelta(days=1), "hour_ago": NOW - timedelta(hours=1)},
    )
    runs = stats_mod.last_maintenance_runs(conn)
    assert runs["memory.t1"]["tick"] == "b" and runs["memory.t1"]["summary"] == {"batches": 2}
    # then the gauges show the newest start, its missing finish, and the older success
    times = stats_mod.maintenance_times(conn)["memory.t1"]
    assert times == {
        "started_at": (NOW - timedelta(hours=1)).timestamp(),
        "finished_at": None,
        "succeeded_at": (NOW - timedelta(days=1)).timestamp(),
    }
    body = telemetry.scrape_text(telemetry.maintenance_families({"memory.t1": times}, {"memory.t1": 3600.0})).decode()
    samples = _samples(body)
    assert samples[("memory_butler_maintenance_last_started_seconds", (("task", "memory.t1"),))] == times["started_at"]
    assert samples[("memory_butler_maintenance_last_finished_seconds", (("task", "memory.t1"),))] == 0.0
    assert (
        samples[("memory_butler_maintenance_last_success_seconds", (("task", "memory.t1"),))] == times["succeeded_at"]
    )
    assert samples[("memory_butler_maintenance_period_seconds", (("task", "memory.t1"),))] == 3600.0
    # fleet-wide rows (with their raw summaries) are not part of a tenant's memory_stats (issue 16, A2)
    assert "maintenance" not in stats_mod.stats(conn, tenant_id=tenant, scope=None, now=NOW, settings=SETTINGS)


def test_gauges_per_shard_key_and_their_exposition(conn, tenant):
    # given a key with backlog, dead letters and pending intents, and a drained key
    _episode(conn, tenant, butler="health", status="pending", age_seconds=120)
    _episode(conn, tenant, butler="health", status="failed", age_seconds=999)
    _episode(conn, tenant, butler="health", status="dead_letter")
    _intent(conn, tenant, butler="health", age_seconds=30)
    _episode(conn, tenant, butler="chat", status="consolidated")
    # when the gauges are read
    rows = {(g["tenant_id"], g["butler"]): g for g in stats_mod.gauges(conn, now=NOW)}
    # then each key has its numbers and the drained key reads zero
    health, chat = rows[(tenant, "health")], rows[(tenant, "chat")]
    assert (health["backlog"], health["oldest_pending_seconds"], health["dead_letter_episodes"]) == (2, 120.0, 1)
    assert (health["pending_intents"], health["oldest_intent_seconds"]) == (1, 30.0)
    assert (chat["backlog"], chat["oldest_pending_seconds"], chat["pending_intents"]) == (0, 0.0, 0)
    # the p95 age of the unconsolidated episodes (pending and failed) is the older one's (of two, 95 % are younger)
    assert health["backlog_age_p95_seconds"] == 999.0 and chat["backlog_age_p95_seconds"] == 0.0
    # and the exposition text is well formed
    body = telemetry.scrape_text(telemetry.key_families([health, chat])).decode()
    samples = _samples(body)
    h, c = (("butler", "health"), ("tenant_id", tenant)), (("butler", "chat"), ("tenant_id", tenant))
    assert samples[("memory_butler_backlog", h)] == 2
    assert samples[("memory_butler_oldest_pending_seconds", h)] == 120
    assert samples[("memory_butler_backlog_age_p95_seconds", h)] == 999
    assert (
        samples[("memory_butler_dead_letters", (("butler", "health"), ("kind", "episode"), ("tenant_id", tenant)))] == 1
    )
    assert samples[("memory_butler_pending_intents", c)] == 0
    sample = re.compile(r'^[a-z_0-9]+\{(?:[a-z_]+="(?:[^"\\]|\\.)*",?)+\} -?[0-9.e+]+$')
    for line in body.splitlines():
        assert line.startswith("# ") or sample.match(line), line
    assert body.count("# TYPE memory_butler_backlog gauge") == 1


def test_prometheus_labels_are_escaped():
    row = {
        "tenant_id": 'a"b\\c',
        "butler": "x\ny",
        "backlog": 1,
        "oldest_pending_seconds": 1.5,
        "backlog_age_p95_seconds": 2,
        "dead_letter_episodes": 0,
        "dead_letter_intents": 0,
        "pending_intents": 0,
        "oldest_intent_seconds": 0,
    }
    body = telemetry.scrape_text(telemetry.key_families([row])).decode()
    assert 'tenant_id="a\\"b\\\\c"' in body and 'butler="x\\ny"' in body
    labels = (("butler", "x\ny"), ("tenant_id", 'a"b\\c'))
    assert _samples(body)[("memory_butler_oldest_pending_seconds", labels)] == 1.5


def test_db_connections_reads_the_server(conn):
    db = stats_mod.db_connections(conn)
    assert db["max_connections"] >= 1 and 1 <= db["connections"] <= db["max_connections"]
