"""Two real `celery beat` processes and one real worker: every maintenance tick runs exactly once.

The interval tasks run every second here (MEMORY_BUTLER_SCHEDULE__*_SECONDS=1). Two redbeat beats share
a Redis lock, so one sends and the other stands by; a beat that ignores the lock (the default scheduler,
as a misconfigured second deploy would run) sends every tick again, and the (task, tick) claim in
maintenance_runs turns those duplicates into skips.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis as redis_lib
from sqlalchemy import text

from memory_workers.schedule import BACKLOG_TRIGGER, REDELIVERY_SWEEP

ROOT = Path(__file__).resolve().parents[2]
INTERVAL_TASKS = (BACKLOG_TRIGGER, REDELIVERY_SWEEP)

pytestmark = pytest.mark.slow


def _poll(condition: Callable[[], bool], *, deadline_s: float, what: str) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


class Procs:
    """Subprocesses of one test, stopped (TERM, then KILL) at teardown, by their own pids."""

    def __init__(self, tmp: Path, env: dict[str, str]) -> None:
        self.tmp, self.env, self.running = tmp, env, []

    def start(self, name: str, *args: str) -> Path:
        log = self.tmp / f"{name}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "memory_workers.app", *args],
            cwd=self.tmp,
            env=self.env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.running.append(proc)
        return log

    def stop(self) -> None:
        for proc in self.running:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.running:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture()
def procs(tmp_path: Path, database_url: str, redis_url: str) -> Iterator[Procs]:
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "PYTHONPATH": str(ROOT),
        "MEMORY_BUTLER_SCHEDULE__REDELIVERY_SWEEP_SECONDS": "1",
        "MEMORY_BUTLER_SCHEDULE__BACKLOG_TRIGGER_SECONDS": "1",
    }
    env.pop("MEMORY_BUTLER_CONFIG", None)
    redis_lib.Redis.from_url(redis_url).flushdb()
    p = Procs(tmp_path, env)
    try:
        yield p
    finally:
        p.stop()


def _runs(engine, since: float) -> list[tuple[str, str, bool]]:
    with engine.connect() as c:
        return [
            (r.task, r.tick, r.finished_at is not None)
            for r in c.execute(
                text(
                    "SELECT task, tick, finished_at FROM maintenance_runs WHERE task = ANY(:tasks) "
                    "AND started_at >= to_timestamp(:since) ORDER BY id"
                ),
                {"tasks": list(INTERVAL_TASKS), "since": since},
            )
        ]


def _skips(log: Path) -> int:
    count = 0
    for line in log.read_text(errors="replace").splitlines():
        try:
            count += json.loads(line).get("msg") == "maintenance tick already claimed"
        except (ValueError, AttributeError):
            continue
    return count


def _assert_one_run_per_tick(runs: list[tuple[str, str, bool]], *, at_least: int) -> None:
    for task in INTERVAL_TASKS:
        ticks = [tick for t, tick, _ in runs if t == task]
        assert len(ticks) >= at_least, (task, ticks)
        assert len(ticks) == len(set(ticks)), f"duplicate runs of {task}: {ticks}"
        assert all(tick.endswith("x1s") for tick in ticks)


def _run_beats(procs: Procs, engine, *beats: tuple[str, ...], ticks: int = 6) -> tuple[list, Path]:
    since = time.time()
    worker = procs.start(
        "worker",
        "worker",
        "-Q",
        "maintenance",
        "--pool",
        "solo",
        "-l",
        "INFO",
        "-n",
        "maint@%h",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    )
    for i, args in enumerate(beats):
        procs.start(f"beat{i}", "beat", "-l", "INFO", *args)
    # then, within the deadline, each interval task has run for `ticks` distinct ticks
    _poll(
        lambda: all(
            sum(1 for t, _, done in _runs(engine, since) if t == task and done) >= ticks for task in INTERVAL_TASKS
        ),
        deadline_s=45,
        what=f"{ticks} finished ticks per task",
    )
    return _runs(engine, since), worker


def test_two_redbeat_beats_send_each_tick_once(procs, engine, redis_url, tmp_path):
    # given two beats with the redbeat scheduler (the production setting) and one worker
    runs, _ = _run_beats(procs, engine, ("--pidfile=",), ("--pidfile=",))
    # then every tick ran once, and only one beat holds the lock
    _assert_one_run_per_tick(runs, at_least=6)
    assert redis_lib.Redis.from_url(redis_url).exists("memory-butler:redbeat::lock")
    acquired = [p.name for p in tmp_path.glob("beat*.log") if "Acquired lock" in p.read_text(errors="replace")]
    assert len(acquired) == 1, acquired


def test_a_beat_ignoring_the_lock_only_causes_skips(procs, engine, tmp_path):
    # given a redbeat beat and a second beat with the default scheduler, which ignores redbeat's lock
    runs, worker_log = _run_beats(
        procs,
        engine,
        ("--pidfile=",),
        ("--pidfile=", "-S", "celery.beat:PersistentScheduler", "--schedule", str(tmp_path / "beat-schedule")),
    )
    # then both sent ticks, yet each tick ran once: the duplicates were skipped by the tick claim (the two beats'
    # phases decide which sends land in the same one-second tick, so wait for the first duplicate)
    _assert_one_run_per_tick(runs, at_least=6)
    _poll(lambda: _skips(worker_log) >= 1, deadline_s=30, what="a duplicate tick skipped")
