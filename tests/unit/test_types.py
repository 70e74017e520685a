"""The typing the suite enforces ([tool.mypy] in pyproject.toml): mypy over the files it lists, shared strictly.
The run starts mypy early, beside the other tests (tests/typecheck.py)."""

from __future__ import annotations

import importlib.util

from tests.typecheck import MYPY, start_mypy


def test_mypy_finds_nothing_in_the_tree(request):
    assert importlib.util.find_spec("mypy") is not None, "mypy is not installed (pip install -e '.[test]')"
    mypy = request.config.stash.get(MYPY, None) or start_mypy()
    output, _ = mypy.communicate(timeout=600)
    assert mypy.returncode == 0, output
