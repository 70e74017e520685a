"""The lint and formatting the suite enforces ([tool.ruff] in pyproject.toml): ruff over the whole tree."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TREE = ["shared", "memory_api", "memory_workers", "migrations", "tests"]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff is not None, "ruff is not installed (pip install -e '.[test]')"
    return subprocess.run(
        [ruff, *args, "--no-cache", *TREE], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_ruff_finds_nothing_in_the_tree():
    done = _ruff("check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_tree_is_formatted_as_ruff_format_writes_it():
    done = _ruff("format", "--check")
    assert done.returncode == 0, "run `ruff format .`:\n" + done.stdout + done.stderr
