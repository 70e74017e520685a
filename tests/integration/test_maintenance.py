"""Decay sweep, anti-pattern inversion and episode cleanup against the real database, with an explicit `now`."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from shared import maintenance, writes
from shared.config import load_settings
from tests.factories import VEC, insert_episode
from shared.lifecycle import anti_pattern_content, is_allowed

NOW = datetime(2026, 6, 1, 3, 0, tzinfo=UTC)
SETTINGS = load_settings()


def _tenant(conn) -> str:
    tenant_id = f"t-{uuid.uuid4().hex[:12]}"
    conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant_id})
    return tenant_id


def _fact(conn, tenant, *, rate=0.008, age_days=0.0, validity="active", confidence=1.0):
    fid = uuid.uuid4()
    conn.execute(
        text(
            "INSERT INTO facts (id, tenant_id, subject, predicate, content, embedding, decay_rate, confidence, validity, "
            "last_confirmed_at) VALUES (:id, :t, 'user', :p, 'x', CAST(:e AS vector), :r, :c, :v, :at)"
        ),
        {
            "id": fid,
            "t": tenant,
            "p": f"p{fid.hex[:8]}",
            "e": VEC,
            "r": rate,
            "c": confidence,
            "v": validity,
            "at": NOW - timedelta(days=age_days),
        },
    )
    return fid


def _rule(conn, tenant, content, *, harmful=0, eff=0.0, maturity="established", rate=0.0, age_days=0.0, reasons=()):
    rid = uuid.uuid4()
    conn.execute(
        text(
            "INSERT INTO rules (id, tenant_id, content, embedding, maturity, harmful_count, effectiveness_score, "
            "decay_rate, confidence, last_confirmed_at) "
            "VALUES (:id, :t, :c, CAST(:e AS vector), :m, :h, :eff, :r, 1.0, :at)"
        ),
        {
            "id": rid,
            "t": tenant,
            "c": content,
            "e": VEC,
            "m": maturity,
            "h": harmful,
            "eff": eff,
            "r": rate,
            "at": NOW - timedelta(days=age_days),
        },
    )
    for i, reason in enumerate(reasons):
        conn.execute(
            text(
                "INSERT INTO rule_applications (tenant_id, rule_id, outcome, reason, actor, occurred_at) "
                "VALUES (:t, :r, 'harmful', :why, 'test', :at)"
            ),
            {"t": tenant, "r": rid, "why": reason, "at": NOW - timedelta(days=10 - i)},
        )
    return rid


def _validity(conn, table, row_id):
    return conn.execute(text(f"SELECT validity FROM {table} WHERE id = :id"), {"id": row_id}).scalar_one()


def _events(conn, tenant, entity_id=None):
    sql = "SELECT event_type, entity_id, actor, payload FROM memory_events WHERE tenant_id = :t"
    if entity_id is not None:
        sql += " AND entity_id = :e"
    return conn.execute(text(sql + " ORDER BY id"), {"t": tenant, "e": entity_id}).all()


def _sweep_all(conn, *, now=NOW, batch=3):
    """Run batches in the caller's transaction until the short page (what decay_sweep does per transaction)."""
    for kind in ("fact", "rule"):
        after = None
        while True:
            after, summary = maintenance.decay_sweep_batch(
                conn,
                kind=kind,
                after_id=after,
                batch=batch,
                now=now,
                facts_cfg=SETTINGS.memory.facts,
                rules_cfg=SETTINGS.memory.rules,
            )
            if summary[f"{kind}s_scanned"] < batch:
                break


