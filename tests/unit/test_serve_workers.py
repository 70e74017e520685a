"""`serve` picks its number of front processes from the cores it may use (docs/capacity.md)."""

from __future__ import annotations

import argparse
import os

from memory_api.cli import serve


def test_one_front_process_per_two_cores_at_least_one_at_most_eight() -> None:
    assert [serve.front_workers(cores) for cores in (1, 2, 3, 4, 8, 16, 64)] == [1, 1, 1, 2, 4, 8, 8]


def test_available_cores_is_what_this_process_may_run_on() -> None:
    cores = serve.available_cores()
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
