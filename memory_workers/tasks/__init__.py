"""The worker's tasks and the resources they share for the life of a process (engine, embedder, extractor)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from sqlalchemy import Engine

from shared.config import ConfigError, Settings
from shared.embedding import ModelVersion
from shared.extraction import Extractor


class Embedder(Protocol):
    """What the tasks need of the embedding engine: one batch call and the model's version."""

    version: ModelVersion

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


@dataclass(frozen=True)
class Runtime:
    """Everything a task needs that is made once per process (HOUSE_RULES rule 8)."""

    settings: Settings
    engine: Engine
    embedder: Embedder
    extractor: Extractor


_runtime: Runtime | None = None
_lock = threading.Lock()


def build_runtime(settings: Settings) -> Runtime:
    """Connect the engine, load the embedding model (~5 s) and build the configured extractor."""
    from memory_workers.extractors import build_extractor
    from shared.db import engine_for
    from shared.embedding import get_embedder

    if not settings.database_url:
        raise ConfigError("database_url: DATABASE_URL is not set; a worker needs the database")
    engine = engine_for(settings.database_url, dead_client_timeout_s=settings.dead_client_timeout_seconds)
    return Runtime(settings, engine, get_embedder(), build_extractor(settings.consolidation))


def install_runtime(runtime_: Runtime | None) -> None:
    """Use ``runtime_`` for every task of this process (``None`` forgets it: the next task builds one)."""
    global _runtime
    with _lock:
        _runtime = runtime_


def runtime() -> Runtime:
    """This process's runtime; built on first use where no worker_process_init ran (solo/threads pools)."""
    global _runtime
    with _lock:
        if _runtime is None:
            from memory_workers.app import current_settings

            _runtime = build_runtime(current_settings())
        return _runtime


def worker_name(hostname: str | None) -> str:
    """The actor name a task writes in memory_events: ``worker:<celery hostname>``."""
    return f"worker:{hostname or socket.gethostname()}"


@dataclass
class KeyRunSummary:
    """What one run of a per-key task did; ``busy``: another worker held the key; ``more``: work remains."""

    counts: Counter[str] = field(default_factory=Counter)
    batches: int = 0
    busy: bool = False
    more: bool = False
    retry_in: float | None = None  # seconds until the key's first intent (waiting out a backoff) is due

    def as_dict(self) -> dict[str, Any]:
        counts = {k: v for k, v in self.counts.items() if isinstance(v, int)}
        return {**counts, "batches": self.batches, "busy": self.busy, "more": self.more, "retry_in": self.retry_in}
