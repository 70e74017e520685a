"""Prometheus metrics: the one module that imports prometheus_client (tracing lives in shared/tracing.py).

Two kinds of numbers:
- Process metrics, observed as things happen (a counter or histogram observe per call, nothing more on the hot
  path): tool calls and latency, the candidate statement, embeddings, read-quality proxies and wake-ups on the
  fronts; accept-to-applied lag, consolidation batches and the extractor on the workers. None carries a tenant.
- Scrape-time gauges read from Postgres and Redis by the front's /metrics (backlog, dead letters, maintenance
  runs, queue depth, connections): built per scrape by :func:`scrape_text` from rows the caller may see.

Workers run in Celery's prefork pool, so their metrics use prometheus_client's multiprocess mode: every pool
process writes its samples to files under one directory per worker node, and the node's main process serves
them, summed, on one port (:func:`serve_worker_metrics`). One scrape target per worker node whatever its
concurrency, and counters survive a pool process being replaced (docs/operations.md, "Metrics").
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _prepare_multiprocess(directory: Path) -> None:
    """Empty ``directory`` of old samples and point prometheus_client at it: before anything records a sample."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*.db"):  # only prometheus_client's files: the directory may be shared with others
        old.unlink()
    os.environ[MULTIPROC_ENV] = str(directory)  # read by prometheus_client when it picks its value class


def enable_multiprocess(directory: Path) -> None:
    """Make this process (and the pool processes it forks) write samples under ``directory`` (emptied first).

    Called from the worker node's main process before the pool starts (celeryd_init), i.e. before any task
    module has created a metric value.
    """
    _prepare_multiprocess(directory)
    from prometheus_client import values

    values.ValueClass = values.get_value_class()


# Imported after the helpers above on purpose: nothing at import time records a sample, so a worker's
# enable_multiprocess() still takes effect if this module was imported first.
from prometheus_client import (  # noqa: E402
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # noqa: E402
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4  # noqa: E402
from prometheus_client.registry import REGISTRY, Collector  # noqa: E402

disable_created_metrics()  # no *_created series: they double the output and no rule here uses them

# What generate_latest writes (classic names, no UTF-8 escaping), which every Prometheus 2.x and 3.x parses.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
# Tool calls take 5-500 ms (seed 001 §9.1: memory_context p95 <= 250 ms, memory_search <= 350 ms): fine
# buckets around the SLO bounds, coarse ones for the degraded tail (reads give up at their deadline).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.5, 0.75, 1.0, 2.5, 5.0)
# Worker-side durations span milliseconds (an apply) to minutes (an LLM extraction or a long lag).
WORK_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
TOP_K = 10
DIVERSITY_BUCKETS = tuple(float(n) for n in range(TOP_K + 1))
CONFIDENCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)

TOOL_CALLS = Counter(
    "memory_butler_tool_calls", "Tool calls by tool and outcome (ok, degraded or the error class).", ["tool", "outcome"]
)
TOOL_SECONDS = Histogram(
    "memory_butler_tool_seconds",
    "Time serving a tool call (calls refused before running are only counted).",
    ["tool"],
    buckets=LATENCY_BUCKETS,
)
CANDIDATE_SECONDS = Histogram(
    "memory_butler_candidate_statement_seconds",
    "The read path's candidate statement (one round trip per read), by query mode.",
    ["mode"],
    buckets=LATENCY_BUCKETS,
)
EMBED_SECONDS = Histogram(
    "memory_butler_embedding_seconds",
    "Embedding time: one query (front) or a batch (worker).",
    ["kind"],
    buckets=LATENCY_BUCKETS + (10.0, 30.0),
)
READS = Counter(
    "memory_butler_reads",
    "Reads by tool and whether they returned anything (result: hit or empty).",
    ["tool", "result"],
)
TOPK_DISTINCT = Histogram(
    "memory_butler_read_topk_distinct",
    f"Distinct subjects among a read's top {TOP_K} facts (by=subject) or sessions among its top {TOP_K} "
    "episodes (by=session).",
    ["tool", "by"],
    buckets=DIVERSITY_BUCKETS,
)
READ_CONFIDENCE = Histogram(
    "memory_butler_read_confidence",
    "Effective confidence of the facts a read returned.",
    ["tool"],
    buckets=CONFIDENCE_BUCKETS,
)
WAKEUPS = Counter("memory_butler_wakeups", "Broker wake-ups of this front's publisher by result.", ["result"])
APPLY_LAG = Histogram(
    "memory_butler_accept_to_applied_seconds",
    "From a write's acceptance (outbox row) to its apply by a worker.",
    ["kind"],
    buckets=WORK_BUCKETS,
)
CONSOLIDATION_SECONDS = Histogram(
    "memory_butler_consolidation_batch_seconds",
    "One consolidation batch, by outcome (consolidated, failed, dead_letter, ...).",
    ["outcome"],
    buckets=WORK_BUCKETS,
)
EXTRACTOR_SECONDS = Histogram(
    "memory_butler_extractor_seconds",
    "One extractor call, by extractor and outcome.",
    ["extractor", "outcome"],
    buckets=WORK_BUCKETS,
)


