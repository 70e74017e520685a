"""A small run of tests/bench/bench_tracing.py (tracing off, then on), as the command users run."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT


def _run(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "tests/bench/bench_tracing.py", "--calls", "5", "--facts", "3", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_the_tracing_benchmark_runs_small_off_and_on(database_url, redis_url):
    for traced in (False, True):
        out = _run("--database-url", database_url, "--redis-url", redis_url, *(["--traced"] if traced else []))
        for tool in ("memory_search", "memory_context"):
            line = next(line for line in out.splitlines() if line.startswith(tool))
            assert f"traced={traced!s}" in line and "n=5" in line
            mean, p50, p95 = (float(x) for x in re.findall(r"=(\d+\.\d+) ms", line))
            assert 0 < p50 <= p95 and mean > 0
        spans = re.search(r"spans per read call: (\d+\.\d+)", out)
        assert (spans is not None) == traced
        if traced:
            assert float(spans.group(1)) >= 2  # at least the MCP client's and server's spans of each call
