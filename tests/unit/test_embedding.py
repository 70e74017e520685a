"""The embedding engine on a machine that has never exported the model: the ONNX file is made and used.

A fresh cache directory is what a new install, CI and every new host have; an export that fails there makes the
engine fall back to torch (about twice the CPU per query) with only a warning in the log."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shared.config import EmbeddingSettings
from shared.embedding import Embedder, onnx_model_path


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