def test_decay_moves_each_fact_to_its_band(conn, tenant):
    # given facts whose effective confidence at NOW is high, in the fading band, or below expiry
    keep = _fact(conn, tenant, rate=0.008, age_days=10)  # 0.92
    permanent = _fact(conn, tenant, rate=0.0, age_days=5000)  # 1.0
    fade = _fact(conn, tenant, rate=0.03, age_days=60)  # 0.165
    expire = _fact(conn, tenant, rate=0.1, age_days=60)  # 0.0025
    fading_expire = _fact(conn, tenant, rate=0.1, age_days=60, validity="fading")
    fading_stay = _fact(conn, tenant, rate=0.03, age_days=60, validity="fading")
    ancient = _fact(conn, tenant, rate=10, age_days=3650)  # exp() would underflow uncapped
    superseded = _fact(conn, tenant, rate=0.1, age_days=60, validity="superseded")
    # when the sweep runs in small batches
    _sweep_all(conn)
    # then each fact is in its band and untouched states stay
    expected = {
        keep: "active",
        permanent: "active",
        fade: "fading",
        expire: "expired",
        fading_expire: "expired",
        fading_stay: "fading",
        ancient: "expired",
        superseded: "superseded",
    }
    assert {k: _validity(conn, "facts", k) for k in expected} == expected
    # and every change wrote exactly one event whose transition the lifecycle table allows
    events = _events(conn, tenant)
    assert sorted((e.entity_id, e.event_type) for e in events) == sorted(
        [(fade, "fact.fading"), (expire, "fact.expired"), (fading_expire, "fact.expired"), (ancient, "fact.expired")]
    )
    for e in events:
        assert e.actor == "decay_sweep"
        assert is_allowed("fact", e.payload["from"], e.payload["to"])
    assert {e.entity_id: e.payload["from"] for e in events}[fading_expire] == "fading"


def test_every_sweep_transition_is_allowed_by_the_lifecycle_tables():
    for machine, from_state, to_state in maintenance.SWEEP_TRANSITIONS:
        assert is_allowed(machine, from_state, to_state), (machine, from_state, to_state)


def test_confirm_brings_a_faded_fact_back_and_the_sweep_leaves_it(conn, tenant):
    # given a fact the sweep moved to fading
    fid = _fact(conn, tenant, rate=0.03, age_days=60)
    _sweep_all(conn)
    assert _validity(conn, "facts", fid) == "fading"
    # when an agent confirms it
    writes.confirm(
        conn, tenant_id=tenant, kind="fact", entity_id=fid, visibility=writes.ALL, actor=writes.Actor("agent"), now=NOW
    )
    # then it is active again and a sweep at the same time keeps it so
    assert _validity(conn, "facts", fid) == "active"
    _sweep_all(conn)
    assert _validity(conn, "facts", fid) == "active"
    # and it fades again only once its confidence decays again
    _sweep_all(conn, now=NOW + timedelta(days=60))
    assert _validity(conn, "facts", fid) == "fading"


def test_harmful_rules_are_inverted_like_the_python_function(conn, tenant):
    # given rules marked harmful with and without reasons, and rules that do not qualify
    cases = {
        _rule(
            conn,
            tenant,
            "Use tabs for indentation.",
            harmful=3,
            eff=0.1,
            reasons=["broke the linter", "  ", "reviewers complained "],
        ): ["broke the linter", "reviewers complained"],
        _rule(conn, tenant, "  API keys go in the repo..  ", harmful=4, eff=0.0, maturity="candidate"): [],
        _rule(conn, tenant, "Always deploy on Fridays", harmful=5, eff=0.2, maturity="proven", reasons=["outage"]): [
            "outage"
        ],
    }
    weak = _rule(conn, tenant, "Prefer short answers", harmful=2, eff=0.1)
    helpful = _rule(conn, tenant, "Cite sources", harmful=3, eff=0.7)
    # when the sweep runs
    _sweep_all(conn)
    # then qualifying rules became anti-patterns with the same text the Python function writes
    for rid, reasons in cases.items():
        row = conn.execute(text("SELECT content, maturity, metadata FROM rules WHERE id = :id"), {"id": rid}).one()
        original = row.metadata["original_content"]
        assert row.maturity == "anti_pattern"
        assert row.content == anti_pattern_content(original, reasons)
        [event] = _events(conn, tenant, rid)
        assert event.event_type == "rule.inverted" and event.payload["content"] == row.content
        assert is_allowed("rule", event.payload["from"], "anti_pattern")
    # and the others are untouched
    for rid in (weak, helpful):
        maturity = conn.execute(text("SELECT maturity FROM rules WHERE id = :id"), {"id": rid}).scalar_one()
        assert maturity == "established"
        assert _events(conn, tenant, rid) == []


