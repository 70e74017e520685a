"""shared.telemetry's read-quality proxies and scrape-time gauges, on plain values."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from prometheus_client.parser import text_string_to_metric_families

from shared import telemetry
from shared.schemas import Hit

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def _hit(kind: str, *, subject: str | None = None, session: uuid.UUID | None = None, conf: float | None = None) -> Hit:
    return Hit(
        type=kind,
        id=uuid.uuid4(),
        content="c",
        score=1.0,
        relevance=1.0,
        created_at=NOW,
        importance=0.5,
        subject=subject,
        session_id=session,
        effective_confidence=conf,
    )


def _value(name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(telemetry.process_text().decode()):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def test_diversity_counts_distinct_subjects_and_sessions_in_the_top_10_of_each_kind():
    tool = f"t-{uuid.uuid4().hex[:6]}"  # a tool name of its own: the registry is process-wide
    session = uuid.uuid4()
    # given 12 facts about 2 subjects, the 11th and 12th about a third; 3 episodes in 2 sessions
    hits = [_hit("fact", subject="user" if n % 2 else "partner", conf=0.9) for n in range(10)]
    hits += [_hit("fact", subject="dog", conf=0.9), _hit("fact", subject="dog", conf=0.9)]
    hits += [_hit("episode", session=session), _hit("episode", session=session), _hit("episode")]
    # when the read is observed
    telemetry.observe_read(tool, hits)
    # then the top 10 facts name 2 subjects, the episodes 2 sessions (one without a session counts alone)
    assert _value("memory_butler_read_topk_distinct_sum", tool=tool, by="subject") == 2
    assert _value("memory_butler_read_topk_distinct_sum", tool=tool, by="session") == 2
    assert _value("memory_butler_read_confidence_count", tool=tool) == 10
    assert _value("memory_butler_read_confidence_bucket", tool=tool, le="0.9") == 10
    assert _value("memory_butler_reads_total", tool=tool, result="hit") == 1


def test_an_empty_read_is_counted_and_observes_nothing_else():
    tool = f"t-{uuid.uuid4().hex[:6]}"
    telemetry.observe_read(tool, [])
    assert _value("memory_butler_reads_total", tool=tool, result="empty") == 1
    assert _value("memory_butler_read_topk_distinct_count", tool=tool, by="subject") == 0


def test_a_refused_call_is_counted_but_not_timed():
    tool = f"t-{uuid.uuid4().hex[:6]}"
    telemetry.observe_tool(tool, "invalid_input", None)
    telemetry.observe_tool(tool, "ok", 0.03)
    assert _value("memory_butler_tool_calls_total", tool=tool, outcome="invalid_input") == 1
    assert _value("memory_butler_tool_seconds_count", tool=tool) == 1
    assert _value("memory_butler_tool_seconds_bucket", tool=tool, le="0.025") == 0
    assert _value("memory_butler_tool_seconds_bucket", tool=tool, le="0.05") == 1


def test_fleet_gauges_render_queue_depths_and_connections():
    body = telemetry.scrape_text(
        telemetry.fleet_families(
            queue_depths={"shard.0": 3, "maintenance": 0}, db={"connections": 12, "max_connections": 100}
        )
    ).decode()
    assert 'memory_butler_queue_depth{queue="shard.0"} 3.0' in body
    assert "memory_butler_db_connections 12.0" in body and "memory_butler_db_max_connections 100.0" in body
