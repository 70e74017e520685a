"""One-shot CLI commands print their answer and nothing else: alembic's INFO lines (nine on a fresh database)
and other library chatter go to <data dir>/logs/cli.log. Run as a new user would: the installed command, in a
subprocess, against a brand-new database."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ANSWER = re.compile(
    r"token id  [0-9a-f-]{36}\ntenant    default\nrole      butler\nbutlers   health\nexpires   never \(until revoked\)\n"
    r"\nmb_\S+\n\n"
    r"This is the only time the token is shown; store it now\. Send it as 'Authorization: Bearer <token>'\.\n\Z"
)


def _cli(*args: str, database_url: str | None, data_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMORY_BUTLER_") and k != "DATABASE_URL"}
    env.update({"MEMORY_BUTLER_DATA_DIR": str(data_dir)})
    if database_url:
        env["DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "-m", "memory_api", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=data_dir,
    )


def test_tokens_create_prints_only_the_token_on_a_fresh_database(empty_database_url: str, tmp_path: Path):
    # when a new user's first command migrates a brand-new database and creates a token
    done = _cli(
        "tokens",
        "create",
        "--name",
        "health butler",
        "--butler",
        "health",
        database_url=empty_database_url,
        data_dir=tmp_path,
    )
    # then stdout is exactly the answer and the terminal shows nothing else
    assert done.returncode == 0, done.stderr
    assert ANSWER.match(done.stdout), done.stdout
    assert done.stderr == ""
    # and the migration's lines are in the command log, as JSON
    records = [json.loads(line) for line in (tmp_path / "logs" / "cli.log").read_text().splitlines()]
    migrations = [r for r in records if r["logger"] == "alembic.runtime.migration"]
    assert len(migrations) >= 3 and any("Running upgrade" in r["msg"] for r in migrations)


def test_db_url_prints_only_the_url_of_the_embedded_server_it_started_and_stopped(tmp_path: Path):
    # given no DATABASE_URL: the command starts the embedded server in the data dir (initdb, migrations)
    done = _cli("db-url", database_url=None, data_dir=tmp_path)
    # then it prints the URL, one line, and nothing on the terminal
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"postgresql\S+\n", done.stdout), done.stdout
    assert done.stderr == ""
    # and the server it started is stopped again
    assert not list(tmp_path.rglob("postmaster.pid"))
    assert (tmp_path / "logs" / "cli.log").is_file()


def test_a_warning_still_reaches_the_terminal(empty_database_url: str, tmp_path: Path):
    # a refused argument is the user's business: one plain line on stderr, nothing on stdout
    done = _cli(
        "tokens",
        "create",
        "--name",
        "x",
        "--butler",
        "Not A Butler!",
        database_url=empty_database_url,
        data_dir=tmp_path,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("memory-butler tokens: ") and len(done.stderr.splitlines()) == 1
    assert '"level"' not in done.stderr