def test_an_over_long_rule_is_inverted_within_bounds_without_failing_its_batch(conn, tenant):
    # given, in one sweep batch, a rule near the column's limit with 30 long harmful reasons, and an ordinary one
    reasons = [f"reason {i}: " + "x" * 1_980 for i in range(30)]
    long_rule = _rule(conn, tenant, "Retry " + "forever " * 2_490, harmful=30, eff=0.0, reasons=reasons)
    short_rule = _rule(conn, tenant, "Guess the user's timezone", harmful=3, eff=0.0, reasons=["wrong time"])
    # when the sweep runs (one batch holds both)
    _sweep_all(conn, batch=100)
    # then both became anti-patterns, the long one bounded, each the text the Python function writes
    rows = dict(
        conn.execute(
            text("SELECT id, content FROM rules WHERE id IN (:a, :b) AND maturity = 'anti_pattern'"),
            {"a": long_rule, "b": short_rule},
        ).all()
    )
    assert set(rows) == {long_rule, short_rule}
    original = conn.execute(
        text("SELECT metadata->>'original_content' FROM rules WHERE id = :i"), {"i": long_rule}
    ).scalar_one()
    assert len(rows[long_rule]) <= 20_000 and rows[long_rule] == anti_pattern_content(original, reasons)
    assert rows[long_rule].endswith(reasons[-1]) and reasons[0] not in rows[long_rule]  # the newest reasons kept
    assert rows[short_rule].endswith("because: wrong time")


def test_a_harmful_mark_inverts_an_over_long_rule_within_bounds(conn, tenant):
    # given a rule near the column's limit with long harmful reasons piled up while it was still helpful
    reasons = ["the build broke again " + "y" * 1_900 for _ in range(10)]  # the last one a day before NOW
    rid = _rule(conn, tenant, "Skip " + "the tests " * 1_990, harmful=10, eff=0.9, reasons=reasons)
    # when one more harmful mark tips it over
    out = writes.mark_rule(
        conn,
        tenant_id=tenant,
        rule_id=rid,
        outcome="harmful",
        reason="z" * 2_000,
        visibility=writes.ALL,
        actor=writes.Actor("agent"),
        now=NOW,
        rules=SETTINGS.memory.rules,
    )
    # then it is an anti-pattern whose text fits
    assert out["maturity"] == "anti_pattern"
    content = conn.execute(text("SELECT content FROM rules WHERE id = :i"), {"i": rid}).scalar_one()
    assert len(content) <= 20_000 and content.endswith("z" * 2_000)


def test_rules_decay_and_invert_in_one_pass(conn, tenant):
    # given a decayed rule that is also harmful, and one that is only decayed
    both = _rule(conn, tenant, "Guess the timezone", harmful=3, eff=0.0, rate=0.1, age_days=20)  # 0.135
    fading = _rule(conn, tenant, "Mention the weather", rate=0.03, age_days=60)
    # when the sweep runs
    _sweep_all(conn)
    # then both changes landed, each with its own event
    assert {e.event_type for e in _events(conn, tenant, both)} == {"rule.fading", "rule.inverted"}
    assert [e.event_type for e in _events(conn, tenant, fading)] == ["rule.fading"]
    assert _validity(conn, "rules", fading) == "fading"


def _committed_tenant_with_decayed_facts(engine, n=12):
    with engine.begin() as c:
        tenant = _tenant(c)
        ids = [_fact(c, tenant, rate=0.1 if i % 2 else 0.03, age_days=60) for i in range(n)]
        ids.append(_fact(c, tenant, rate=0.008, age_days=1))
    return tenant, ids


