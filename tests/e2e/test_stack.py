"""`memory-butler up / status / down` as a newcomer runs them: the embedded PostgreSQL+pgvector and the real Redis."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import redis as redis_lib
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import make_url

from memory_api.cli import stack
from shared import db
from shared.config import load_settings
from tests.polling import poll

pytestmark = pytest.mark.slow

# Its own Redis database (the stack's beat schedule must not meet the other tests'), emptied before and after.
REDIS_URL = "redis://127.0.0.1:6379/12"
START_DEADLINE_S = 120  # the first start runs initdb and the migrations
COMMAND_TIMEOUT_S = 60


@pytest.fixture(autouse=True, scope="module")
def _stack_redis() -> Iterator[None]:
    client = redis_lib.Redis.from_url(REDIS_URL)
    client.flushdb()
    yield
    client.flushdb()
    client.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _env() -> dict[str, str]:
    """The caller's environment minus any configuration, plus the test Redis: `up` embeds PostgreSQL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_BUTLER_") and k != "DATABASE_URL"}
    env["REDIS_URL"] = REDIS_URL
    return env


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "memory_api", *args],
        env=_env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _alembic_head(url: str) -> str:
    return ScriptDirectory.from_config(db.alembic_config(url)).get_current_head()


def test_up_runs_the_stack_and_down_leaves_nothing_behind(tmp_path):
    # given `up` on a fresh data dir, the test Redis, and free ports for the front and Flower
    data_dir = tmp_path / "butler"
    log_path = tmp_path / "up.log"
    cmd = [
        sys.executable,
        "-m",
        "memory_api",
        "up",
        "--data-dir",
        str(data_dir),
        "--port",
        str(_free_port()),
        "--flower-port",
        str(_free_port()),
    ]
    # (and a free port for the worker's metrics: the default 9151 may be taken on a shared machine)
    worker_metrics = _free_port()
    env = {**_env(), "MEMORY_BUTLER_WORKERS__METRICS_PORT": str(worker_metrics)}
    with open(log_path, "w") as log:
        up = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        # when status reports the stack healthy
        def healthy() -> dict | None:
            assert up.poll() is None, f"`up` exited early:\n{log_path.read_text()[-4000:]}"
            result = _cli("status", "--json", "--data-dir", str(data_dir), cwd=tmp_path)
            return json.loads(result.stdout) if result.returncode == 0 else None

        report = poll(healthy, deadline_s=START_DEADLINE_S, what="`status` to report the stack healthy")
        assert report["postgres"]["embedded"] and report["redis"]["ping"]
        # then the front and the worker's metrics answer at once (a client may connect as soon as it is running)
        front = report["parts"]["front"]["url"].rsplit("/mcp", 1)[0]
        assert httpx.get(f"{front}/healthz", timeout=5).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{worker_metrics}/metrics", timeout=5).status_code == 200

        # then the embedded database has pgvector and the schema at head
        url = _cli("db-url", "--data-dir", str(data_dir), cwd=tmp_path).stdout.strip()
        assert make_url(url).render_as_string(hide_password=True) == report["postgres"]["url"]
        assert db.current_revision(url) == _alembic_head(url)
        engine = db.make_engine(url, pool_size=1)
        with engine.connect() as conn:
            vector = conn.execute(text("SELECT extversion FROM pg_extension WHERE extname = 'vector'")).scalar()
        engine.dispose()
        assert vector
        # and Redis answers, and the summary shows the dev token that was saved
        assert redis_lib.Redis.from_url(REDIS_URL, socket_timeout=5).ping()
        assert (data_dir / "dev-token").read_text().strip() in log_path.read_text()
        # and where the front's and the worker's metrics are
        assert f"http://127.0.0.1:{worker_metrics}/metrics" in log_path.read_text()

        postmaster = int((data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()[0])
        recorded = {c["pid"] for c in report["components"] if c["pid"]}

        # when the stack is taken down
        down = _cli("down", "--data-dir", str(data_dir), cwd=tmp_path)
        assert down.returncode == 0, down.stderr

        # then `up` exits cleanly and no process it started is left
        assert up.wait(timeout=COMMAND_TIMEOUT_S) == 0
        leftovers = [pid for pid in {up.pid, postmaster, *recorded} if not _gone(pid)]
        assert leftovers == [], f"still running: {leftovers}"
        assert not (data_dir / "stack.json").exists()
        assert _cli("status", "--data-dir", str(data_dir), cwd=tmp_path).returncode == 3
    finally:
        if up.poll() is None:
            _cli("down", "--data-dir", str(data_dir), cwd=tmp_path)
            up.kill()
            up.wait(timeout=COMMAND_TIMEOUT_S)


def test_up_starts_its_own_redis_when_none_answers_and_stops_it(tmp_path, monkeypatch):
    # given no Redis on the "local" port (a free one stands in for 6379) and no REDIS_URL
    port = _free_port()
    monkeypatch.setattr(stack, "LOCAL_REDIS_PORT", port)
    monkeypatch.setattr(stack, "LOCAL_REDIS_URL", f"redis://127.0.0.1:{port}/0")
    settings = load_settings(data_dir=tmp_path, redis_url=None, database_url=None)
    runner = stack.Stack(settings, {})
    runner.log_dir.mkdir(parents=True)
    try:
        # when the stack brings up Redis
        url = runner._start_redis()  # noqa: SLF001 - the Redis step alone, without PostgreSQL
        # then it answers, persists to an append-only file in the data dir, and is recorded
        assert redis_lib.Redis.from_url(url, socket_timeout=5).ping()
        redis_lib.Redis.from_url(url).set("k", "v")
        assert poll(lambda: list((tmp_path / "redis").rglob("*.aof*")), deadline_s=10, what="an AOF file")
        pid = runner.record["redis"]["pid"]
        assert pid == runner.redis.pid and runner.record["redis_url"] == url
    finally:
        # and stopping the stack stops it
        runner.stop()
    assert _gone(pid)
