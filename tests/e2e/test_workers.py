"""Real `celery worker` processes on shared shard queues: exactly-once effects, per-key order, crash recovery.

Workers run as subprocesses against the test database and the test Redis. Nothing here sleeps to wait: every
wait polls a condition in Postgres with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.polling import poll
from sqlalchemy import text

from memory_workers.enqueue import Publisher
from shared import intake
from shared.config import Settings, load_settings
from shared.db import unit_of_work
from shared.schemas import EpisodeWrite
from shared.sharding import shard_queues

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SHARDS = 4
BUTLERS = ("general", "health", "travel")
SENTENCES = (
    "My name is Person{n}.",
    "I live in City{n}.",
    "Always confirm booking {n} before paying.",
    "We talked about project {n} for a while.",
    "I am allergic to pollen{n}.",
    "The weather was fine on day {n}.",
)


def scalar(engine: Any, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


class Workers:
    """Worker subprocesses started by this test (and only those are ever signalled)."""

    def __init__(self, database_url: str, redis_url: str, log_dir: Path, extra_env: dict[str, str]) -> None:
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_BUTLER_") and k != "DATABASE_URL"}
        self.env.update(
            {
                "DATABASE_URL": database_url,
                "REDIS_URL": redis_url,
                "MEMORY_BUTLER_WORKERS__SHARD_COUNT": str(SHARDS),
                **extra_env,
            }
        )
        self.log_dir, self.procs = log_dir, []

    def start(self, count: int) -> None:
        for n in range(count):
            log = open(self.log_dir / f"worker{n}.log", "wb")  # noqa: SIM115 - closed with the process
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "memory_workers.app:app",
                        "worker",
                        "--concurrency",
                        "1",
                        "-Q",
                        ",".join(shard_queues(SHARDS)),
                        "--hostname",
                        f"e2e{n}-{uuid.uuid4().hex[:6]}@%h",
                        "--without-mingle",
                        "--without-gossip",
                        "--loglevel",
                        "INFO",
                    ],
                    env=self.env,
                    cwd=self.log_dir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def descendants(self) -> set[int]:
        pids = set()
        for proc in self.procs:
            try:
                pids |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
            except psutil.NoSuchProcess:
                continue
        return pids

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # the group of a worker this test started
        deadline = time.monotonic() + 15
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.log_dir.glob("worker*.log")))


@pytest.fixture()
def workers(database_url: str, redis_url: str, tmp_path: Path) -> Iterator[Callable[..., Workers]]:
    started: list[Workers] = []

    def start(count: int, **extra_env: str) -> Workers:
        pool = Workers(database_url, redis_url, tmp_path, extra_env)
        started.append(pool)
        pool.start(count)
        return pool

    yield start
    for pool in started:
        pool.stop()


def settings_for(database_url: str, redis_url: str) -> Settings:
    return load_settings(database_url=database_url, redis_url=redis_url, workers={"shard_count": SHARDS})


def new_tenants(engine: Any, count: int) -> list[str]:
    tenants = [f"e2e-{uuid.uuid4().hex[:10]}" for _ in range(count)]
    with unit_of_work(engine) as conn:
        conn.execute(text("INSERT INTO tenants (id) SELECT unnest(CAST(:t AS text[]))"), {"t": tenants})
    return tenants


def accept(engine: Any, tenant_id: str, butler: str, contents: Sequence[str]) -> None:
    requests = [
        intake.WriteRequest("episode", butler, EpisodeWrite(content=c, butler=butler).model_dump(mode="json"), None)
        for c in contents
    ]
    with unit_of_work(engine) as conn:
        intake.accept(conn, tenant_id=tenant_id, writes=requests, actor="e2e", request_id=None)


def test_2000_episodes_on_4_workers_are_applied_and_consolidated_once_in_order(
    engine, database_url, redis_url, workers
):
    pool = workers(4)
    settings = settings_for(database_url, redis_url)
    tenants = new_tenants(engine, 10)
    keys = [(t, b) for t in tenants for b in BUTLERS]
    publisher = Publisher(settings)
    for burst in range(100):  # 100 requests of 20 episodes, round-robin over the 30 keys
        tenant_id, butler = keys[burst % len(keys)]
        accept(
            engine,
            tenant_id,
            butler,
            [SENTENCES[(burst + n) % len(SENTENCES)].format(n=f"{burst}x{n}") for n in range(20)],
        )
        publisher.wake_apply(tenant_id, butler)  # after commit, never waiting on Redis
    assert publisher.flush(10)
    publisher.close()

    mine = {"ts": tenants}
    try:
        poll(
            lambda: scalar(
                engine,
                "SELECT count(*) FROM episodes WHERE tenant_id = ANY(:ts) AND consolidation_status = 'consolidated'",
                **mine,
            )
            == 2000,
            deadline_s=150,
            what="2,000 episodes applied and consolidated",
        )
    except BaseException:
        print(pool.logs())
        raise

    assert (
        scalar(engine, "SELECT count(*) FROM write_intents WHERE tenant_id = ANY(:ts) AND status = 'applied'", **mine)
        == 2000
    )
    # exactly once: one stored and one consolidated event per episode
    for event in ("episode.stored", "episode.consolidated"):
        assert (
            scalar(
                engine,
                "SELECT count(*) FROM (SELECT entity_id FROM memory_events WHERE tenant_id = ANY(:ts) "
                "AND event_type = :e GROUP BY entity_id HAVING count(*) = 1) x",
                e=event,
                **mine,
            )
            == 2000
        )
    # applied in seq order within each key
    assert (
        scalar(
            engine,
            """
        SELECT count(*) FROM (
            SELECT (payload->>'seq')::bigint AS seq, lag((payload->>'seq')::bigint)
                   OVER (PARTITION BY tenant_id, payload->>'butler' ORDER BY id) AS previous
            FROM memory_events WHERE tenant_id = ANY(:ts) AND event_type = 'episode.stored') x
        WHERE seq < previous""",
            **mine,
        )
        == 0
    )
    # consolidated in seq order: each key's runs cover disjoint, increasing seq ranges and every episode once
    assert (
        scalar(
            engine,
            """
        SELECT count(*) FROM (
            SELECT first_seq, lag(last_seq) OVER (PARTITION BY tenant_id, butler ORDER BY started_at) AS previous
            FROM consolidation_runs WHERE tenant_id = ANY(:ts)) x
        WHERE first_seq <= previous""",
            **mine,
        )
        == 0
    )
    assert (
        scalar(engine, "SELECT sum(episode_count) FROM consolidation_runs WHERE tenant_id = ANY(:ts)", **mine) == 2000
    )
    # no two runs of one key overlap in time
    assert (
        scalar(
            engine,
            """
        SELECT count(*) FROM consolidation_runs a JOIN consolidation_runs b
          ON a.tenant_id = b.tenant_id AND a.butler = b.butler AND a.id < b.id
        WHERE tstzrange(a.started_at, a.finished_at, '[]') && tstzrange(b.started_at, b.finished_at, '[]')
          AND a.tenant_id = ANY(:ts)""",
            **mine,
        )
        == 0
    )
    assert (
        scalar(engine, "SELECT count(DISTINCT worker) FROM consolidation_runs WHERE tenant_id = ANY(:ts)", **mine) > 1
    )


def test_a_worker_killed_mid_batch_loses_nothing_and_duplicates_nothing(
    engine, database_url, redis_url, workers, tmp_path
):
    state = tmp_path / "extractor"
    state.mkdir()
    (state / "armed").touch()
    command = [sys.executable, str(ROOT / "tests" / "fixtures" / "crash_extractor_cmd.py"), str(state)]
    pool = workers(
        2,
        MEMORY_BUTLER_CONSOLIDATION__EXTRACTOR="command",
        MEMORY_BUTLER_CONSOLIDATION__COMMAND=json.dumps(command),
        MEMORY_BUTLER_CONSOLIDATION__BATCH_SIZE="10",
    )
    [tenant_id] = new_tenants(engine, 1)
    accept(engine, tenant_id, "general", [f"Note {n}" + (" CRASH-ME" if n == 4 else "") for n in range(30)])
    publisher = Publisher(settings_for(database_url, redis_url))
    publisher.wake_apply(tenant_id, "general")
    assert publisher.flush(10)
    publisher.close()

    victim_file = state / "victim.json"
    try:
        poll(victim_file.exists, deadline_s=90, what="a consolidation batch to reach the hanging extractor")
    except BaseException:
        print(pool.logs())
        raise
    victim = json.loads(victim_file.read_text())
    assert victim["worker_pid"] in pool.descendants()  # a pool process of a worker this test started
    in_flight = [uuid.UUID(e) for e in victim["episodes"]]
    assert scalar(
        engine, "SELECT count(*) FROM episodes WHERE id = ANY(:ids) AND consolidation_status = 'pending'", ids=in_flight
    ) == len(in_flight)
    os.kill(victim["pid"], signal.SIGKILL)  # the hanging extractor
    os.kill(victim["worker_pid"], signal.SIGKILL)  # the worker process in the middle of the batch

    try:
        poll(
            lambda: scalar(
                engine,
                "SELECT count(*) FROM episodes WHERE tenant_id = :t AND consolidation_status = 'consolidated'",
                t=tenant_id,
            )
            == 30,
            deadline_s=90,
            what="the redelivered batch and the rest to be consolidated",
        )
    except BaseException:
        print(pool.logs())
        raise

    def count(sql: str) -> int:
        return scalar(engine, sql, t=tenant_id)

    assert count("SELECT count(*) FROM facts WHERE tenant_id = :t") == 30
    assert count("SELECT count(DISTINCT predicate) FROM facts WHERE tenant_id = :t") == 30
    assert count("SELECT count(*) FROM rules WHERE tenant_id = :t") == 30
    assert count("SELECT count(DISTINCT content) FROM rules WHERE tenant_id = :t") == 30
    assert count("SELECT count(*) FROM memory_links WHERE tenant_id = :t") == 90  # derived_from x2, supports x1
    assert count("SELECT sum(episode_count) FROM consolidation_runs WHERE tenant_id = :t") == 30
    assert (
        count("SELECT count(*) FROM memory_events WHERE tenant_id = :t AND event_type = 'episode.consolidated'") == 30
    )