def observe_tool(tool: str, outcome: str, seconds: float | None) -> None:
    """One tool call: its outcome and its latency (None: refused before it ran, counted only)."""
    TOOL_CALLS.labels(tool, outcome).inc()
    if seconds is not None:
        TOOL_SECONDS.labels(tool).observe(seconds)


def observe_read(tool: str, hits: Sequence[Any]) -> None:
    """Seed 001 §9.2's retrieval-quality proxies for one read's ranked hits (shared.schemas.Hit): empty or not,
    distinct subjects among its top 10 facts and sessions among its top 10 episodes, the facts' confidence."""
    READS.labels(tool, "hit" if hits else "empty").inc()
    if not hits:
        return
    facts = [h for h in hits if h.type == "fact"][:TOP_K]  # each in rank order: the top 10 of each kind
    episodes = [h for h in hits if h.type == "episode"][:TOP_K]
    if facts:
        TOPK_DISTINCT.labels(tool, "subject").observe(len({h.subject for h in facts}))
        confidence = READ_CONFIDENCE.labels(tool)  # one label lookup for the ten observations
        for h in facts:
            if h.effective_confidence is not None:
                confidence.observe(h.effective_confidence)
    if episodes:
        TOPK_DISTINCT.labels(tool, "session").observe(len({h.session_id or h.id for h in episodes}))


def process_text() -> bytes:
    """This process's own metrics (the default registry: ours plus process and GC collectors)."""
    return generate_latest(REGISTRY)


# --- scrape-time gauges -----------------------------------------------------------------------------------

# (metric, help, [(row field, extra label, value)]) for the per-shard-key rows of shared.stats.gauges
KEY_GAUGES: tuple[tuple[str, str, tuple[tuple[str, tuple[tuple[str, str], ...]], ...]], ...] = (
    ("memory_butler_backlog", "Unconsolidated (pending + failed) episodes per shard key.", (("backlog", ()),)),
    (
        "memory_butler_oldest_pending_seconds",
        "Age of the oldest pending episode (0 when none).",
        (("oldest_pending_seconds", ()),),
    ),
    (
        "memory_butler_backlog_age_p95_seconds",
        "95th percentile age of the unconsolidated episodes (0 when none).",
        (("backlog_age_p95_seconds", ()),),
    ),
    (
        "memory_butler_dead_letters",
        "Dead-lettered episodes and write intents.",
        (("dead_letter_episodes", (("kind", "episode"),)), ("dead_letter_intents", (("kind", "write_intent"),))),
    ),
    ("memory_butler_pending_intents", "Accepted writes not applied yet.", (("pending_intents", ()),)),
    (
        "memory_butler_oldest_pending_intent_seconds",
        "Age of the oldest pending write intent (0 when none).",
        (("oldest_intent_seconds", ()),),
    ),
)


class _Snapshot(Collector):
    """Gauges already read for one scrape, as metric families."""

    def __init__(self, families: list[GaugeMetricFamily]) -> None:
        self.families = families

    def collect(self) -> Iterable[GaugeMetricFamily]:
        return self.families


def _family(name: str, help_text: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, labels=list(labels))


def key_families(rows: Iterable[Mapping[str, Any]]) -> list[GaugeMetricFamily]:
    """Per-shard-key gauges, labelled tenant_id and butler (the caller already filtered the rows it may see)."""
    rows = list(rows)
    out = []
    for name, help_text, series in KEY_GAUGES:
        extra = [label for label, _ in series[0][1]]
        family = _family(name, help_text, ["tenant_id", "butler", *extra])
        for row in rows:
            for field, labels in series:
                family.add_metric([row["tenant_id"], row["butler"], *(v for _, v in labels)], float(row[field]))
        out.append(family)
    return out


