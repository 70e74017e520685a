"""`serve` picks its number of front processes, and `up` its worker's pool processes, from the cores they may use
(docs/capacity.md)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from memory_api.cli import serve, stack
from shared.config import load_settings


def test_one_front_process_per_two_cores_at_least_one_at_most_eight() -> None:
    assert [serve.front_workers(cores) for cores in (1, 2, 3, 4, 8, 16, 64)] == [1, 1, 1, 2, 4, 8, 8]


def test_ups_worker_has_one_pool_process_per_two_cores_at_least_one() -> None:
    assert [stack.worker_processes(cores) for cores in (1, 2, 3, 4, 8, 16)] == [1, 1, 1, 2, 4, 8]


def test_ups_worker_is_started_with_the_pool_processes_of_this_boxs_cores(tmp_path: Path) -> None:
    parts = stack.plan_parts(load_settings(data_dir=tmp_path), host="127.0.0.1", port=8150, flower_port=5555)
    cmd = parts["worker"]["cmd"]
    assert cmd[cmd.index("--concurrency") + 1] == str(stack.worker_processes(stack.available_cores()))


def test_available_cores_is_what_this_process_may_run_on() -> None:
    cores = stack.available_cores()
    assert 1 <= cores <= (os.cpu_count() or 1)
    if hasattr(os, "sched_getaffinity"):
        assert cores <= len(os.sched_getaffinity(0))


def test_serve_defaults_to_choosing_the_number_itself() -> None:
    # given the CLI with no --workers
    parser = argparse.ArgumentParser()
    serve.register(parser.add_subparsers())
    # then the default is 0: api.workers, else one per two available cores
    assert parser.parse_args(["serve"]).workers == 0
    assert parser.parse_args(["serve", "--workers", "3"]).workers == 3
