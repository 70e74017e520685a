"""/metrics through the real front: prometheus_client's exposition, the tool latency histogram, the read-quality
proxies and the fleet's gauges, each shown only to whom may see it (an admin: its tenant; an operator: the fleet).

The front, the in-process worker and this test share one process, so counters are compared before and after."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine

from tests.api.conftest import Butler, Front, applied, new_tenant, new_token

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(front: Front, token: str) -> Samples:
    response = httpx.get(f"{front.base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def test_tool_latency_is_a_histogram_and_an_empty_read_is_counted(front: Front, admin: Butler) -> None:
    # given a tenant with no memories
    before = scrape(front, admin.token)
    # when it searches
    assert admin.ok("memory_search", query="anything at all")["count"] == 0
    after = scrape(front, admin.token)
    # then the call is counted by outcome and its latency lands in the histogram's buckets
    assert (
        value(after, "memory_butler_tool_calls_total", tool="memory_search", outcome="ok")
        == value(before, "memory_butler_tool_calls_total", tool="memory_search", outcome="ok") + 1
    )
    count = value(after, "memory_butler_tool_seconds_count", tool="memory_search")
    assert count == value(before, "memory_butler_tool_seconds_count", tool="memory_search") + 1
    assert value(after, "memory_butler_tool_seconds_bucket", tool="memory_search", le="+Inf") == count
    assert ("memory_butler_tool_seconds_bucket", (("le", "0.25"), ("tool", "memory_search"))) in after
    # the read returned nothing: the "share of empty reads" proxy counts it
    assert (
        value(after, "memory_butler_reads_total", tool="memory_search", result="empty")
        == value(before, "memory_butler_reads_total", tool="memory_search", result="empty") + 1
    )
    # its one candidate statement and its query embedding were timed
    assert value(after, "memory_butler_candidate_statement_seconds_count", mode="hybrid") > value(
        before, "memory_butler_candidate_statement_seconds_count", mode="hybrid"
    )
    assert value(after, "memory_butler_embedding_seconds_count", kind="query") > value(
        before, "memory_butler_embedding_seconds_count", kind="query"
    )
    # and no *_created series double the output
    assert not any(name.endswith("_created") for name in names(after))


def test_a_read_with_hits_feeds_diversity_and_confidence(worker, front: Front, health: Butler, admin: Butler) -> None:
    # given two facts about two subjects, applied by the worker
    before = scrape(front, admin.token)
    ids = [
        health.ok("memory_store_fact", subject=s, predicate="likes", content=f"{s} likes green tea")["id"]
        for s in ("user", "partner")
    ]
    for fact_id in ids:
        applied(health, "fact", fact_id)
    # when a recall finds them
    hits = [h for h in health.ok("memory_recall", topic="who likes green tea")["results"] if h["type"] == "fact"]
    assert {h["id"] for h in hits} >= set(ids)
    after = scrape(front, admin.token)
    # then the read counts as a hit, its top 10 facts' distinct subjects and their confidence are observed
    assert (
        value(after, "memory_butler_reads_total", tool="memory_recall", result="hit")
        == value(before, "memory_butler_reads_total", tool="memory_recall", result="hit") + 1
    )
    assert (
        value(after, "memory_butler_read_topk_distinct_count", tool="memory_recall", by="subject")
        == value(before, "memory_butler_read_topk_distinct_count", tool="memory_recall", by="subject") + 1
    )
    distinct = value(after, "memory_butler_read_topk_distinct_sum", tool="memory_recall", by="subject") - value(
        before, "memory_butler_read_topk_distinct_sum", tool="memory_recall", by="subject"
    )
    assert distinct == len({h["subject"] for h in hits[:10]}) >= 2
    assert value(after, "memory_butler_read_confidence_count", tool="memory_recall") - value(
        before, "memory_butler_read_confidence_count", tool="memory_recall"
    ) == len(hits[:10])
    # the writes' accept-to-applied lag was observed by the worker (in this process here)
    assert (
        value(after, "memory_butler_accept_to_applied_seconds_count", kind="fact")
        >= value(before, "memory_butler_accept_to_applied_seconds_count", kind="fact") + 2
    )
    # and the wake-ups that reached the broker are counted
    assert value(after, "memory_butler_wakeups_total", result="published") > value(
        before, "memory_butler_wakeups_total", result="published"
    )


def test_fleet_gauges_are_the_operators_and_tenant_gauges_stay_in_their_tenant(
    front: Front, health: Butler, admin: Butler, engine: Engine, tenant_a: str
) -> None:
    # given two tenants with backlog
    other = new_tenant(engine)
    Butler(front.url, new_token(engine, other, ["finance"])).ok("memory_store_episode", content="x", butler="finance")
    health.ok("memory_store_episode", content="mine", butler="health")
    operator = new_token(engine, other, ["ops"], role="operator")
    # when each scrapes
    mine, fleet = scrape(front, admin.token), scrape(front, operator)
    tenants = lambda samples: {dict(labels).get("tenant_id") for _, labels in samples} - {None}  # noqa: E731
    # then an admin sees its own tenant's keys and none of the fleet-wide gauges
    assert tenants(mine) == {tenant_a}
    fleet_only = {
        "memory_butler_queue_depth",
        "memory_butler_db_connections",
        "memory_butler_db_max_connections",
        "memory_butler_maintenance_period_seconds",
    }
    assert not names(mine) & fleet_only
    assert value(mine, "memory_butler_database_up") == 1.0
    # an operator sees every tenant, every shard queue's depth, the connections and each schedule's period
    assert {tenant_a, other} <= tenants(fleet)
    assert fleet_only <= names(fleet)
    queues = {dict(labels)["queue"] for name, labels in fleet if name == "memory_butler_queue_depth"}
    assert {"shard.0", "maintenance"} <= queues
    assert value(fleet, "memory_butler_maintenance_period_seconds", task="memory.decay_sweep") == 86400.0
    assert value(fleet, "memory_butler_maintenance_period_seconds", task="memory.consolidate_all") == 21600.0
    assert 1 <= value(fleet, "memory_butler_db_connections") <= value(fleet, "memory_butler_db_max_connections")
    assert ("memory_butler_backlog_age_p95_seconds", (("butler", "health"), ("tenant_id", tenant_a))) in fleet
