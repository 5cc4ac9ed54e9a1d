"""BM25 over code with code-aware tokens.

English stemming and stop-word lists mangle identifiers, so tokens are produced here: every
identifier is kept whole (`getMaskAlignment`, `tt.load`, `BLOCK_SIZE_M`) and also split into its
parts (`get`, `mask`, `alignment`; `tt`, `load`; `block`, `size`, `m`), all lower-cased. Parts
also contribute their English stem (`lowering` -> `lower`, `loops` -> `loop`), so a question's
words meet the identifiers that spell them. Stop words are dropped from queries only: in code
`is` and `for` are part of names.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

# bm25s runs a jax op at import when jax is installed, and jax then takes 75% of the GPU's memory for
# its own pool: on the H200 a bench job's KB lookup held 105 GiB and the judge's workers ran out of
# memory (docs/benchmarks.md, 2026-12-02). The KB never needs a device: jax, if bm25s brings it in,
# stays on the CPU and allocates as it goes. setdefault: a user's own jax settings win.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import bm25s  # noqa: E402 - after the jax settings above
import numpy as np  # noqa: E402
import Stemmer  # noqa: E402

__all__ = ["IDENT", "NAME_WORD", "LexicalIndex", "code_lead", "code_tokens", "name_words", "query_tokens"]

# identifiers with dots/colons inside (tt.load, mlir::triton, ttg.convert_layout), plus numbers
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:(?:\.|::)[A-Za-z_][A-Za-z0-9_]*)*|\d+")
# The words of a name: `InferHIVMMemScope` -> Infer, HIVM, Mem, Scope; `getMaskAlignment` -> get, Mask, Alignment
NAME_WORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_STEMMER = Stemmer.Stemmer("english")


def name_words(name: str) -> str:
    """`lib/Dialect/HIVM/Transforms/InferHIVMMemScope.cpp` -> `lib dialect hivm transforms infer hivm mem
    scope cpp`: the sentence model reads words, and code names are where a chunk says what it does."""
    return " ".join(w.lower() for w in NAME_WORD.findall(name))


def code_lead(file: str, scope: str, symbol: str) -> str:
    """The line leading the embedded text of a code chunk that defines `symbol`: its path and names as
    words. The indexer writes it (`indexer.compiler`) and embedder tuning rebuilds it from a chunk's
    metadata (`kb.tune`), so the two must stay one."""
    return f"{name_words(file)}: {name_words(scope)} {name_words(symbol)}"
_QUESTION_WORDS = {"where", "what", "which", "how", "why", "when", "who", "does", "do", "did", "the", "this", "that",
                   "there", "their", "its", "was", "were", "has", "have", "can", "could", "would", "should", "from",
                   "with", "about", "i", "my", "me", "we", "our", "you", "your", "get", "gets"}
_QUERY_STOPWORDS = set(bm25s.stopwords.STOPWORDS_EN) | _QUESTION_WORDS


def code_tokens(text: str) -> list[str]:
    tokens: list[str] = []
    for ident in IDENT.findall(text):
        tokens.extend(_ident_tokens(ident))
    return tokens


@functools.lru_cache(maxsize=1 << 18)
def _ident_tokens(ident: str) -> tuple[str, ...]:
    """Tokens of one identifier (cached: source code repeats its names constantly)."""
    low = ident.lower()
    tokens = [low]
    parts = re.split(r"\.|::|_", ident)
    words: list[str] = []
    if len(parts) > 1 or NAME_WORD.findall(ident) != [ident]:
        for part in parts:
            sub = NAME_WORD.findall(part)
            words.extend(s.lower() for s in sub if s)
            if len(sub) > 1 and part != ident:
                tokens.append(part.lower())
    else:
        words = [low]
    tokens.extend(w for w in words if w != low)
    tokens.extend(stem for w in words if len(w) > 3 and (stem := _STEMMER.stemWord(w)) != w)
    return tuple(t for t in tokens if len(t) > 1 or t.isdigit())


def query_tokens(text: str) -> list[str]:
    """Tokens of a search query: code tokens without English stop words and question words."""
    words = [w for w in IDENT.findall(text) if w.lower() not in _QUERY_STOPWORDS]
    return code_tokens(" ".join(words))


class LexicalIndex:
    """A persisted BM25 index over chunk ids (texts and metadata live in the vector store)."""

    def __init__(self, retriever: bm25s.BM25, ids: list[str]) -> None:
        self._bm25 = retriever
        self.ids = ids

    @classmethod
    def build(cls, ids: list[str], texts: list[str]) -> LexicalIndex:
        retriever = bm25s.BM25()
        retriever.index([code_tokens(t) or ["<empty>"] for t in texts], show_progress=False)
        return cls(retriever, ids)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._bm25.save(str(directory), show_progress=False)
        (directory / "ids.json").write_text(json.dumps(self.ids))

    @classmethod
    def load(cls, directory: Path) -> LexicalIndex:
        retriever = bm25s.BM25.load(str(directory), mmap=False)
        ids = json.loads((directory / "ids.json").read_text())
        return cls(retriever, ids)

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        tokens = [t for t in query_tokens(query) if t in self._bm25.vocab_dict]
        if not tokens or not self.ids:
            return []
        k = min(k, len(self.ids))
        docs, scores = self._bm25.retrieve([tokens], k=k, show_progress=False, backend_selection="numpy")
        return [(self.ids[int(d)], float(s)) for d, s in zip(np.ravel(docs), np.ravel(scores)) if s > 0]
