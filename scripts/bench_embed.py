"""Side figures behind the embedding choices in docs/benchmarks.md: import cost of the libraries a
fresh `kb` process may load, and embedding throughput on real code chunks.

    python scripts/bench_embed.py SOURCE_DIR [--chunks 300]

SOURCE_DIR is any C++ tree (e.g. a triton-ascend checkout); its first .cpp files under lib/ are
chunked as the indexer chunks them.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def import_seconds(module: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("--chunks", type=int, default=300)
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')} {platform.node()} {os.cpu_count()} cpu, python {platform.python_version()}")
    for module in ("sentence_transformers", "torch", "llama_index.core", "chromadb", "onnxruntime"):
        print(f"import {module}: {import_seconds(module):.2f} s (fresh process)")

    import numpy as np

    from indexer.code import parse_code
    from kb.embed import OfflineEmbedding, _sentence_transformer

    texts: list[str] = []
    for path in sorted(args.source.glob("lib/**/*.cpp")):
        texts += [u.text for u in parse_code(path.read_bytes(), "cpp").units]
        if len(texts) >= args.chunks:
            break
    texts = texts[: args.chunks]
    model = _sentence_transformer()
    for length in (256, 128):
        model.max_seq_length = length
        start = time.perf_counter()
        reference = model.encode(texts, batch_size=64, normalize_embeddings=True)
        print(f"sentence-transformers, {length} word pieces: {len(texts) / (time.perf_counter() - start):.1f} chunks/s")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["KB_MODEL_CACHE"] = tmp
        embedder = OfflineEmbedding()
        embedder._encoder()  # export outside the timing
        start = time.perf_counter()
        ours = np.array(embedder.embed_many(texts))
        print(f"ONNX Runtime, 128 word pieces: {len(texts) / (time.perf_counter() - start):.1f} chunks/s, "
              f"max |difference| to sentence-transformers {np.abs(ours - reference).max():.1e}")


if __name__ == "__main__":
    main()
