"""A real prefork `celery worker` process traces what it applies (tracing set up in worker_process_init): its
spans continue the trace of the call that accepted the write, both through the wake-up's task headers and
through the context stored with the write intent. The worker writes its spans with the console exporter."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from memory_workers.enqueue import Publisher
from shared import intake, tracing
from shared.config import load_settings
from shared.db import unit_of_work
from shared.schemas import EpisodeWrite
from shared.sharding import shard_queues
from tests.polling import poll

pytestmark = pytest.mark.slow

SHARDS = 4


@pytest.fixture()
def traced_worker(database_url: str, redis_url: str, tmp_path: Path) -> Iterator[Path]:
    """One prefork worker (concurrency 1) with the console exporter; yields its output file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_BUTLER_") and k != "DATABASE_URL"}
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "MEMORY_BUTLER_WORKERS__SHARD_COUNT": str(SHARDS),
            "MEMORY_BUTLER_TRACING__EXPORTER": "console",
        }
    )
    out = tmp_path / "worker.log"
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "memory_workers.app:app",
                "worker",
                "--pool",
                "prefork",
                "--concurrency",
                "1",
                "-Q",
                ",".join(shard_queues(SHARDS)),
                "--hostname",
                f"traced-{uuid.uuid4().hex[:6]}@%h",
                "--without-mingle",
                "--without-gossip",
                "--loglevel",
                "INFO",
            ],
            env=env,
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield out
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the group of the worker this test started
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture()
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tracing.setup(load_settings().tracing, role="front", exporter=exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown()


def worker_spans(out: Path) -> list[dict[str, Any]]:
    found = []
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith("{") and '"context"' in line:
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:  # a line still being written
                continue
    return found


def test_a_prefork_worker_continues_the_accepting_calls_trace(spans, traced_worker, engine, database_url, redis_url):
    # given a write accepted inside a traced call, whose wake-up is published from that call
    settings = load_settings(database_url=database_url, redis_url=redis_url, workers={"shard_count": SHARDS})
    tenant = f"trace-{uuid.uuid4().hex[:8]}"
    publisher = Publisher(settings)
    with unit_of_work(engine) as conn:
        conn.exec_driver_sql("INSERT INTO tenants (id) VALUES (%s)", (tenant,))
    with tracing.span("accepting call", request_id="req-prefork"):
        write = EpisodeWrite(content="I live in Lisbon.", butler="general").model_dump(mode="json")
        with unit_of_work(engine) as conn:
            (accepted,) = intake.accept(
                conn,
                tenant_id=tenant,
                writes=[intake.WriteRequest("episode", "general", write, None)],
                actor="e2e",
                request_id="req-prefork",
                trace_context=tracing.current_carrier(),
            )
        publisher.wake_apply(tenant, "general")
    assert publisher.flush(10)
    publisher.close()
    finished = {s.name: s for s in spans.get_finished_spans()}
    call, publish = finished["accepting call"], finished["apply_async/memory.apply_writes"]
    trace_id, call_id = f"0x{call.context.trace_id:032x}", f"0x{call.context.span_id:016x}"
    # when the worker process has applied and consolidated it
    deadline = time.monotonic() + 120  # a fresh pool process loads the embedding model first

    def done() -> list[dict[str, Any]] | None:
        mine = [s for s in worker_spans(traced_worker) if s["context"]["trace_id"] == trace_id]
        return mine if {"run/memory.apply_writes", "run/memory.consolidate"} <= {s["name"] for s in mine} else None

    try:
        mine = poll(done, deadline_s=max(1.0, deadline - time.monotonic()), what="the worker's spans")
    except BaseException:
        print(traced_worker.read_text(errors="replace")[-4000:])
        raise
    by_name = {s["name"]: s for s in mine}
    # then its task run continues the published wake-up (W3C context in the task headers)
    assert by_name["run/memory.apply_writes"]["parent_id"] == f"0x{publish.context.span_id:016x}"
    assert by_name["run/memory.apply_writes"]["resource"]["attributes"]["service.name"] == "memory-butler-worker"
    # and the intent's span sits under the accepting call (its stored context)
    applied = by_name["memory.apply_intent"]
    assert applied["parent_id"] == call_id
    assert applied["attributes"]["memory_butler.intent_id"] == str(accepted.id)
    assert applied["attributes"]["memory_butler.request_id"] == "req-prefork"
    # and the worker's statements are traced too (psycopg, instrumented in the pool process)
    assert any(
        s["attributes"].get("db.system") == "postgresql" or s["attributes"].get("db.system.name") == "postgresql"
        for s in mine
    )