def test_a_second_run_changes_nothing(engine):
    # given committed decayed facts and a first sweep
    tenant, _ = _committed_tenant_with_decayed_facts(engine)
    first = maintenance.decay_sweep(engine, now=NOW, settings=SETTINGS, batch=4)
    assert first["fact.fading"] >= 6 and first["fact.expired"] >= 6
    with engine.connect() as c:
        before = len(_events(c, tenant))
    # when the sweep runs again for the same moment
    second = maintenance.decay_sweep(engine, now=NOW, settings=SETTINGS, batch=4)
    # then nothing changes and no event is written
    assert not {k for k in second if k.startswith(("fact.", "rule."))}
    with engine.connect() as c:
        assert len(_events(c, tenant)) == before == 12


def test_two_concurrent_runs_change_no_more_than_one(engine):
    # given committed decayed facts
    tenant, ids = _committed_tenant_with_decayed_facts(engine, n=40)
    barrier = threading.Barrier(2)
    results: list[dict] = []

    def run() -> None:
        barrier.wait()
        results.append(maintenance.decay_sweep(engine, now=NOW, settings=SETTINGS, batch=2))

    # when two sweeps start at once
    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # then each decayed fact changed once: one event each, none for the fresh fact
    assert len(results) == 2
    with engine.connect() as c:
        events = _events(c, tenant)
    assert sorted(e.entity_id for e in events) == sorted(ids[:-1])


def _episode(conn, tenant, *, status, age_days, expires_in_days=7.0, butler="health"):
    return insert_episode(
        conn,
        tenant,
        butler=butler,
        status=status,
        created_at=NOW - timedelta(days=age_days),
        expires_at=NOW + timedelta(days=expires_in_days),
    )


def _remaining(engine, tenant):
    with engine.connect() as c:
        return set(c.execute(text("SELECT id FROM episodes WHERE tenant_id = :t"), {"t": tenant}).scalars())


def test_cleanup_deletes_expired_then_oldest_consolidated_beyond_capacity(engine):
    settings = load_settings(memory={"episodes": {"max_entries": 8}})
    with engine.begin() as c:
        # given a tenant with 6 consolidated, 5 unconsolidated (pending, failed, dead letter) and 2 expired episodes
        tenant = _tenant(c)
        consolidated = [_episode(c, tenant, status="consolidated", age_days=10 - i) for i in range(6)]
        unconsolidated = [
            _episode(c, tenant, status=s, age_days=20)
            for s in ("pending", "pending", "pending", "failed", "dead_letter")
        ]
        expired = [_episode(c, tenant, status=s, age_days=9, expires_in_days=-1) for s in ("pending", "consolidated")]
        # and a tenant whose unconsolidated episodes alone exceed the capacity
        crowded = _tenant(c)
        crowded_ids = {_episode(c, crowded, status="pending", age_days=30) for _ in range(10)}
    # when cleanup runs
    result = maintenance.episode_cleanup(engine, now=NOW, settings=settings)
    # then expired episodes went, and the 3 oldest consolidated brought the total down to 8
    assert result["expired_deleted"] >= 2 and result["capacity_deleted"] >= 3
    assert _remaining(engine, tenant) == set(consolidated[3:]) | set(unconsolidated)
    assert _remaining(engine, tenant).isdisjoint(expired)
    # and no unexpired unconsolidated episode was deleted, even over capacity
    assert _remaining(engine, crowded) == crowded_ids
    # and one event per batch and reason, not per row
    with engine.connect() as c:
        events = _events(c, tenant)
    assert sorted((e.event_type, e.payload["reason"], e.payload["count"]) for e in events) == [
        ("episodes.cleaned", "capacity", 3),
        ("episodes.cleaned", "expired", 2),
    ]
    assert all(e.entity_id is None for e in events)
    # when cleanup runs again, nothing more goes
    again = maintenance.episode_cleanup(engine, now=NOW, settings=settings)
    assert again["expired_deleted"] == again["capacity_deleted"] == 0
    assert _remaining(engine, tenant) == set(consolidated[3:]) | set(unconsolidated)
    with engine.connect() as c:
        assert len(_events(c, tenant)) == 2


