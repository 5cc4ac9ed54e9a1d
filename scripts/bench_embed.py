"""Side figures behind the embedding choices in docs/benchmarks.md: import cost of the libraries a
fresh `kb` process may load, and embedding throughput on real code chunks.

    python scripts/bench_embed.py SOURCE_DIR [--chunks 300]
    python scripts/bench_embed.py SOURCE_DIR --chunks 1024 --batch-sizes 64,16,8,4

SOURCE_DIR is any C++ tree (e.g. a triton-ascend checkout); its first .cpp files under lib/ are
chunked as the indexer chunks them. --batch-sizes measures only ONNX Runtime's throughput per
batch size (each size twice, interleaved, so a neighbour's load hits all sizes alike) and checks
that the vectors do not depend on it.
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
    parser.add_argument("--batch-sizes", default="", help="comma-separated: only time ONNX Runtime at these")
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')} {platform.node()} {os.cpu_count()} cpu, python {platform.python_version()}")
    if args.batch_sizes:
        batch_sizes(_chunk_texts(args.source, args.chunks), [int(b) for b in args.batch_sizes.split(",")])
        return
    for module in ("sentence_transformers", "torch", "llama_index.core", "chromadb", "onnxruntime"):
        print(f"import {module}: {import_seconds(module):.2f} s (fresh process)")

    import numpy as np

    from kb.embed import OfflineEmbedding, _sentence_transformer

    texts = _chunk_texts(args.source, args.chunks)
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


def _chunk_texts(source: Path, count: int) -> list[str]:
    from indexer.code import parse_code

    texts: list[str] = []
    for path in sorted(source.glob("lib/**/*.cpp")):
        texts += [u.text for u in parse_code(path.read_bytes(), "cpp").units]
        if len(texts) >= count:
            break
    return texts[:count]


def batch_sizes(texts: list[str], sizes: list[int]) -> None:
    import numpy as np

    from kb.embed import OfflineEmbedding

    encoder = OfflineEmbedding()._encoder()  # the machine's model cache (exported on first use)
    reference = encoder.encode(texts[:64], batch_size=64)
    rates: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(2):
        for size in sizes:
            start = time.perf_counter()
            encoder.encode(texts, batch_size=size)
            rates[size].append(len(texts) / (time.perf_counter() - start))
            same = np.abs(encoder.encode(texts[:64], batch_size=size) - reference).max()
            assert same < 1e-5, f"batch size {size} changes the vectors ({same:.1e})"
    for size, measured in rates.items():
        print(f"ONNX Runtime, batch {size}: {' / '.join(f'{r:.1f}' for r in measured)} texts/s over {len(texts)} chunks")


if __name__ == "__main__":
    main()
