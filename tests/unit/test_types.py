"""The typing the suite enforces ([tool.mypy] in pyproject.toml): mypy over the files it lists, shared strictly."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_finds_nothing_in_the_tree():
    assert importlib.util.find_spec("mypy") is not None, "mypy is not installed (pip install -e '.[test]')"
    # The cache (.mypy_cache, ignored by git) makes a re-run take seconds; a first run takes about 30 s of CPU.
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".mypy_cache")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
