"""The optional second stage of memory_search: a cross-encoder reads (query, memory) pairs and reorders the top N.

None by default: no PyPI package ships cross-encoder weights, so a deployment that wants one points
``retrieval.reranker_path`` at a local directory holding a sentence-transformers CrossEncoder (or a Hugging Face
sequence-classification model with one label) and sets ``retrieval.reranker = "cross-encoder"``. Loaded once per
process, offline (``local_files_only``). Its cost per read: ``tests/bench/bench_reranker.py``.

The ordering contract: the first ``top_n`` hits are put in the reranker's order (higher first; ties keep their
order); the rest follow unchanged; every hit's scores are left as the first stage gave them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Protocol, TypeVar

T = TypeVar("T")


class Reranker(Protocol):
    def scores(self, query: str, texts: Sequence[str]) -> list[float]: ...


class CrossEncoderReranker:
    """A sentence-transformers CrossEncoder from a local directory, on the CPU."""

    def __init__(self, path: Path, *, max_length: int = 256) -> None:
        from sentence_transformers import CrossEncoder

        self._model = CrossEncoder(str(path), device="cpu", local_files_only=True, max_length=max_length)

    def scores(self, query: str, texts: Sequence[str]) -> list[float]:
        if not texts:
            return []
        return [float(s) for s in self._model.predict([(query, t) for t in texts], show_progress_bar=False)]


def rerank(query: str, items: Sequence[T], *, text: Callable[[T], str], reranker: Reranker, top_n: int) -> list[T]:
    """``items`` with the first ``top_n`` in the reranker's order (stable for ties), the rest after, unchanged."""
    head, tail = list(items[:top_n]), list(items[top_n:])
    scores = reranker.scores(query, [text(item) for item in head])
    order = sorted(range(len(head)), key=lambda i: -scores[i])
    return [head[i] for i in order] + tail


@lru_cache(maxsize=4)
def get_reranker(kind: str, path: str) -> Reranker | None:
    """The process's reranker for the settings (None for "none"); made once."""
    return CrossEncoderReranker(Path(path)) if kind == "cross-encoder" else None
