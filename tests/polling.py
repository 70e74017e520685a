"""Tests never sleep to wait: they poll a condition with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest


def poll(condition: Callable[[], Any], *, deadline_s: float, what: str, every_s: float = 0.1) -> Any:
    """Return condition()'s first truthy value, or fail the test after ``deadline_s`` seconds."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    pytest.fail(f"timed out after {deadline_s}s waiting for {what}")
