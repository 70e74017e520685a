"""`memory-butler loadtest burst` and small versions of its fault drills, on a real stack started for this module.

One stack (`memory-butler up --detach`: embedded PostgreSQL, a dedicated redis-server on a free port, the
front, a worker, beat, Flower) serves every drill: each drill restores what it broke, and anything else that
died is reported by the drill and started again before the next one. Every drill ends with the tool's own
verification: 0 lost, 0 duplicated, 0 out of order, every episode terminal, 0 cross-tenant. The full-size
versions are documented commands (docs/loadtest.md).
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from memory_api.loadtest.burst import BurstConfig, burst
from memory_api.loadtest.localstack import LocalStack

pytestmark = pytest.mark.slow

# Small drills: ~300 episodes at 60/s (a 5 s burst), so the fault lands mid-burst and the writes after it
# must find their way through the restored part.
SMALL: dict[str, Any] = {
    "episodes": 300,
    "clients": 10,
    "tenants": 2,
    "butlers": 2,
    "rate": 60.0,
    "outage_s": 2.0,
    "drain_timeout_s": 150.0,
    "quiet": True,
}


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack() as running:
        yield running


def drill(stack: LocalStack, out: Path, chaos: str | None, **overrides: Any) -> dict[str, Any]:
    revived = stack.revive()
    assert revived == [], f"a previous drill left {revived} dead"
    config = BurstConfig(chaos=chaos, out_dir=out, **{**SMALL, **overrides})
    return asyncio.run(burst(config, stack=stack, console=Console(file=io.StringIO())))


def assert_verified(figures: dict[str, Any]) -> None:
    db = figures["database"]
    assert figures["failures"] == [], "\n".join(figures["failures"])
    assert (db["lost"], db["duplicated"], db["out_of_order"], db["non_terminal"], db["cross_tenant_sql"]) == (0,) * 5
    assert db["stored"] == db["accepted"] == figures["summary"]["planned"]
    assert figures["isolation"]["leaks"] == 0 and all(figures["isolation"]["own_marker_hits"].values())
    assert Path(figures["files"]["json"]).is_file()
    assert Path(figures["files"]["png"]).read_bytes()[:4] == b"\x89PNG"


def test_the_command_bursts_replays_reads_and_verifies(stack: LocalStack, tmp_path: Path):
    # given the command pointed at the stack by URL and database URL, replaying every batch of 4
    cmd = [
        sys.executable,
        "-m",
        "memory_api",
        "loadtest",
        "burst",
        "--url",
        stack.url,
        "--database-url",
        stack.database_url,
        "--episodes",
        "200",
        "--clients",
        "10",
        "--tenants",
        "2",
        "--butlers",
        "2",
        "--batch",
        "4",
        "--replay",
        "--readers",
        "2",
        "--read-rate",
        "10",
        "--read-tool",
        "search",
        "--out",
        str(tmp_path),
        "--quiet",
    ]

    # when it runs
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    # then it passes, prints the summary, and its JSON holds the raw figures and the verification
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASSED" in done.stdout
    (path,) = tmp_path.glob("loadtest-*.json")
    figures = json.loads(path.read_text())
    assert figures["counts"]["replays_ok"] == 200
    assert figures["summary"]["reads"]["count"] > 0 and figures["raw"]["samples"]
    assert (tmp_path / path.name.replace(".json", ".png")).is_file()
    assert figures["database"]["lost"] == figures["database"]["duplicated"] == 0
    # and the machine's speed beside the figures, measured before the burst
    assert re.fullmatch(
        r"reference \(machine speed\): one-thread embedding of a short query p50 \d+\.\d ms( \(.*\))?",
        figures["reference"],
    )
    assert "machine speed" in done.stdout


def test_replay_drill_duplicate_writes_and_wakeups_change_nothing(stack: LocalStack, tmp_path: Path):
    figures = drill(stack, tmp_path, "replay", rate=0.0, readers=2, read_rate=20.0)
    assert_verified(figures)
    assert figures["counts"]["replays_ok"] == 300 and figures["counts"]["duplicate_wakeups"] > 0


def test_kill_worker_drill(stack: LocalStack, tmp_path: Path):
    figures = drill(stack, tmp_path, "kill-worker")
    assert_verified(figures)
    assert [e["event"] for e in figures["events"]][:2] == ["kill-worker_break", "kill-worker_down"]


def test_postgres_restart_drill_accepts_nothing_while_down(stack: LocalStack, tmp_path: Path):
    figures = drill(stack, tmp_path, "postgres", outage_s=3.0)
    assert_verified(figures)
    assert figures["counts"].get("retried_unavailable", 0) > 0
    assert figures["accepted_while_db_down"] == 0


def test_front_restart_drill_clients_reconnect(stack: LocalStack, tmp_path: Path):
    figures = drill(stack, tmp_path, "front", readers=2, read_rate=10.0)
    assert_verified(figures)
    assert figures["counts"].get("transport_errors", 0) > 0
    assert "front_ready" in [e["event"] for e in figures["events"]]


def test_the_lean_client_reconnects_through_a_front_restart_and_loses_nothing(stack: LocalStack, tmp_path: Path):
    # --client http: the same promises as the SDK's client (retries on a new connection, nothing lost or doubled)
    figures = drill(stack, tmp_path, "front", readers=2, read_rate=10.0, client="http")
    assert_verified(figures)
    assert figures["counts"].get("transport_errors", 0) > 0
    assert figures["summary"]["reads"]["count"] > 0


def test_redis_restart_drill(stack: LocalStack, tmp_path: Path):
    # Issue 4's check: Redis stopped in the middle of a burst of >= 1,000 episodes from concurrent clients,
    # restarted; every accepted episode is stored exactly once (and in order, terminal, isolated).
    figures = drill(stack, tmp_path, "redis", episodes=1000, clients=20, rate=200.0, outage_s=3.0)
    assert_verified(figures)
    assert figures["database"]["accepted"] >= 1000
    events = [e["event"] for e in figures["events"]]
    assert "redis_down" in events and "redis_restored" in events
