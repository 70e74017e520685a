"""The front's query micro-batcher: one model call per batch, identical texts embedded once, failures handed to
every waiting read, and a thread that blocks (never spins) while it waits."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence

import numpy as np
import psutil
import pytest

from shared.query_batcher import QueryBatcher
from tests.polling import poll


class GatedModel:
    """A stand-in model: records each call's texts; the first call waits for ``release`` so others queue."""

    def __init__(self, *, fail_on: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.release = threading.Event()
        self.fail_on = fail_on

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        if len(self.calls) == 1:
            assert self.release.wait(10), "the test never released the first batch"
        if self.fail_on in texts:
            raise ValueError(f"cannot embed {self.fail_on!r}")
        return np.array([[float(len(t)), float(sum(map(ord, t)))] for t in texts], dtype=np.float32)


def test_queries_arriving_during_a_model_call_share_the_next_call() -> None:
    # given a batcher whose first model call is held
    model = GatedModel()
    batcher = QueryBatcher(model, version="v1", max_wait_s=0.001)
    try:
        first = batcher.submit("first")
        poll(lambda: model.calls, deadline_s=5, what="the first model call")
        # when seven reads submit while it runs
        later = {t: batcher.submit(t) for t in (f"query {i}" for i in range(7))}
        model.release.set()
        # then they are embedded together in one call, each read getting its own row
        assert first.result(5)[0] == len("first")
        for text, future in later.items():
            assert future.result(5).tolist() == [len(text), sum(map(ord, text))]
        assert model.calls == [["first"], [f"query {i}" for i in range(7)]]
        assert (batcher.batches, batcher.embedded) == (2, 8)
    finally:
        model.release.set()
        batcher.close()


def test_identical_texts_are_embedded_once_and_reused_within_the_window() -> None:
    # given a held first call and two reads of the same text queued behind it
    model = GatedModel()
    batcher = QueryBatcher(model, version="v1", cache_ttl_s=60)
    try:
        batcher.submit("warm")
        poll(lambda: model.calls, deadline_s=5, what="the first model call")
        a, b = batcher.submit("same prompt"), batcher.submit("same prompt")
        model.release.set()
        # then both share one embedding, and a later read of the text is answered from the cache without a call
        assert a is b
        row = a.result(5)
        again = batcher.submit("same prompt")
        assert again.done() and np.array_equal(again.result(), row)
        assert model.calls == [["warm"], ["same prompt"]]
        with pytest.raises(ValueError):
            row[0] = 0  # shared by every read of the text: read-only
    finally:
        model.release.set()
        batcher.close()


def test_rows_are_encoded_once_per_embedding_and_cached_encoded() -> None:
    # given a batcher that hands reads the text form of each row (as the front's does: the pgvector text)
    model = GatedModel()
    model.release.set()
    encoded: list[str] = []

    def encode(row: np.ndarray) -> str:
        encoded.append(f"{row[0]:g}")
        return f"[{row[0]:g},{row[1]:g}]"

    batcher = QueryBatcher(model, version="v1", cache_ttl_s=60, encode=encode)
    try:
        # when one text is read twice, the second time from the cache
        first = batcher.submit("tea").result(5)
        again = batcher.submit("tea")
        # then both reads get the encoded row, made once: the cached read does no work on it
        assert first == again.result() == f"[3,{sum(map(ord, 'tea'))}]"
        assert again.done() and encoded == ["3"]
        assert model.calls == [["tea"]]
    finally:
        batcher.close()


def test_the_cache_is_keyed_by_model_version_and_expires() -> None:
    # given a batcher whose cache entries expire at once
    model = GatedModel()
    model.release.set()
    batcher = QueryBatcher(model, version="v1", cache_ttl_s=0)
    try:
        batcher.submit("text").result(5)
        # when the same text comes again, then it is embedded again (the window has passed)
        batcher.submit("text").result(5)
        assert model.calls == [["text"], ["text"]]
    finally:
        batcher.close()
    # and a batcher of another model version never sees v1's rows
    other_model = GatedModel()
    other_model.release.set()
    other = QueryBatcher(other_model, version="v2", cache_ttl_s=60)
    try:
        other.submit("text").result(5)
        assert other_model.calls == [["text"]]
    finally:
        other.close()


def test_a_failed_model_call_fails_every_read_of_its_batch_and_the_next_batch_still_runs() -> None:
    # given a held first call and a batch behind it containing a text the model refuses
    model = GatedModel(fail_on="bad")
    batcher = QueryBatcher(model, version="v1")
    try:
        batcher.submit("warm")
        poll(lambda: model.calls, deadline_s=5, what="the first model call")
        bad, good = batcher.submit("bad"), batcher.submit("good")
        model.release.set()
        # then both reads of that batch see the model's error
        for future in (bad, good):
            with pytest.raises(ValueError, match="cannot embed 'bad'"):
                future.result(5)
        # and nothing of it was cached: the next reads are embedded afresh, in a working batch
        assert batcher.submit("good").result(5).tolist() == [4, sum(map(ord, "good"))]
        assert model.calls[-1] == ["good"]
    finally:
        model.release.set()
        batcher.close()


def _thread_cpu_s(thread: threading.Thread) -> float:
    times = {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
    return times[thread.native_id]


def test_the_thread_blocks_while_it_gathers_and_while_idle() -> None:
    # given a batcher that waits up to 500 ms for a batch to fill
    model = GatedModel()
    model.release.set()
    batcher = QueryBatcher(model, version="v1", max_wait_s=0.5)
    thread = batcher._thread
    try:
        before = _thread_cpu_s(thread)
        # when one read comes alone, it is answered after the gathering window
        batcher.submit("alone").result(5)
        # then the thread spent (almost) no CPU in that window: it waited on the queue, it did not spin (a spinning
        # thread would burn most of the 500 ms even on a busy machine)
        assert _thread_cpu_s(thread) - before < 0.02

        # and idle, it is parked in the queue's blocking get
        def parked() -> bool:
            frame = sys._current_frames()[thread.ident]
            return frame.f_code.co_name == "_loop" and "self._queue.get()" in _source_line(frame)

        poll(parked, deadline_s=5, what="the batcher thread to park on its queue")
    finally:
        batcher.close()
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="stopped"):
        batcher.submit("after close")


def _source_line(frame) -> str:  # noqa: ANN001 - a frame object
    import linecache

    return linecache.getline(frame.f_code.co_filename, frame.f_lineno)


def test_batched_rows_match_single_rows_of_the_real_model() -> None:
    # given the real query embedder behind the batcher
    from shared.embedding import get_query_embedder

    embedder = get_query_embedder()
    texts = [
        "How often do you water the basil?",
        "KX-4411",
        "Which dentist did the user pick in spring?",
        "oat milk",
        "The user is lactose intolerant and prefers oat milk in coffee.",
    ]
    # when the texts are embedded in one batch (padded to the longest) and one by one
    batched = embedder.embed(texts)
    single = np.stack([embedder.embed_one(t) for t in texts])
    # then every row is the same vector (padding is masked out of the pooling)
    assert float((batched * single).sum(axis=1).min()) > 0.99999
