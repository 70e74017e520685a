"""Micro-batched query embeddings: the reads of one process share one embedding thread and one model call per batch.

Concurrent reads submit their query texts; the thread takes the first, waits at most ``max_wait_s`` for more
(blocking on the queue, never spinning), embeds the distinct texts of the batch in one call and resolves every
read's future. While a batch runs the next one gathers by itself, so under load batches fill without waiting.
Identical texts share one embedding: within a batch, and across batches through a small LRU keyed by text and
model version whose entries live ``cache_ttl_s`` (a fleet's butlers start sessions with the same prompts).
Each row is cached as ``encode`` makes it (the front: the pgvector text its reads bind), so a read of a cached text
does no work on it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

EmbedMany = Callable[[Sequence[str]], np.ndarray]
_STOP = object()


def _row(vector: np.ndarray) -> np.ndarray:
    return vector


class QueryBatcher:
    """One embedding thread for a process's query texts; ``submit`` returns a Future of the L2-normalised row, as
    ``encode`` makes it (default: the row itself, read-only: every read of the text shares it)."""

    def __init__(
        self,
        embed_many: EmbedMany,
        *,
        version: str,
        max_wait_s: float = 0.001,
        max_batch: int = 32,
        cache_size: int = 1024,
        cache_ttl_s: float = 60.0,
        encode: Callable[[np.ndarray], Any] = _row,
    ) -> None:
        self._embed, self._encode = embed_many, encode
        self._version = version
        self.max_wait_s, self.max_batch = max_wait_s, max_batch
        self._cache_size, self._cache_ttl_s = cache_size, cache_ttl_s
        self._cache: OrderedDict[tuple[str, str], tuple[float, Any]] = OrderedDict()
        self._lock = threading.Lock()  # guards the cache and the pending texts
        self._pending: dict[str, Future[Any]] = {}  # texts queued or being embedded → their shared future
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.batches = 0  # model calls made (for tests and the benchmark)
        self.embedded = 0  # texts embedded by them
        self._thread = threading.Thread(target=self._loop, name="query-embedding", daemon=True)
        self._thread.start()

    def submit(self, text: str) -> Future[Any]:
        """The text's embedding, later: from the LRU at once, shared with an identical pending text, or queued."""
        key = (self._version, text)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > time.monotonic():
                self._cache.move_to_end(key)
                done: Future[Any] = Future()
                done.set_result(cached[1])
                return done
            future = self._pending.get(text)
            if future is not None:
                return future
            if not self._thread.is_alive():
                raise RuntimeError("the query embedding thread is stopped")
            future = self._pending[text] = Future()
        self._queue.put(text)
        return future

    def embed_one(self, text: str) -> Any:
        """Blocking form of :meth:`submit`."""
        return self.submit(text).result()

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the thread after the texts already queued; later submits raise."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)

    def _gather(self, first: str) -> tuple[list[str], bool]:
        """The first text plus what arrives within max_wait_s (up to max_batch); True if a stop was seen."""
        batch = [first]
        deadline = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self._queue.get(timeout=remaining)  # a blocking wait, not a spin
                except queue.Empty:
                    break
            if item is _STOP:
                return batch, True
            batch.append(item)  # type: ignore[arg-type]
        return batch, False

    def _loop(self) -> None:
        stop = False
        while not stop:
            first = self._queue.get()
            if first is _STOP:
                break
            texts, stop = self._gather(first)  # type: ignore[arg-type]
            self._run(texts)

    def _run(self, texts: list[str]) -> None:
        """One model call for the batch's texts; its failure is every waiting read's failure."""
        try:
            vectors = np.asarray(self._embed(texts))
            vectors.setflags(write=False)  # rows are shared by every read of the same text
            rows = [self._encode(vector) for vector in vectors]
        except BaseException as exc:  # noqa: BLE001 - handed to the readers, who classify it
            with self._lock:
                futures = [self._pending.pop(t) for t in texts]
            for future in futures:
                future.set_exception(exc)
            return
        expires = time.monotonic() + self._cache_ttl_s
        with self._lock:
            self.batches, self.embedded = self.batches + 1, self.embedded + len(texts)
            futures = [self._pending.pop(t) for t in texts]
            for text, row in zip(texts, rows):
                self._cache[(self._version, text)] = (expires, row)
                self._cache.move_to_end((self._version, text))
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        for future, row in zip(futures, rows):
            future.set_result(row)
