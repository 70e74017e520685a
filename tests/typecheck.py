"""The suite's type check (tests/unit/test_types.py), started early: mypy takes about a minute of one core on a slow
machine, and the suite leaves about one of two cores idle. A run that holds the test starts mypy as soon as it
has collected (tests/conftest.py), at the lowest CPU priority; the test only collects its answer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_NAME = "test_mypy_finds_nothing_in_the_tree"
MYPY = pytest.StashKey[subprocess.Popen]()


def start_mypy() -> subprocess.Popen:
    """mypy over the files [tool.mypy] lists, niced so that it runs on the cores the other tests leave idle."""
    # The cache (.mypy_cache, ignored by git) makes a re-run take seconds; a first run takes 30-70 s of CPU.
    return subprocess.Popen(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: os.nice(19),
    )
