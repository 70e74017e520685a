"""A benchmark stopped by SIGTERM (``timeout``, a supervisor) cleans up as on Ctrl-C (tests.bench.common.run_benchmark):
its finally blocks and atexit handlers run, so the front, workers, throwaway database and embedded server it
started do not outlive it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_benchmark_stopped_by_sigterm_runs_its_finally_blocks_and_atexit_handlers(tmp_path: Path):
    cleaned, stopped = tmp_path / "cleaned", tmp_path / "stopped"
    script = f"""
import atexit, sys, time
sys.path.insert(0, {str(ROOT)!r})
from tests.bench.common import run_benchmark

def main():
    atexit.register(lambda: open({str(stopped)!r}, "w").write("embedded server stopped"))
    try:
        print("ready", flush=True)
        time.sleep(60)
    finally:
        open({str(cleaned)!r}, "w").write("front and workers stopped")
    return 0

run_benchmark(main)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert cleaned.read_text() == "front and workers stopped"
    assert stopped.read_text() == "embedded server stopped"