def maintenance_families(
    runs: Mapping[str, Mapping[str, Any]], periods: Mapping[str, float]
) -> list[GaugeMetricFamily]:
    """Fleet-wide maintenance gauges: each task's newest start and finish, its newest success, its period."""
    started = _family(
        "memory_butler_maintenance_last_started_seconds", "Start of the newest run of each task (Unix time).", ["task"]
    )
    finished = _family(
        "memory_butler_maintenance_last_finished_seconds",
        "End of the newest run of each task (Unix time; 0 while it runs or if it died).",
        ["task"],
    )
    success = _family(
        "memory_butler_maintenance_last_success_seconds",
        "End of the newest run of each task that finished (Unix time).",
        ["task"],
    )
    period = _family(
        "memory_butler_maintenance_period_seconds",
        "The longest gap between two scheduled runs of each task (from its cron or interval).",
        ["task"],
    )
    for task, run in sorted(runs.items()):
        started.add_metric([task], run["started_at"])
        finished.add_metric([task], run["finished_at"] or 0.0)
        if run.get("succeeded_at"):
            success.add_metric([task], run["succeeded_at"])
    for task, seconds in sorted(periods.items()):
        period.add_metric([task], seconds)
    return [started, finished, success, period]


def fleet_families(
    *, queue_depths: Mapping[str, int] | None, db: Mapping[str, float] | None
) -> list[GaugeMetricFamily]:
    """Operator-only gauges without a tenant: messages waiting per queue, database connections."""
    out = []
    if queue_depths is not None:
        depth = _family(
            "memory_butler_queue_depth", "Messages waiting in each Celery queue (Redis list length).", ["queue"]
        )
        for queue, n in sorted(queue_depths.items()):
            depth.add_metric([queue], n)
        out.append(depth)
    if db is not None:
        used = _family("memory_butler_db_connections", "Backends connected to the database server.", [])
        used.add_metric([], db["connections"])
        limit = _family("memory_butler_db_max_connections", "The server's max_connections.", [])
        limit.add_metric([], db["max_connections"])
        out += [used, limit]
    return out


def front_families(*, database_up: bool, pool_checked_out: int | None) -> list[GaugeMetricFamily]:
    """This front's view of its database: reachable, and connections it holds now."""
    up = _family("memory_butler_database_up", "1 when this front's database answered the gauges query.", [])
    up.add_metric([], 1.0 if database_up else 0.0)
    out = [up]
    if pool_checked_out is not None:
        held = _family("memory_butler_db_pool_checked_out", "Connections this front's pool has checked out.", [])
        held.add_metric([], pool_checked_out)
        out.append(held)
    return out


def query_batcher_families(*, batches: int, texts: int) -> list[Any]:
    """The front's query micro-batcher: model calls and the texts they embedded (texts / batches = mean batch)."""
    calls = CounterMetricFamily(
        "memory_butler_query_embedding_batches", "Model calls of this front's query embedding thread."
    )
    calls.add_metric([], batches)
    embedded = CounterMetricFamily(
        "memory_butler_query_embedding_texts",
        "Query texts those calls embedded (cache hits and identical texts excluded).",
    )
    embedded.add_metric([], texts)
    return [calls, embedded]


def replica_families(statuses: Sequence[Any]) -> list[GaugeMetricFamily]:
    """Each read replica as this front last checked it (shared.replicas.ReplicaStatus); none without replicas."""
    if not statuses:
        return []
    up = _family(
        "memory_butler_replica_up", "1 when the replica answered as a streaming replica at its last check.", ["replica"]
    )
    lag = _family(
        "memory_butler_replica_lag_seconds",
        "How long the primary has held WAL the replica has not replayed (measured by this front).",
        ["replica"],
    )
    for s in statuses:
        up.add_metric([s.label], 1.0 if s.up else 0.0)
        if s.lag_s is not None:
            lag.add_metric([s.label], round(s.lag_s, 3))
    return [up, lag]


def scrape_text(families: Iterable[GaugeMetricFamily]) -> bytes:
    """Scrape-time gauges in the text exposition format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(list(families)))
    return generate_latest(registry)


# --- worker nodes -----------------------------------------------------------------------------------------


def serve_worker_metrics(*, host: str, port: int, directory: Path) -> Any:
    """Serve every pool process's samples under ``directory``, summed, on ``host:port`` (a daemon thread)."""
    from prometheus_client import multiprocess, start_http_server

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(directory))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server


def process_exited(pid: int) -> None:
    """A pool process ended: drop its live-gauge files (counters and histograms keep their totals)."""
    from prometheus_client import multiprocess

    if os.environ.get(MULTIPROC_ENV):
        multiprocess.mark_process_dead(pid)