def test_cleanup_prunes_old_maintenance_runs(engine):
    # given runs from 30 days ago and from now (the table grows ~8,600 rows a day)
    tag = uuid.uuid4().hex[:8]
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO maintenance_runs (task, tick, started_at) VALUES "
                "(:t, 'old', CAST(:old AS timestamptz)), (:t, 'new', CAST(:new AS timestamptz))"
            ),
            {"t": f"test.{tag}", "old": NOW - timedelta(days=30), "new": NOW},
        )
    # when cleanup runs with the default retention (14 days)
    result = maintenance.episode_cleanup(engine, now=NOW, settings=load_settings())
    # then only the old one went
    assert result["maintenance_runs_deleted"] >= 1
    with engine.connect() as c:
        assert c.execute(text("SELECT tick FROM maintenance_runs WHERE task = :t"), {"t": f"test.{tag}"}).all() == [
            ("new",)
        ]


def test_a_tick_is_claimed_once(conn):
    # given a claimed tick
    run_id = maintenance.claim_tick(conn, task="memory.decay_sweep", tick="2026-06-01T03:00")
    assert run_id is not None
    # when it is claimed again, then the second claim gets nothing
    assert maintenance.claim_tick(conn, task="memory.decay_sweep", tick="2026-06-01T03:00") is None
    # and the finished run carries its summary
    maintenance.finish_run(conn, run_id=run_id, summary={"batches": 1})
    row = conn.execute(text("SELECT summary, finished_at FROM maintenance_runs WHERE id = :i"), {"i": run_id}).one()
    assert row.summary == {"batches": 1} and row.finished_at is not None


@pytest.mark.parametrize("kind", ["fact", "rule"])
def test_an_empty_page_ends_the_sweep(conn, kind):
    last, summary = maintenance.decay_sweep_batch(
        conn,
        kind=kind,
        after_id=uuid.UUID(int=2**128 - 1),
        batch=10,
        now=NOW,
        facts_cfg=SETTINGS.memory.facts,
        rules_cfg=SETTINGS.memory.rules,
    )
    assert last is None and summary == {f"{kind}s_scanned": 0}


def test_a_deadlocked_batch_is_run_again_and_other_errors_are_not(engine):
    class Deadlock(Exception):
        sqlstate = "40P01"

    class Other(Exception):
        sqlstate = "23505"

    calls: list[int] = []

    def step(conn):
        calls.append(1)
        if len(calls) == 1:
            raise DBAPIError("UPDATE ...", {}, Deadlock())
        return conn.execute(text("SELECT 7")).scalar_one()

    assert maintenance.in_transaction(engine, step) == 7 and len(calls) == 2
    with pytest.raises(DBAPIError):
        maintenance.in_transaction(engine, lambda conn: (_ for _ in ()).throw(DBAPIError("x", {}, Other())))


def test_a_scheduled_task_runs_once_per_tick_and_records_its_outcome(engine):
    from memory_workers.tasks import Runtime, install_runtime
    from memory_workers.tasks.maintenance import run_ticked

    install_runtime(Runtime(SETTINGS, engine, embedder=None, extractor=None))
    tick = f"test-{uuid.uuid4().hex}"
    try:
        # given a tick that ran once
        first = run_ticked("memory.test_task", None, tick, lambda rt, now: {"done": 1})
        # when the same tick is delivered again, then it is skipped
        again = run_ticked("memory.test_task", None, tick, lambda rt, now: {"done": 2})
        assert first == {"tick": tick, "done": 1}
        assert again == {"skipped": "tick already claimed", "tick": tick}

        # and a failing tick records its error before raising
        def boom(rt, now):
            raise RuntimeError("disk full")

        with pytest.raises(RuntimeError):
            run_ticked("memory.test_task", None, tick + "-2", boom)
    finally:
        install_runtime(None)
    with engine.connect() as c:
        rows = dict(
            c.execute(
                text("SELECT tick, summary FROM maintenance_runs WHERE task = 'memory.test_task' AND tick LIKE :t"),
                {"t": tick + "%"},
            ).all()
        )
    assert rows == {tick: {"done": 1}, tick + "-2": {"error": "RuntimeError: disk full"}}


