"""A real worker node (prefork pool of 2) serves its pool processes' metrics on workers.metrics_port:
prometheus_client's multiprocess mode sums the samples every pool process wrote under the node's directory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from memory_workers.enqueue import wake_apply
from shared import intake
from shared.config import load_settings
from shared.db import unit_of_work
from shared.schemas import EpisodeWrite
from shared.sharding import shard_queues
from tests.polling import poll

pytestmark = pytest.mark.slow
SHARDS = 2


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture()
def node(database_url: str, redis_url: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """One `celery worker` node with --concurrency 2 and its metrics port; stopped (its group) at the end."""
    port, metrics_dir = _free_port(), tmp_path / "worker-metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_999999.db").write_bytes(b"stale")  # a previous run's file: the node must clear it
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_BUTLER_") and k != "DATABASE_URL"}
    env.update(
        {
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "MEMORY_BUTLER_WORKERS__SHARD_COUNT": str(SHARDS),
            "MEMORY_BUTLER_WORKERS__METRICS_PORT": str(port),
            "MEMORY_BUTLER_WORKERS__METRICS_DIR": str(metrics_dir),
        }
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "memory_workers.app:app",
            "worker",
            "--concurrency",
            "2",
            "-Q",
            ",".join(shard_queues(SHARDS)),
            "--hostname",
            f"metrics-{uuid.uuid4().hex[:6]}@%h",
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
        yield f"http://127.0.0.1:{port}/metrics", metrics_dir
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the group of the node this test started
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
    try:
        body = httpx.get(url, timeout=5).text
    except httpx.HTTPError:
        return None
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def test_a_worker_node_serves_the_summed_metrics_of_its_pool_processes(node, database_url: str, redis_url: str):
    url, metrics_dir = node
    # given the node answers on its port (before any task ran) and cleared the previous run's files
    poll(lambda: _samples(url) is not None, deadline_s=120, what="the worker node's metrics port")
    assert not (metrics_dir / "counter_999999.db").exists()
    # when episodes for several shard keys are accepted and their workers woken
    settings = load_settings(database_url=database_url, redis_url=redis_url, workers={"shard_count": SHARDS})
    engine = create_engine(database_url)
    tenant = f"wm-{uuid.uuid4().hex[:10]}"
    butlers = ("general", "health", "travel", "finance")
    with unit_of_work(engine) as conn:
        conn.execute(text("INSERT INTO tenants (id) VALUES (:t)"), {"t": tenant})
        for butler in butlers:
            writes = [
                intake.WriteRequest(
                    "episode",
                    butler,
                    EpisodeWrite(content=f"I live in City{n}.", butler=butler).model_dump(mode="json"),
                    None,
                )
                for n in range(3)
            ]
            intake.accept(conn, tenant_id=tenant, writes=writes, actor="test", request_id=None)
    for butler in butlers:
        wake_apply(tenant, butler, settings=settings)

    # then the node's one endpoint shows every apply's lag, and the consolidation batches and extractor calls
    def done() -> dict | None:
        samples = _samples(url) or {}
        applied = samples.get(("memory_butler_accept_to_applied_seconds_count", (("kind", "episode"),)), 0)
        batches = sum(
            v for (name, _), v in samples.items() if name == "memory_butler_consolidation_batch_seconds_count"
        )
        return samples if applied >= 12 and batches >= len(butlers) else None

    samples = poll(done, deadline_s=180, what="12 applies and a consolidation batch per key in the node's metrics")
    assert samples[("memory_butler_accept_to_applied_seconds_bucket", (("kind", "episode"), ("le", "+Inf")))] == 12
    assert any(
        name == "memory_butler_extractor_seconds_count" and dict(labels)["extractor"] == "heuristic"
        for name, labels in samples
    )
    assert samples.get(("memory_butler_embedding_seconds_count", (("kind", "batch"),)), 0) >= 1
    # the samples come from both pool processes' files (each loaded its model: a warm-up embedding each), summed
    # on the one endpoint, with no tenant label anywhere
    assert len(list(metrics_dir.glob("histogram_*.db"))) >= 2
    assert not any("tenant_id" in dict(labels) for _, labels in samples)
    engine.dispose()
