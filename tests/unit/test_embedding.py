"""The embedding engine on a machine that has never exported the model: the ONNX file is made and used.

A fresh cache directory is what a new install, CI and every new host have; an export that fails there makes the
engine fall back to torch (about twice the CPU per query) with only a warning in the log."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from shared.config import EmbeddingSettings
from shared.embedding import Embedder, get_embedder, get_query_embedder, onnx_model_path, reference_line


def test_a_fresh_cache_exports_the_model_and_embeds_with_onnx(tmp_path: Path) -> None:
    cfg = EmbeddingSettings(backend="onnx", cache_dir=tmp_path)
    # long=(2 threads, 8 word pieces): one long text runs on the second, two-thread session.
    onnx = Embedder(cfg, threads=1, long=(2, 8))
    assert onnx.backend == "onnx"
    assert onnx_model_path(tmp_path).is_file()
    torch = Embedder(EmbeddingSettings(backend="torch"), threads=1)
    texts = ["KX-4411", "The user is lactose intolerant and prefers oat milk in coffee, every single morning."]
    together = onnx.embed(texts)
    alone = np.stack([onnx.embed_one(t) for t in texts])  # the second alone takes the long session
    reference = torch.embed(texts)
    assert (together * reference).sum(axis=1).min() > 0.9999
    assert (alone * reference).sum(axis=1).min() > 0.9999
    # many texts of mixed lengths go in several model calls of similar lengths; each row is still its own text's
    many = [f"note {n}: " + "word " * (n * 7) for n in range(9)]
    assert (onnx.embed(many) * np.stack([onnx.embed_one(t) for t in many])).sum(axis=1).min() > 0.9999


def test_the_int8_query_model_is_quantised_and_stays_near_the_float_one(tmp_path: Path) -> None:
    cfg = EmbeddingSettings(backend="onnx", cache_dir=tmp_path)
    int8 = Embedder(cfg, threads=1, int8=True)
    assert int8.backend == "onnx"
    float_file, int8_file = onnx_model_path(tmp_path), onnx_model_path(tmp_path, int8=True)
    # 8-bit weights: a quarter of the float file (a quantiser that found nothing to quantise leaves it whole).
    assert int8_file.stat().st_size < float_file.stat().st_size / 3
    texts = [
        "User: I'm thinking about booking the ryokan near Kyoto station for our trip next spring.",
        "Assistant: Great choice! Kyoto station is convenient; the mountain ryokan is quieter but farther out.",
        "User: Yes, twice last month!",
    ]
    float_model = Embedder(cfg, threads=1)
    reference = float_model.embed(texts)
    cosine = (int8.embed(texts) * reference).sum(axis=1)
    # it runs each text alone, so the front's query batcher does not wait to gather a batch for it
    assert float_model.batches and not int8.batches
    assert cosine.min() > 0.98
    assert cosine.max() < 0.99999  # really another model, not the float one under another name


def test_the_process_has_one_embedder_of_each_kind_and_a_reference_line() -> None:
    # made once per process: every task and read shares the loaded model
    assert get_embedder() is get_embedder()
    assert get_query_embedder() is get_query_embedder()
    # the machine-speed line the benchmarks and the load test print
    assert re.fullmatch(
        r"reference \(machine speed\): one-thread embedding of a short query p50 \d+\.\d ms( \(.*\d+ cores.*\))?",
        reference_line(runs=3),
    )