def test_cleanup_forgets_feedback_keys_after_their_retention(engine):
    # given two feedback receipts, one older than the 7-day retention
    with engine.begin() as conn:
        tenant = _tenant(conn)
        for key, age in (("old", 8), ("fresh", 1)):
            conn.execute(
                text(
                    "INSERT INTO feedback_receipts (tenant_id, butler, idempotency_key, tool, entity_id, payload_hash, "
                    "created_at) VALUES (:t, 'health', :k, 'memory_confirm', :e, :h, :at)"
                ),
                {"t": tenant, "k": key, "e": uuid.uuid4(), "h": "0" * 64, "at": NOW - timedelta(days=age)},
            )
    # when the cleanup runs
    result = maintenance.episode_cleanup(engine, now=NOW, settings=load_settings())
    # then the old key is forgotten and the fresh one kept
    with engine.connect() as conn:
        kept = (
            conn.execute(text("SELECT idempotency_key FROM feedback_receipts WHERE tenant_id = :t"), {"t": tenant})
            .scalars()
            .all()
        )
    assert kept == ["fresh"] and result["feedback_receipts_deleted"] >= 1


def _intent(conn, tenant, *, status, age_days, applied_days=None, butler="health"):
    from tests.factories import next_seq

    iid = uuid.uuid4()
    conn.execute(
        text(
            "INSERT INTO write_intents (id, tenant_id, butler, seq, kind, payload, actor, status, created_at, applied_at) "
            "VALUES (:id, :t, :b, :s, 'episode', '{\"content\": \"private words\"}', 'test', :st, :c, :a)"
        ),
        {
            "id": iid,
            "t": tenant,
            "b": butler,
            "s": next_seq(conn, tenant, butler),
            "st": status,
            "c": NOW - timedelta(days=age_days),
            "a": None if applied_days is None else NOW - timedelta(days=applied_days),
        },
    )
    return iid


def test_cleanup_keeps_dead_letters_past_the_ttl_until_their_own_retention(engine):
    settings = load_settings(schedule={"dead_letters_retention_days": 30, "intents_retention_days": 3})
    with engine.begin() as c:
        # given dead-lettered episodes past their TTL, one accepted 9 days ago and one 40 days ago
        tenant = _tenant(c)
        recent_dead = _episode(c, tenant, status="dead_letter", age_days=9, expires_in_days=-2)
        old_dead = _episode(c, tenant, status="dead_letter", age_days=40, expires_in_days=-33)
        expired = _episode(c, tenant, status="consolidated", age_days=9, expires_in_days=-2)
    # when cleanup runs
    maintenance.episode_cleanup(engine, now=NOW, settings=settings)
    # then the recent dead letter waits for a redrive or a drop; the one past its own retention went
    assert _remaining(engine, tenant) == {recent_dead}
    assert old_dead not in _remaining(engine, tenant) and expired not in _remaining(engine, tenant)


def test_cleanup_deletes_write_intents_past_their_retention(engine):
    settings = load_settings(schedule={"dead_letters_retention_days": 30, "intents_retention_days": 3})
    with engine.begin() as c:
        # given applied intents (5 days and 1 day ago), dead-lettered ones (10 and 40 days old) and an old pending one
        tenant = _tenant(c)
        old_applied = _intent(c, tenant, status="applied", age_days=5, applied_days=5)
        new_applied = _intent(c, tenant, status="applied", age_days=1, applied_days=1)
        young_dead = _intent(c, tenant, status="dead_letter", age_days=10)
        old_dead = _intent(c, tenant, status="dead_letter", age_days=40)
        pending = _intent(c, tenant, status="pending", age_days=40)
    # when cleanup runs
    result = maintenance.episode_cleanup(engine, now=NOW, settings=settings)
    # then the outbox keeps only what is within its retention, and every pending intent
    with engine.connect() as c:
        left = set(c.execute(text("SELECT id FROM write_intents WHERE tenant_id = :t"), {"t": tenant}).scalars())
        events = _events(c, tenant)
    assert left == {new_applied, young_dead, pending}
    assert old_applied not in left and old_dead not in left and result["intents_deleted"] >= 2
    assert [(e.event_type, e.payload) for e in events] == [("write_intents.cleaned", {"count": 2, "dead_letters": 1})]
