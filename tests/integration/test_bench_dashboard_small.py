"""A small run of the dashboard benchmark (the full one is tests/bench/bench_dashboard.py, see BENCHMARKS.md): it
loads a corpus, serves it through the real front and prints a p50/p95 per screen."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT
from tests.integration.test_benchmarks_small import SMALL_BENCH_REDIS_URL

SCREENS = (
    "facts list, first page",
    "facts, butler panel",
    "facts, by subject",
    "facts, words (q)",
    "facts, page at 10k",
    "health (stats+charts)",
    "fleet page (4 calls)",
)


def test_dashboard_benchmark_runs_small(empty_database_url: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "tests/bench/bench_dashboard.py",
            "--facts",
            "1500",
            "--rules",
            "100",
            "--requests",
            "5",
            "--database-url",
            empty_database_url,
            "--redis-url",
            SMALL_BENCH_REDIS_URL,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for screen in SCREENS:
        line = next(line for line in proc.stdout.splitlines() if line.startswith(screen))
        p50, p95 = (float(x) for x in re.findall(r"\d+\.\d+", line[len(screen) :]))
        assert 0 < p50 <= p95, line
